"""The scheduled pins job (.github/workflows/pins.yml): it asks every release channel
`invoke pins.update` knows, applies the diffs of the channels the recipes pin, and holds write
permissions only in its one job. (`make lint` runs actionlint's checks and zizmor on it.)"""

from __future__ import annotations

import re

import yaml

from attnforge.pins.channels import CHANNELS
from tests.conftest import REPO

WORKFLOW = REPO / ".github/workflows/pins.yml"


def _load():
    data = yaml.safe_load(WORKFLOW.read_text())
    return data, data["jobs"]["update"]


def test_it_runs_on_a_schedule_and_by_hand():
    data, _ = _load()
    on = data[True]  # YAML 1.1 reads the key `on` as a boolean
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on


def test_every_channel_is_updated_and_the_pinned_ones_applied():
    _, job = _load()
    script = "\n".join(s.get("run", "") for s in job["steps"])
    loops = re.findall(r"for channel in ([^;]+);", script)
    assert set(loops[0].split()) == set(CHANNELS)  # pins.update: every channel
    assert set(loops[1].split()) == set(CHANNELS) - {"nightly"}  # the diffs (nightly: --set)
    assert '.venv/bin/invoke pins.check --arch "$ARCH"' in script
    assert 'git apply --verbose "build/pins/$channel.out"' in script


def test_write_permissions_are_the_jobs_alone():
    data, job = _load()
    assert data["permissions"] == {"contents": "read"}
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    checkout = job["steps"][0]
    assert checkout["with"]["persist-credentials"] is False
    assert "${{" not in "\n".join(s.get("run", "") for s in job["steps"])  # values via env only
