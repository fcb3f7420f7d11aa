"""Host facts: arch detection from KFD topology, build parallelism from memory."""

from __future__ import annotations

import pytest

from attnforge.hostinfo import default_jobs, detect_amd_arches, gfx_from_target_version


@pytest.mark.parametrize(
    ("value", "arch"),
    [
        (110501, "gfx1151"),
        (110000, "gfx1100"),
        (90402, "gfx942"),
        (90010, "gfx90a"),
        (120001, "gfx1201"),
        (0, None),
    ],
)
def test_gfx_target_version_decodes_to_the_gfx_name(value, arch):
    assert gfx_from_target_version(value) == arch


def test_detect_reads_gpu_nodes_and_skips_cpu_nodes(tmp_path):
    for node, version in (("0", 0), ("1", 110501), ("2", 110501), ("3", 90402)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(
            f"cpu_cores_count 0\ngfx_target_version {version}\nsimd_count 80\n"
        )
    assert detect_amd_arches(tmp_path) == ["gfx1151", "gfx942"]


def test_no_kfd_means_no_arches(tmp_path):
    assert detect_amd_arches(tmp_path / "absent") == []


@pytest.mark.parametrize(
    ("mem", "cpus", "jobs"),
    [(24, 2, 2), (24, 32, 6), (128, 16, 16), (3, 8, 1), (None, 4, 4)],
)
def test_default_jobs_leaves_four_gib_per_job(mem, cpus, jobs):
    assert default_jobs(mem, cpus) == jobs
