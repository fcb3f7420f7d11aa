"""invoke bisect's pure core (the search, skips, selectors, verdicts, evidence, state) and its
candidate lists from real git repositories and a saved index page."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from attnforge import files
from attnforge.bisection import search as bs
from attnforge.bisection.probe import GitHistory, wheel_candidates
from attnforge.errors import UserError
from attnforge.pins.upstream import IndexSource
from tests.conftest import REPO, run_invoke


def pins(n: int) -> list[bs.Candidate]:
    """n candidates p0 (good) .. p{n-1} (bad)."""
    return [bs.Candidate(f"p{i}") for i in range(n)]


def judge_first_bad(first_bad: int, skips=()):
    def judge(pin: str) -> str:
        i = int(pin[1:])
        if i in skips:
            return bs.SKIP
        return bs.BAD if i >= first_bad else bs.GOOD

    return judge


# ---------------------------------------------------------------------------- the search


@pytest.mark.parametrize("n", [2, 3, 5, 9, 16, 17, 100, 257])
def test_every_first_bad_pin_is_found_in_at_most_ceil_log2_probes(n):
    for first_bad in range(1, n):
        outcome, probed = bs.run(pins(n), judge_first_bad(first_bad))
        assert outcome.status == "found"
        assert (outcome.first_bad, outcome.last_good) == (first_bad, first_bad - 1)
        assert len(probed) <= math.ceil(math.log2(n - 1)) if n > 2 else len(probed) == 0
        assert len(probed) <= bs.expected_probes(n)


def test_two_candidates_need_no_probe():
    outcome, probed = bs.run(pins(2), judge_first_bad(1))
    assert outcome.status == "found" and probed == [] and outcome.first_bad == 1


@pytest.mark.parametrize(
    ("n", "first_bad", "skips", "expect_status", "expect_first_bad", "could_be"),
    [
        # a skipped midpoint is gone around, the result is still exact
        (9, 5, {6}, "found", 5, ()),
        (9, 5, {6, 2, 7}, "found", 5, ()),
        (17, 10, {8}, "found", 10, ()),
        # the pin just before the first bad one cannot be judged: either may be the first bad
        (9, 5, {4}, "ambiguous", None, (4, 5)),
        # the first bad pin itself cannot be judged: it and the next judged bad one remain
        (9, 5, {5}, "ambiguous", None, (5, 6)),
        # every pin between the ends is skipped: any of them (or the bad end) may be first
        (6, 3, {1, 2, 3, 4}, "ambiguous", None, (1, 2, 3, 4, 5)),
    ],
)
def test_skips(n, first_bad, skips, expect_status, expect_first_bad, could_be):
    outcome, probed = bs.run(pins(n), judge_first_bad(first_bad, skips))
    assert outcome.status == expect_status
    if expect_status == "found":
        assert outcome.first_bad == expect_first_bad
    assert outcome.could_be == could_be
    assert len(probed) == len(set(probed)), "a pin was probed twice"


def test_the_next_probe_is_the_untested_pin_nearest_the_middle():
    cands = pins(9)
    assert bs.decide(cands, {}).next == 4
    assert bs.decide(cands, {"p4": bs.GOOD}).next == 6
    # the middle was skipped: its nearest neighbour, the older one on a tie
    assert bs.decide(cands, {"p4": bs.GOOD, "p6": bs.SKIP}).next == 5
    assert bs.decide(cands, {"p4": bs.SKIP}).next == 3


def test_verdicts_already_known_are_not_probed_again():
    known = {"p4": bs.GOOD, "p6": bs.BAD}
    outcome, probed = bs.run(pins(9), judge_first_bad(5), known)
    assert outcome.first_bad == 5 and probed == ["p5"]


def test_max_probes_stops_and_the_rest_continues_where_it_stopped():
    cands = pins(33)
    judge = judge_first_bad(20)
    first, probed1 = bs.run(cands, judge, max_probes=2)
    assert first.status == "running" and len(probed1) == 2
    outcome, probed2 = bs.run(cands, judge, {p: judge(p) for p in probed1})
    assert outcome.first_bad == 20
    assert not set(probed1) & set(probed2)
    assert len(probed1) + len(probed2) == len(bs.run(cands, judge)[1])


def test_verify_ends_probes_the_ends_first():
    outcome, probed = bs.run(pins(9), judge_first_bad(5), verify_ends=True)
    assert probed[:2] == ["p0", "p8"] and outcome.first_bad == 5
    assert len(probed) <= bs.expected_probes(9) + 2


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        (judge_first_bad(0), "the good pin p0 fails the check"),
        (judge_first_bad(99), "the bad pin p8 passes the check"),
        (judge_first_bad(5, skips={0}), "the good pin p0 could not be judged"),
    ],
)
def test_verified_ends_that_do_not_hold_stop_the_bisect(judge, message):
    with pytest.raises(bs.BisectError, match=message):
        bs.run(pins(9), judge, verify_ends=True)


def test_contradicting_verdicts_are_named():
    with pytest.raises(bs.BisectError, match="p6 is good but the older p3 is bad"):
        bs.decide(pins(9), {"p3": bs.BAD, "p6": bs.GOOD})


@pytest.mark.parametrize(
    ("candidates", "verdicts", "message"),
    [
        ([bs.Candidate("a")], {}, "a good and a bad pin that differ"),
        (pins(4), {"zz": bs.GOOD}, "names zz, which is not among the candidates"),
        (pins(4), {"p1": "maybe"}, "unknown verdict 'maybe'"),
    ],
)
def test_bad_input_to_the_search(candidates, verdicts, message):
    with pytest.raises(bs.BisectError, match=message):
        bs.decide(candidates, verdicts)


# ---------------------------------------------------------------------------- selectors


SUITE = ["python3", "-m", "validate", "all", "--json", "/out/report.json", "--md", "/out/report.md"]


@pytest.mark.parametrize(
    ("text", "opts", "kind", "argv", "output"),
    [
        ("check:sdpa.case.*", {}, "check", [*SUITE, "--only", "sdpa.case.*"], "report.json"),
        ("check:env,kernels.*", {"quick": True, "timeout": 60}, "check",
         [*SUITE, "--only", "env", "--only", "kernels.*", "--quick", "--timeout", "60"],
         "report.json"),
        ("validate", {}, "validate", [*SUITE, "--expect", "/out/expect.json"], "report.json"),
        ("stress:sd15", {}, "stress",
         ["python3", "-m", "validate", "stress", "--workload", "sd15", "--json",
          "/out/stress-sd15.json", "--iters", bs.STRESS_DEFAULT_ITERS, "--backend", "all"],
         "stress-sd15.json"),
        ("stress:llm,iters=5,backend=sdpa.flash,tiny", {"timeout": 60}, "stress",
         ["python3", "-m", "validate", "stress", "--workload", "llm", "--json",
          "/out/stress-llm.json", "--iters", "5", "--backend", "sdpa.flash", "--tiny",
          "--timeout", "60"], "stress-llm.json"),
        ("cmd:python3 -c 'import torch'", {}, "cmd", ["sh", "-c", "python3 -c 'import torch'"], ""),
        ("cmd:true", {"timeout": 30}, "cmd", ["timeout", "30", "sh", "-c", "true"], ""),
    ],
)  # fmt: skip
def test_selectors_become_commands_in_the_image(text, opts, kind, argv, output):
    spec = bs.parse_check(text, **opts)
    assert (spec.kind, list(spec.argv), spec.output) == (kind, argv, output)


def test_check_globs_decide_alone():
    spec = bs.parse_check("check:env,kernels.*")
    assert spec.globs == ("env", "kernels.*") and "--expect" not in spec.argv


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bench:kernels", "bench: needs a baseline to hold each pin to"),
        ("bench:kernels,mode=sideways", "bench: gate .kernels,mode=sideways.: mode"),
        ("nope:x", "unknown kind 'nope'; valid: check:GLOB"),
        ("check:", "check: needs a check id or glob"),
        ("check", "expected check:GLOB"),
        ("validate:x", "validate takes nothing after it"),
        ("stress:", "stress: needs a workload"),
        ("stress:sd15,speed=3", "stress: has no setting 'speed'"),
        ("stress:sd15,iters", "stress: iters needs a value"),
        ("stress:sd15,tiny=1", "stress: tiny is a flag"),
        ("stress:sd15,iters=$(reboot)", "stress: iters needs a value of letters"),
        ("cmd:", "cmd: needs a shell command"),
    ],
)
def test_bad_selectors_are_one_sentence(text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("$", r"\$")):
        bs.parse_check(text)


def test_every_selector_kind_is_documented():
    text = (REPO / "docs" / "bisect.md").read_text()
    for selector in bs.SELECTORS.values():
        assert f"`{selector.syntax}`" in text, selector.kind


# ---------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("kind", "code", "verdict"),
    [
        ("cmd", 0, bs.GOOD), ("cmd", 1, bs.BAD), ("cmd", 125, bs.SKIP), ("cmd", 124, bs.BAD),
        ("cmd", 139, bs.BAD), ("stress", 0, bs.GOOD), ("stress", 1, bs.BAD),
        ("validate", 1, bs.BAD), ("validate", 137, bs.SKIP),
    ],
)  # fmt: skip
def test_exit_status_verdicts(kind, code, verdict):
    assert bs.verdict_of_exit(kind, code)[0] == verdict


def test_a_crash_in_the_command_says_the_signal():
    assert "signal 11" in bs.verdict_of_exit("cmd", 139)[1]


def _report(**statuses: str) -> dict:
    return {
        "summary": {"status": "fail" if "fail" in statuses.values() else "pass"},
        "checks": [{"id": cid.replace("_", "."), "status": s, "message": f"{cid} said {s}"}
                   for cid, s in statuses.items()],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("statuses", "globs", "verdict", "why"),
    [
        ({"env": "pass", "sdpa_case_1": "pass"}, ("sdpa.case.*",), bs.GOOD, "1 matching"),
        ({"env": "pass", "sdpa_case_1": "skip"}, ("sdpa.case.*",), bs.GOOD, "1 matching"),
        ({"env": "fail", "sdpa_case_1": "pass"}, ("sdpa.case.*",), bs.GOOD, "1 matching"),
        ({"sdpa_case_1": "pass", "sdpa_case_2": "crash"}, ("sdpa.case.*",), bs.BAD,
         "sdpa.case.2 crash: sdpa_case_2 said crash"),
        ({"sdpa_case_1": "timeout", "sdpa_case_2": "fail"}, ("sdpa.case.*",), bs.BAD,
         "(and 1 more)"),
        ({"env": "pass"}, ("sdpa.case.*",), bs.SKIP, "no check matching sdpa.case.* ran"),
    ],
)  # fmt: skip
def test_report_verdicts_count_only_the_chosen_checks(statuses, globs, verdict, why):
    got, reason = bs.verdict_of_report(_report(**statuses), globs)
    assert got == verdict and why in reason


def test_a_real_report_gives_a_verdict():
    report = json.loads((REPO / "tests/validate/fixtures/h200_report.json").read_text())
    ids = [c["id"] for c in report["checks"]]
    verdict, reason = bs.verdict_of_report(report, (ids[0],))
    status = report["checks"][0]["status"]
    assert verdict == (bs.BAD if status in bs.FAILED_STATUSES else bs.GOOD), reason


# ---------------------------------------------------------------------------- evidence


def test_evidence_rows_are_the_checks_whose_status_changed():
    good = _report(env="pass", sdpa_case_1="pass", sdpa_case_2="pass")
    bad = _report(env="pass", sdpa_case_1="pass", sdpa_case_2="fail")
    rows = bs.report_rows(good, bad)
    assert rows[0] == ("summary", "pass", "fail")
    assert rows[1:] == [
        ("sdpa.case.2", "pass: sdpa_case_2 said pass", "fail: sdpa_case_2 said fail")
    ]


def test_evidence_rows_of_stress_documents_are_backends():
    good = {
        "runs": [
            {"backend": "sdpa.flash", "status": "pass", "first_failure": None},
            {"backend": "sdpa.math", "status": "pass", "first_failure": None},
        ]
    }
    bad = {"runs": [{"backend": "sdpa.flash", "status": "fail",
                     "first_failure": {"iteration": 7, "kind": "nan", "message": "NaN"}},
                    {"backend": "sdpa.math", "status": "pass", "first_failure": None}]}  # fmt: skip
    assert bs.report_rows(good, bad) == [("sdpa.flash", "pass", "fail at iteration 7: nan")]


def test_evidence_with_one_side_missing_still_shows_the_other():
    rows = bs.report_rows(None, _report(env="fail"))
    assert rows == [("summary", "-", "fail"), ("env", "(not run)", "fail: env said fail")]


# ---------------------------------------------------------------------------- state


def _state(**kw) -> bs.BisectState:
    return bs.BisectState("cpu", "cpu", "triton", "TRITON_VERSION", "3.5.0", "3.6.0", "cmd:true",
                          pins(5), **kw)  # fmt: skip


def test_the_state_round_trips_through_its_file(tmp_path):
    state = _state(sets=["torch-cpu.TORCH_INDEX_URL="], source="triton on https://pypi.org/simple/")
    state.probes.append(bs.Probe("p2", bs.GOOD, "the command exited 0", "/r/p2", {"base": "cached"}, 3.5, "t"))  # fmt: skip
    state.in_progress = "p3"
    path = bs.state_path(tmp_path / "state", "cpu", "cpu", "triton")
    state.save(path)
    assert path.name == "bisect-cpu-cpu-triton.json"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file left"
    again = bs.BisectState.load(path)
    assert again == state
    assert json.loads(path.read_text())["kind"] == "attnforge.bisect"


def test_an_interrupted_save_leaves_the_last_whole_state(tmp_path, monkeypatch):
    path = tmp_path / "bisect.json"
    state = _state()
    state.save(path)
    before = path.read_text()
    state.probes.append(bs.Probe("p2", bs.BAD, "x"))

    def die(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", die)  # the one write-aside helper (attnforge/files.py)
    with pytest.raises(KeyboardInterrupt):
        state.save(path)
    assert path.read_text() == before and list(tmp_path.iterdir()) == [path]


def test_no_state_is_none_and_a_damaged_one_is_a_sentence(tmp_path):
    assert bs.BisectState.load(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be read") as info:
        bs.BisectState.load(tmp_path / "bad.json")
    assert "--reset" in info.value.hint


def test_a_different_question_is_told_apart_from_the_recorded_one():
    recorded = _state().question()
    assert bs.differences(recorded, _state().question()) == []
    other = _state(sets=["x.Y=1"])
    other.check = "cmd:false"
    diff = bs.differences(recorded, other.question())
    assert diff == ["check cmd:true (recorded) vs cmd:false (now)",
                    "sets [] (recorded) vs [x.Y=1] (now)"]  # fmt: skip


def test_short_pins_are_folder_names():
    assert bs.short_pin("a" * 40) == "a" * 12
    assert bs.short_pin("2.14.0.dev20261101+rocm10.2.0a20261101") == "2.14.0.dev20261101+rocm10.2.0a20261101"  # fmt: skip
    assert bs.short_pin("../x y") == ".._x_y"


# ---------------------------------------------------------------------------- git candidates


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def history(tmp_path) -> tuple[Path, list[str]]:
    """A repository with 9 commits on main (c0..c8) and a branch merged at c6."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(9):
        if i == 6:
            git(repo, "checkout", "-q", "-b", "side", shas[3])
            (repo / "side.txt").write_text("side\n")
            git(repo, "add", "side.txt")
            git(repo, "commit", "-q", "-m", "side work")
            git(repo, "checkout", "-q", "main")
            git(repo, "merge", "-q", "--no-ff", "-m", "c6 merge side", "side")
            shas.append(git(repo, "rev-parse", "HEAD"))
            continue
        (repo / "n.txt").write_text(f"{i}\n")
        git(repo, "add", "n.txt")
        git(repo, "commit", "-q", "-m", f"c{i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "tag", "v0", shas[0])
    return repo, shas


def test_local_history_lists_the_first_parent_line_oldest_first(history, tmp_path):
    repo, shas = history
    found = GitHistory(f"file://{repo}", cache_dir=tmp_path / "cache").between(shas[0], shas[8])
    assert [c.pin for c in found] == shas
    assert found[6].label.endswith("c6 merge side") and found[1].label.endswith("c1")
    assert not (tmp_path / "cache").exists(), "a local repository is read in place"


def test_refs_resolve_in_a_local_repository(history, tmp_path):
    repo, shas = history
    h = GitHistory(str(repo), cache_dir=tmp_path / "cache")
    assert h.resolve("v0", "--good") == shas[0] and h.resolve("main", "--bad") == shas[8]
    with pytest.raises(UserError, match="--good nosuch: no such commit"):
        h.resolve("nosuch", "--good")


def test_a_remote_history_is_fetched_shallow_until_the_good_commit_is_in(history, tmp_path, monkeypatch):  # fmt: skip
    repo, shas = history
    # file:// with a path that is not read in place: the fetch path a remote repository takes
    monkeypatch.setattr("attnforge.bisection.probe.DEEPEN", (2, 4))
    h = GitHistory(f"file://{repo}", cache_dir=tmp_path / "cache")
    h.local = None
    h.repo = tmp_path / "cache" / "src.git"
    assert h.resolve("main", "--bad") == shas[8]
    found = h.between(shas[2], shas[8])
    assert [c.pin for c in found] == shas[2:]
    assert (h.repo / "HEAD").is_file()


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (0, 0, "same commit"),
        (8, 0, "not an ancestor of --bad"),
    ],
)
def test_bad_git_ranges_are_sentences(history, tmp_path, good, bad, message):
    repo, shas = history
    with pytest.raises(UserError, match=message) as info:
        GitHistory(str(repo), cache_dir=tmp_path).between(shas[good], shas[bad])
    if good > bad:
        assert "the bad commit is the older one" in info.value.message
        assert info.value.hint == "swap --good and --bad"


