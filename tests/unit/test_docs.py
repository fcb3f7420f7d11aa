"""The docs hold together: every figure README.md states is one docs/benchmarks.md holds, every
relative link of README.md and docs/ leads to a file, every section a page, comment or docstring
names (`docs/kernels.md, "Known spills"`) is on the page it names, and the user-facing pages name
features, not the issue numbers the work was tracked under (the history log keeps those)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO, repo_files

HISTORY = REPO / "docs" / "history"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
USER_PAGES = [p for p in PAGES if HISTORY not in p.parents]

NUM = r"\d[\d,]*(?:\.\d+)?"
UNITS = r"x|s|ms|µs|us|minutes?|tests|passed|pass|skipped|skip|checks|GB|GiB|MiB|MB|TFLOP/s|%"
# a number or a range of two, then its unit; not part of a word, a version or a path (gfx942,
# 512x512, 3.6.0, sm90)
FIGURE = re.compile(rf"(?<![\w.\-/]){NUM}(?:\s?[-–]\s?{NUM})?\s?(?:{UNITS})(?![\w/.]\d|[\w/])")
# figures README states that are settings, not measurements: where each is set
SETTINGS = {
    "0.9x": ("recipes/stacks.yaml", r"min_ratio: 0\.9\b"),  # the AMD stacks' bench gate
    "4 GiB": ("attnforge/hostinfo.py", r"4 GiB a job"),  # the default MAX_JOBS rule
}


def readme_figures(text: str) -> list[str]:
    return [" ".join(m.group(0).split()) for m in FIGURE.finditer(text)]


def holds(page: str, figure: str) -> bool:
    """Whether the page states the figure: the same numbers with the same unit (a table cell
    with the bare number is not enough: the page says which ratio the README quotes)."""
    page = " ".join(page.replace("**", "").split())
    m = re.fullmatch(rf"({NUM}(?:\s?[-–]\s?{NUM})?)\s?(.+)", figure)
    number, unit = re.escape(m.group(1)).replace("\\-", "[-–]"), re.escape(m.group(2))
    return bool(re.search(rf"(?<![\w.]){number}\s?{unit}(?!\w)", page))


def test_the_figure_reader_finds_ratios_times_and_counts_but_not_versions_or_shapes():
    text = ("forward at 1.67x flash, 136 s measured, about 1,850 tests, 12-24 µs a step, "
            "triton 3.6.0, gfx942, 512x512, (4,16,4096,128), sm90")  # fmt: skip
    assert readme_figures(text) == ["1.67x", "136 s", "1,850 tests", "12-24 µs"]
    assert holds("forward **1.67x**, fwd+bwd 1.47x", "1.67x") and holds("took 12–24 µs", "12-24 µs")
    assert not holds("| 1.67 |", "1.67x") and not holds("1.671x", "1.67x")
    assert not holds("took 1136 s", "136 s") and not holds("136 ms", "136 s")


def test_every_figure_the_readme_states_is_held_by_the_benchmarks_page():
    readme = (REPO / "README.md").read_text()
    page = (REPO / "docs" / "benchmarks.md").read_text()
    figures = readme_figures(readme)
    assert len(figures) >= 8, figures  # the README's speed, test-count and timing claims
    missing = [f for f in figures if f not in SETTINGS and not holds(page, f)]
    assert not missing, f"README.md states figures docs/benchmarks.md does not hold: {missing}"
    for figure, (path, pattern) in SETTINGS.items():
        if figure in figures:
            assert re.search(pattern, (REPO / path).read_text()), f"{figure} is not set in {path}"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes for a Markdown page (lower case, punctuation dropped,
    spaces to hyphens, a repeated one numbered)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
        counts[slug] = counts.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_its_heading(page: Path):
    text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)  # code is not a link
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        ):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def test_the_anchor_reader_follows_githubs_rule(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Workload shapes, default and all-Triton paths\n## CI time\n## CI time\n")
    assert anchors(page) == {"workload-shapes-default-and-all-triton-paths", "ci-time", "ci-time-1"}


ISSUE = re.compile(r"\bissues?[ -]#?\d+|\bissue \d+'s", re.I)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_user_facing_pages_name_features_not_issue_numbers(page: Path):
    found = [
        f"{n}: {line.strip()[:80]}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, f"{page.relative_to(REPO)} names issue numbers: {found}"


# A page's section named in prose or a comment: `docs/benchmarks.md, "CI time"` or
# `(docs/kernels.md "Known spills")`, wrapped over lines and comment markers. Sections move to the
# history log as the pages are cut down; a name left pointing at the old page sends a reader to
# nothing. Not a reference: a page of another project's (ollama/ollama docs/gpu.md).
SECTION_REF = re.compile(
    r'(?:(\S+)\s)?(?<![\w/.-])(docs/[\w/.-]+\.md)(?:,\s*|\s+)\(?"([^"(){}\[\]=\\]{3,160})"'
)
OTHER_PROJECT = re.compile(r"[(`]*[\w.-]+/[\w.-]+")
SOURCES = ("*.md", "*.py", "*.cpp", "*.sh", "*.yaml", "Makefile")  # git pathspecs


def section_refs(text: str) -> list[tuple[str, str]]:
    """(page, section name) for each named section, comment markers and line breaks read as
    spaces, a trailing ``...`` or full stop dropped."""
    lines = (re.sub(r"^\s*(?:#|//|\*)(?=\s|$)", "", line) for line in text.splitlines())
    flat = " ".join(" ".join(lines).split())
    return [
        (page, re.sub(r"\s*(?:\.\.\.|…)$", "", name).rstrip(". "))
        for before, page, name in SECTION_REF.findall(flat)
        if not OTHER_PROJECT.fullmatch(before)
    ]


def sections(page: Path) -> list[str]:
    """What a reference can name on a page, code marks dropped: its headings, its bold run-in
    labels, a paragraph's opening label (``Waves: ...``) and a table row's first cell."""
    text = page.read_text()
    heads = re.findall(r"^#+ (.+)$", text, flags=re.M)
    bold = re.findall(r"\*\*([^*]+)\*\*", " ".join(text.split()))
    opening = re.findall(r"(?:\A|\n\n)([^\n:|#]{1,60}):", text)
    cells = re.findall(r"^\| ([^|]+) \|", text, flags=re.M)
    return [n.replace("`", "").strip().rstrip(".:") for n in heads + bold + opening + cells]


# A section of the same page: `"Waves" above`, `("One warp group a program" below)`.
NEARBY_REF = re.compile(r'"([^"]{3,120})"\)?,? (?:below|above)\b')


def on_page(found: list[str], name: str) -> bool:
    """Whether a page whose ``sections`` are ``found`` has the section ``name``."""
    name = name.replace("`", "").rstrip(". ")
    return any(s.startswith(name) for s in found)


def test_the_section_reader_reads_wrapped_and_commented_references(tmp_path):
    text = (
        '# measured on an H100 (docs/history/benchmarks-2026.md, "The long-split\n'
        '# tile where a launch fills one wave"); see docs/kernels.md "Known spills ...".\n'
        'path = REPO / "docs/kernels.md"  # not a reference\n'
        'see ollama/ollama docs/gpu.md ("Overrides on Linux")\n'
    )
    assert section_refs(text) == [
        ("docs/history/benchmarks-2026.md", "The long-split tile where a launch fills one wave"),
        ("docs/kernels.md", "Known spills"),
    ]
    page = tmp_path / "p.md"
    page.write_text(
        "## `observe`: the image confirms\n- **Backward.** Two launches.\n\nWaves: fewer.\n\n"
        "| labels | kept |\n"
    )
    found = sections(page)
    assert found == ["observe: the image confirms", "Backward", "Waves", "labels"]
    assert on_page(found, "`observe`") and not on_page(found, "Forward")


def test_every_named_section_is_on_the_page_it_names():
    pages: dict[str, list[str]] = {}  # each named page's sections, read once

    def has(page: str, name: str) -> bool:
        if page not in pages:
            pages[page] = sections(REPO / page) if (REPO / page).is_file() else []
        return on_page(pages[page], name)

    broken = []
    for rel, text in repo_files(*SOURCES).items():
        if rel.startswith("docs/history/"):
            continue
        broken += [
            f'{rel}: {page} "{name}"' for page, name in section_refs(text) if not has(page, name)
        ]
        if rel.endswith(".md"):
            nearby = NEARBY_REF.findall(" ".join(text.split()))
            broken += [f'{rel}: "{name}" on the same page' for name in nearby if not has(rel, name)]
    assert not broken, "named sections not on their page:\n" + "\n".join(sorted(set(broken)))


# The kernels' commands the pages show, by module, and where their argument parser is: a page that
# shows a flag the command no longer takes (or a value it refuses) fails here, not in a reader's
# hands on a GPU machine.
COMMANDS = {
    "attnforge_kernels.bench": "attnforge_kernels.tools.benchmark",
    "attnforge_kernels.aot": "attnforge_kernels.tools.compile_check",
}
COMMAND = re.compile(r"^\S*python3? -m (attnforge_kernels\.(?:bench|aot))(?=\s|$)")


def shown_commands(text: str) -> list[str]:
    """The commands a page shows: each line of a fenced block (``\\`` continuations joined) and
    each inline code span (wrapped over lines), as written; not the module's bare name, nor a
    synopsis (``[--arch ...]``, ``a | b``, ``...``)."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    found = [
        line.strip()
        for block in fenced.findall(text)
        for line in block.replace("\\\n", " ").splitlines()
    ]
    found += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", fenced.sub("", text))]
    synopsis = re.compile(r"\[|\s\|\s|\.\.\.")
    quoted = re.compile(r"'[^']*'|\"[^\"]*\"")  # a JSON override's lists are not a synopsis

    def command(c: str) -> bool:
        return (
            bool(COMMAND.match(c)) and len(c.split()) > 3 and not synopsis.search(quoted.sub("", c))
        )

    return [c for c in found if command(c)]


