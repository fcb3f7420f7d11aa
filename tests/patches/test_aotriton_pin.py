"""Reading the AOTriton pin of a PyTorch source tree (hand-made files in each upstream shape)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.aotriton_pin import AotritonPinError, parse_cmake, read_aotriton_pin

SHA = "8fdb4a4353f95b88c9542f5e5637efc1e1e0e530"

# The shape of pytorch's cmake/External/aotriton.cmake since the env override (0.11b+).
ENV_OVERRIDE_SHAPE = f"""\
if(NOT __AOTRITON_INCLUDED)
  set(__AOTRITON_INCLUDED TRUE)
  # Note packages information may have versions skipped (due to no ABI breaks)
  set(__AOTRITON_VER "0.12.1b")
  set(__AOTRITON_ROCM_LIST
      "rocm6.4"
      "rocm7.0"
      )
  if(DEFINED ENV{{PYTORCH_AOTRITON_COMMIT}})
    set(__AOTRITON_CI_COMMIT "$ENV{{PYTORCH_AOTRITON_COMMIT}}")
  else()
    set(__AOTRITON_CI_COMMIT "{SHA}")
  endif()
  set(__AOTRITON_BASE_URL "https://github.com/ROCm/aotriton/releases/download/")  # @lint-ignore
endif()
"""

# The 0.7b-0.10b shape: the commit is set directly.
DIRECT_SHAPE = """\
  set(__AOTRITON_VER "0.10b")
  set(__AOTRITON_CI_COMMIT "6fca155f4deeb8d9529326f7b69f350aeeb93477")
"""

# ROCm/pytorch branches that name the release page instead.
RELEASE_PAGE_SHAPE = """\
  set(__AOTRITON_RELEASE_PAGE "0.10b")
  set(__AOTRITON_CI_COMMIT "6fca155f4deeb8d9529326f7b69f350aeeb93477")    # source of rocm6.5
"""

# The oldest shape: the cmake file reads .ci/docker/aotriton_version.txt.
VERSION_TXT_CMAKE = """\
    file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/.ci/docker/aotriton_version.txt" __AOTRITON_CI_INFO)
    list(GET __AOTRITON_CI_INFO 0 __AOTRITON_VER)
    list(GET __AOTRITON_CI_INFO 3 __AOTRITON_COMMIT)
"""
VERSION_TXT = """\
0.7b
manylinux_2_17;manylinux_2_17
rocm6.1;rocm6.2
9be04068c3c0857a4cfd17d7e39e71d0423ebac2
006f4d98;3e9e1959
gz
"""


def tree(tmp_path: Path, cmake: str | None, version_txt: str | None = None) -> Path:
    if cmake is not None:
        path = tmp_path / "cmake" / "External" / "aotriton.cmake"
        path.parent.mkdir(parents=True)
        path.write_text(cmake)
    if version_txt is not None:
        path = tmp_path / ".ci" / "docker" / "aotriton_version.txt"
        path.parent.mkdir(parents=True)
        path.write_text(version_txt)
    return tmp_path


@pytest.mark.parametrize(
    ("cmake", "version_txt", "version", "commit", "override"),
    [
        (ENV_OVERRIDE_SHAPE, None, "0.12.1b", SHA, True),
        (DIRECT_SHAPE, None, "0.10b", "6fca155f4deeb8d9529326f7b69f350aeeb93477", False),
        (RELEASE_PAGE_SHAPE, None, "0.10b", "6fca155f4deeb8d9529326f7b69f350aeeb93477", False),
        (VERSION_TXT_CMAKE, VERSION_TXT, "0.7b", "9be04068c3c0857a4cfd17d7e39e71d0423ebac2", False),
    ],
    ids=["env-override", "direct", "release-page", "version-txt"],
)
def test_reads_the_pin_of_each_upstream_shape(
    tmp_path, cmake, version_txt, version, commit, override
):
    pin = read_aotriton_pin(tree(tmp_path, cmake, version_txt))

    assert (pin.version, pin.commit, pin.env_override) == (version, commit, override)
    assert pin.source.is_file()
    assert pin.release_url.endswith(f"/tag/{version}")


@pytest.mark.parametrize(
    ("cmake", "version_txt", "message"),
    [
        (None, None, "cmake/External/aotriton.cmake does not exist"),
        ('set(__AOTRITON_CI_COMMIT "' + SHA + '")\n', None, "no set(__AOTRITON_VER"),
        ('set(__AOTRITON_VER "0.12b")\n', None, "no literal set(__AOTRITON_CI_COMMIT"),
        (
            'set(__AOTRITON_VER "0.12b")\nset(__AOTRITON_CI_COMMIT "$ENV{PYTORCH_AOTRITON_COMMIT}")\n',
            None,
            "no literal set(__AOTRITON_CI_COMMIT",
        ),
        ('set(__AOTRITON_VER "0.12b")\nset(__AOTRITON_CI_COMMIT "main")\n', None, "not a full"),
        (VERSION_TXT_CMAKE, None, "aotriton_version.txt does not exist"),
        (VERSION_TXT_CMAKE, "0.7b\n", "expected at least 4 lines"),
    ],
    ids=["no-file", "no-version", "no-commit", "env-only", "not-a-sha", "no-txt", "short-txt"],
)
def test_missing_file_or_variable_is_a_clear_error(tmp_path, cmake, version_txt, message):
    with pytest.raises(AotritonPinError, match=message.replace("(", r"\(")) as info:
        read_aotriton_pin(tree(tmp_path, cmake, version_txt))

    assert "aotriton" in str(info.value)  # names the file it read


def test_a_commented_out_pin_is_not_read():
    text = f'set(__AOTRITON_VER "0.12b")\n# set(__AOTRITON_CI_COMMIT "{SHA}")\n'

    with pytest.raises(AotritonPinError, match="__AOTRITON_CI_COMMIT"):
        parse_cmake(text)