# ---------------------------------------------------------------------------- wheel candidates

INDEX = "https://download.example.org/whl/nightly/"
FILES = [
    "torch-2.14.0.dev20261101+rocm10.2.0a20261101-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261102+rocm10.2.0a20261102-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261103+rocm10.2.0a20261103-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261104+rocm10.2.0a20261104-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261104+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261105+rocm10.2.0a20261105-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.14.0.dev20261106+rocm10.2.0a20261106-cp312-cp312-manylinux_2_28_x86_64.whl",
]


@pytest.fixture
def saved_index(tmp_path) -> IndexSource:
    page = tmp_path / "pages" / "download.example.org" / "whl" / "nightly" / "torch"
    page.mkdir(parents=True)
    links = "".join(f'<a href="{f}">{f}</a>\n' for f in FILES)
    (page / "index.html").write_text(f"<html><body>{links}</body></html>")
    return IndexSource(tmp_path / "pages")


def test_wheel_candidates_are_the_dated_versions_between_for_the_images_python(saved_index):
    good = "2.14.0.dev20261101+rocm10.2.0a20261101"
    bad = "2.14.0.dev20261106+rocm10.2.0a20261106"
    found = wheel_candidates(saved_index, INDEX, "torch", "3.12", good, bad)
    assert [c.pin for c in found] == [
        good,
        "2.14.0.dev20261102+rocm10.2.0a20261102",
        # 1103 has no cp312 wheel, 1104+cpu is another build family
        "2.14.0.dev20261104+rocm10.2.0a20261104",
        "2.14.0.dev20261105+rocm10.2.0a20261105",
        bad,
    ]
    assert found[1].label == "2026-11-02"


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("2.14.0", "2.14.0", "same version"),
        ("2.15.0", "2.14.0", "--bad 2.14.0 is older than --good 2.15.0"),
        ("two", "2.14.0", "--good 'two': not a version"),
        ("2.13.0", "abc", "--bad 'abc': not a version"),
    ],
)
def test_bad_version_ranges_are_sentences(saved_index, good, bad, message):
    with pytest.raises(UserError, match=message):
        wheel_candidates(saved_index, INDEX, "torch", "3.12", good, bad)


def test_an_unreadable_index_is_a_sentence_with_a_hint(tmp_path):
    with pytest.raises(UserError, match="cannot read torch's versions") as info:
        wheel_candidates(IndexSource(tmp_path), INDEX, "torch", "3.12", "2.13.0", "2.14.0")
    assert "--offline" in info.value.hint


# ---------------------------------------------------------------------------- the task


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--check is needed"),
        (["--check", "bench:kernels"], "bench: needs a baseline to hold each pin to"),
        (["--check", "cmd:true"], "--layer is needed"),
        (["--check", "cmd:true", "--layer", "nope"], "unknown layer of stack cpu 'nope'"),
        (["--check", "cmd:true", "--layer", "validate"], "layer validate has no pins to bisect"),
        (["--check", "cmd:true", "--layer", "triton", "--key", "TRITON_INDEX_URL", "--bad", "x"],
         "layer triton has no pin 'TRITON_INDEX_URL'"),
        (["--check", "cmd:true", "--layer", "triton"], "--bad is needed"),
        (["--check", "cmd:true", "--layer", "triton", "--bad", "3.7.0",
          "--set", "triton.TRITON_VERSION=3.5.0"], "is what the bisect varies"),
        (["--check", "cmd:true", "--layer", "triton", "--bad", "3.7.0", "--max-probes", "0"],
         "--max-probes 0: must be at least 1"),
    ],
)  # fmt: skip
def test_task_mistakes_are_sentences(args, message):
    proc = run_invoke(REPO, "bisect", "--arch", "cpu", "--stack", "cpu", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr


def test_a_different_recorded_bisect_is_not_continued_by_mistake(tmp_path, repo_copy):
    from tests.conftest import outputs_env

    env = outputs_env(tmp_path)
    state = bs.BisectState("cpu", "cpu", "triton", "TRITON_VERSION", "3.5.0", "3.7.0",
                           "cmd:true", pins(3))  # fmt: skip
    state.save(bs.state_path(tmp_path / "build" / "state", "cpu", "cpu", "triton"))
    args = ["bisect", "--arch", "cpu", "--stack", "cpu", "--layer", "triton", "--good", "3.5.0",
            "--bad", "3.7.0", "--check", "cmd:false", "--offline", str(tmp_path)]  # fmt: skip
    proc = run_invoke(repo_copy, *args, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert "a different bisect of cpu/cpu/triton is recorded" in text
    assert "check cmd:true (recorded) vs cmd:false (now)" in text and "--reset" in text


def test_a_source_layers_commit_can_be_set_and_changes_its_key():
    """What each probe of a git bisect does: --set LAYER.SOURCE_REF=<commit>."""
    from attnforge.plan import Options, parse_overrides, resolve
    from attnforge.recipes import load_recipes

    recipes = load_recipes(REPO)
    layer = next(n for n, spec in recipes.layers.items() if spec.source)
    stack = next(s for s, spec in recipes.stacks.items() if any(e.layer == layer for e in spec.entries()))  # fmt: skip
    arch = next(a for a in recipes.arches if resolve(recipes, a, stack).step(layer).runs)
    commit = "0123456789abcdef0123456789abcdef01234567"
    before = resolve(recipes, arch, stack).step(layer)
    after = resolve(recipes, arch, stack, Options(
        overrides=parse_overrides([f"{layer}.SOURCE_REF={commit}"], recipes))).step(layer)  # fmt: skip
    assert before.pins["SOURCE_REF"] != commit and after.pins["SOURCE_REF"] == commit
    assert after.args["SOURCE_REF"] == commit and after.hash != before.hash
    with pytest.raises(UserError, match="40 lowercase hex digits"):
        parse_overrides([f"{layer}.SOURCE_REF=main"], recipes)


# ---------------------------------------------------------------------------- one probe


def _prober(tmp_path, engine, layer="triton", key="TRITON_VERSION", check="cmd:exit 1"):
    from attnforge.bisection.probe import Prober
    from attnforge.build import Invocation
    from attnforge.recipes import load_recipes
    from attnforge.workspace import Workspace

    ws = Workspace(REPO, tmp_path / "build", tmp_path / "reports")
    inv = Invocation(arch="cpu", stack="cpu", namespace="t")
    flags = {"devices": [], "groups": [], "extra": []}
    return ws, Prober(ws, load_recipes(REPO), engine, inv, layer, key, bs.parse_check(check), flags)  # fmt: skip


def _engine(exit_code=0, **script):
    from tests.unit.conftest import RecordingEngine

    class CheckingEngine(RecordingEngine):
        def run_streaming(self, req, log, on_line=None) -> int:
            self.calls.append(("check", req.image, tuple(req.command), req.mounts))
            log.write("the check's output\n")
            return exit_code

    return CheckingEngine(**script)


def test_a_probe_builds_with_the_pin_checks_the_final_image_and_keeps_its_evidence(tmp_path):
    engine = _engine(exit_code=1)
    ws, prober = _prober(tmp_path, engine)
    probe = prober.probe("3.5.0")
    assert (probe.verdict, probe.reason) == (bs.BAD, "the command exited 1")
    builds = [c for c in engine.calls if c[0] == "build"]
    triton = next(req for _, layer, req in builds if layer == "triton")
    assert triton.build_args["TRITON_VERSION"] == "3.5.0"
    check = next(c for c in engine.calls if c[0] == "check")
    assert check[1] == "sha256:validate-image" and check[2] == ("sh", "-c", "exit 1")
    assert check[3][0][1] == "/out"
    folder = Path(probe.report)
    assert folder == tmp_path / "reports/cpu/cpu/bisect/triton/3.5.0"
    assert json.loads((folder / "probe.json").read_text())["verdict"] == bs.BAD
    assert (folder / "check.log").read_text() == "the check's output\n"
    assert probe.build == dict.fromkeys(
        ["base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"], "built"
    )
    # content tags only; the user's last build state is not the probe's
    assert all(ref.split(":")[1].startswith("cpu-") for ref in engine.tags_moved())
    assert not (tmp_path / "build/state/last-build.json").exists()


def test_a_build_failure_of_the_bisected_layer_is_a_skip_with_its_log(tmp_path):
    engine = _engine(fail_build={"triton"})
    ws, prober = _prober(tmp_path, engine)
    probe = prober.probe("3.5.0")
    assert probe.verdict == bs.SKIP and "layer 'triton' failed to build" in probe.reason
    assert probe.build == {"base": "built", "torch-cpu": "built", "triton": "failed",
                           "cpp-extension": "built", "apps": "built",
                           "validate": "not run"}  # fmt: skip
    assert "no matching distribution" in (Path(probe.report) / "build-triton.log").read_text()
    assert not [c for c in engine.calls if c[0] == "check"]


def test_a_build_failure_below_the_bisected_layer_stops_the_bisect(tmp_path):
    engine = _engine(fail_build={"torch-cpu"})
    ws, prober = _prober(tmp_path, engine)
    with pytest.raises(UserError, match="layer torch-cpu, below the bisected layer triton, failed"):
        prober.probe("3.5.0")
    assert not (tmp_path / "reports/cpu/cpu/bisect/triton/3.5.0").exists()
    assert not list((tmp_path / "reports/cpu/cpu/bisect/triton").glob(".*"))