def test_the_command_reader_finds_fenced_wrapped_and_inline_commands():
    text = (
        "Run `python -m attnforge_kernels.bench --workloads\n--rounds 3` or:\n\n```\n"
        "python -m attnforge_kernels.aot --arch gfx942 \\\n    --head-dims 64\nls\n```\n"
        "and `python -m attnforge_kernels.benchmark` is another module; "
        "`python -m attnforge_kernels.aot` a name; `python -m attnforge_kernels.aot --arch X "
        "[--arch Y ...] | --all` and `python -m attnforge_kernels.bench --variant ...` synopses; "
        "`python -m attnforge_kernels.bench --decode\n--variant 's4={\"kv_decode\": [16, 128, 4, 4]}'`"
        " a command with a JSON list."
    )
    assert shown_commands(text) == [
        "python -m attnforge_kernels.aot --arch gfx942      --head-dims 64",
        "python -m attnforge_kernels.bench --workloads --rounds 3",
        "python -m attnforge_kernels.bench --decode --variant 's4={\"kv_decode\": [16, 128, 4, 4]}'",
    ]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_kernels_command_a_page_shows_parses(page: Path):
    bad = []
    for command in shown_commands(page.read_text()):
        module = importlib.import_module(COMMANDS[COMMAND.match(command).group(1)])
        parser = module._parser()

        def refuse(message, command=command):
            raise ValueError(f"{command}: {message}")

        parser.error = refuse
        try:
            parser.parse_args(shlex.split(command)[3:])
        except ValueError as e:
            bad.append(str(e))
    assert not bad, "\n".join(bad)
