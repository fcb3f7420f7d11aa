"""Every command README.md shows is run, so the README cannot drift from the code.

A command that needs what this machine lacks (an AMD GPU, AMD's package index, a source checkout)
is named in NOT_RUN_HERE with the reason and the test that covers what can be covered; a build
command is at least planned (`--dry-run`), so its arch, stack, layer and `--set` must be valid.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.conftest import REPO, outputs_env, run_invoke

# command (as the README shows it, comment stripped) -> why it is not run as is
NOT_RUN_HERE = {
    "invoke validate --arch gfx1151": "needs an AMD GPU; tests/e2e runs `invoke validate --arch cpu`",
    "invoke validate --arch gfx1151 --local": "needs an AMD GPU (its expectations fail on a CPU)",
    "invoke build --continue": "needs an earlier build; tests/e2e interrupts and continues one",
    "invoke publish --arch gfx1151 --to ghcr.io/you/attnforge": "needs a validated image and a "
    "registry; tests/e2e publishes the cpu stack to a local registry",
    "invoke export --arch cpu": "needs a validated cpu image; tests/e2e/test_export_venv.py "
    "exports the session's validated one",
    "invoke verify-env --python ~/attn-venv/bin/python --against build/export/cpu/cpu": "needs an "
    "export and a venv; tests/e2e/test_export_venv.py installs one and verifies it",
    "invoke verify --image ghcr.io/you/attnforge/default:gfx1151": "needs a published image; "
    "tests/e2e/test_cpu_stack_publish.py publishes the cpu stack to a local registry and verifies it",
    "invoke verify --image ghcr.io/you/attnforge/default:gfx1151 --key cosign.pub": "needs a "
    "signed published image; tests/e2e/test_verify_signature.py signs one on a local registry",
    "invoke pins.check --arch gfx1151": "needs GitHub and AMD's index; tests/unit/test_pins.py "
    "runs pins.check --offline against saved pages and real git repositories",
    "invoke pins.update --channel stable": "needs AMD's index; tests/unit/test_pins_update.py runs "
    "it --offline against saved index pages",
    "invoke mirror --arch gfx1151 --to /srv/attnforge-mirror": "needs AMD's index and GitHub; "
    "tests/e2e/test_rehearsal.py makes a mirror of the same plan with stand-ins (--add, --add-repo)",
    "invoke build --arch gfx1151 --mirror /srv/attnforge-mirror": "needs that mirror; "
    "tests/e2e/test_rehearsal.py builds the default stack from a rehearsal mirror",
    "invoke patches.status --component flash-attention --src ~/src/flash-attention": "needs a "
    "flash-attention checkout; tests/patches run patches.status on real git repositories",
}
# Builds of ROCm stacks need AMD's package index and hours: their plans are made instead.
PLANNED_ONLY = re.compile(r"^invoke build (?!.*--dry-run)(?!--continue)")
# Commands another test runs as the README shows them (it checks their output too), so running
# them here again would only repeat minutes of work: command -> that test's module, which names
# the command in README_COMMAND.
RUN_ELSEWHERE = {"invoke kernels.aot --all": "tests/kernels/test_aot.py"}
# Commands whose non-zero exit is a verdict, not an error: doctor exits 1 where nothing can be
# built (no engine answers, as in `make test-unit` on a machine without Docker).
VERDICT_EXITS = {"invoke doctor": {0, 1}}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command.startswith(("invoke ", "make ")):
                commands.append(command)
    return commands


COMMANDS = readme_commands()


def test_the_readme_shows_the_commands_this_test_knows_about():
    assert "make demo" in COMMANDS and "make test" in COMMANDS
    assert set(NOT_RUN_HERE) <= set(COMMANDS), set(NOT_RUN_HERE) - set(COMMANDS)
    assert set(RUN_ELSEWHERE) <= set(COMMANDS), set(RUN_ELSEWHERE) - set(COMMANDS)
    for command, module in RUN_ELSEWHERE.items():
        assert f'README_COMMAND = "{command}"' in (REPO / module).read_text(), module


@pytest.mark.parametrize(
    "command",
    [
        c
        for c in COMMANDS
        if c.startswith("invoke ") and c not in NOT_RUN_HERE and c not in RUN_ELSEWHERE
    ],
)
def test_a_readme_command_runs_without_error(command, tmp_path):
    args = command.split()[1:]
    if PLANNED_ONLY.match(command):
        args.append("--dry-run")
    if args[0] in ("report", "matrix"):  # a real report (an H200 run's) where they look for it
        where = tmp_path / "reports" / "gfx1151" / "default"
        where.mkdir(parents=True)
        shutil.copy(REPO / "tests/validate/fixtures/h200_report.json", where / "report.json")
        # a path the README gives under reports/ is one under this test's reports folder
        args = [str(tmp_path / a) if a.startswith("reports/") else a for a in args]
    proc = run_invoke(REPO, *args, env=outputs_env(tmp_path), timeout=900)
    allowed = VERDICT_EXITS.get(command, {0})
    assert proc.returncode in allowed, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr
