"""The README and the pages under docs/: they build, they stay short, and what they say holds.

Torch-free. The site is built with ``mkdocs build --strict`` where MkDocs is installed (the
``docs`` extra); the README is held to 250 lines; what the README and the pages say about the
registered torch releases, PyPI's CUDA build, the evidence's schema versions, the registered
suite and the diagnoses is held to the code that decides it; and every relative link resolves.

Nothing is read at import time: the live job copies tests/ out of the source tree, where these
files do not exist, and collection must still succeed there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_invariant import plan, runtimes, wheels
from dcp_invariant.evidence import diagnosis, schema
from dcp_invariant.evidence.diagnosis import TIMEOUT

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MKDOCS_CONFIG = REPO / "mkdocs.yml"
README_MAX_LINES = 250
BUILD_TIMEOUT = 120
# Where a number of releases or scenarios is written out as a word.
NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _in_the_source_tree() -> None:
    if not README.is_file() or not DOCS.is_dir():
        pytest.skip("README.md and docs/ are not here (outside the source tree)")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def without_code_blocks(path: Path) -> str:
    """The text outside fenced code blocks, which show a command or a file as it is."""
    return re.sub(r"^```.*?^```$", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)


def prose(path: Path) -> str:
    """The text outside code blocks and inline code: what a reader takes as a link."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(path))


def section(path: Path, heading: str) -> str:
    """The text under ``heading`` (a whole line), up to the next heading of its level or above."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    level = len(heading.split(" ", 1)[0])
    end = re.search(rf"^#{{1,{level}}} ", text[start:], re.M)
    return text[start:] if end is None else text[start : start + end.start()]


# --- the site and the README's length -------------------------------------------------------


def test_the_frameworks_page_shows_the_adapters_examples_as_they_run() -> None:
    """Pasted verbatim: tests/adapters/ runs these files (through tests/*_loops.py)."""
    page = (DOCS / "frameworks.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", page, re.M | re.S)
    examples = [REPO / "examples" / f"{name}_fixture.py" for name in ("fabric", "accelerate")]
    if not all(path.is_file() for path in examples):
        pytest.skip("examples/ is not here (an sdist holds docs/ and tests/ only)")
    assert blocks == [path.read_text(encoding="utf-8") for path in examples]


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="needs the docs extra: pip install -e '.[docs]'")
    site = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
            str(MKDOCS_CONFIG), "--site-dir", str(site),
        ],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    built = {p.stem for p in pages()} - {"index"}
    assert {p.parent.name for p in site.glob("*/index.html")} >= built
    assert (site / "index.html").is_file()


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()

    # What the tool checks, how to run it, and where to read more; docs/ says the rest.
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


# --- what the README and the pages say about torch, held to runtimes.json -------------------


def test_the_registered_releases_are_named_as_registered() -> None:
    """The count, the oldest and the newest in "N registered releases, A to B" are the
    registry's."""
    releases = runtimes.releases()
    claims = [
        m.groups()
        for path in [README, *pages()]
        for m in re.finditer(
            r"(\w+)\s+registered\s+releases?,\s+(\d+\.\d+\.\d+)\s+to\s+(\d+\.\d+\.\d+)",
            path.read_text(encoding="utf-8"),
        )
    ]

    assert len(claims) >= 2, "the README and docs/supported-torch.md each say it once"
    for count, oldest, newest in claims:
        assert (NUMBER_WORDS.get(count), oldest, newest) == (
            len(releases),
            releases[0],
            releases[-1],
        )


def test_every_cuda_build_named_is_a_registered_runtime() -> None:
    """A CUDA build's version (`2.13.0+cu130`) is one a registered PyPI wheel for Linux reports,
    and "`2.13.0` reports `2.13.0+cu130`" names a registered pair."""
    cuda = {
        (e.distribution, e.torch)
        for e in wheels.load()
        if e.build == "pypi" and e.sys_platform == "linux"
    }
    texts = [p.read_text(encoding="utf-8") for p in [README, *pages()]]
    named = {v for text in texts for v in re.findall(r"\b(\d+\.\d+\.\d+\+cu\d+)\b", text)}
    pairs = {p for text in texts for p in re.findall(r"`([\d.]+)` reports `([^`]+)`", text)}

    assert named, "the README names the CUDA build's version"
    assert named <= {torch for _, torch in cuda}
    assert pairs and pairs <= cuda


def test_nothing_says_that_the_cuda_build_is_refused() -> None:
    """runtimes.json registers PyPI's CUDA builds, so `run` accepts them: no sentence about the
    CUDA build may say it is refused (the README, the docs, pyproject's comments and runtimes.py
    said so once)."""
    assert any("+cu" in r.torch for r in runtimes.RUNTIMES), "no CUDA build is registered"
    sources = [README, *pages(), REPO / "CONTRIBUTING.md", REPO / "pyproject.toml"]
    sources.append(Path(runtimes.__file__))
    refusals = []
    for path in sources:
        # One line of prose, without comment markers, so that a sentence can be matched whole.
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))
        for sentence in re.split(r"(?<=[.;])\s", text):
            if "CUDA" in sentence and re.search(r"\brefuse", sentence):
                refusals.append(f"{path.name}: {sentence.strip()}")
    assert refusals == []


# --- what the pages say about the evidence and the scenarios, held to the code ---------------


def test_the_schema_table_is_the_schemas() -> None:
    """docs/evidence.md's table: the registered suite's, a fixture run's, an in-job run's."""
    text = (DOCS / "evidence.md").read_text(encoding="utf-8")
    table = text[text.index("| artifact of | schema |") :].split("\n\n", 1)[0]
    versions = [int(v) for v in re.findall(r"^\| .+ \| (\d+) \|$", table, re.M)]

    assert versions == list(schema.VERSIONS)
    # The old form, "schema v4", went stale once; the table is the one place for the versions.
    assert not re.search(r"schema v\d", text)


def test_the_registered_suite_is_the_plans() -> None:
    """The registered suite's table names its scenarios; its scenario and file counts, wherever
    they are written, and the default fixture run's count in the README, are the plans'."""
    names = plan.SCENARIO_NAMES
    page = (DOCS / "registered-suite.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", page, re.M)
    listed = [n for row in rows for n in re.findall(r"`(\w+)`", row)]
    evidence = (DOCS / "evidence.md").read_text(encoding="utf-8")
    [files] = re.findall(r"A registered run writes exactly (\d+) files", evidence)
    texts = [p.read_text(encoding="utf-8") for p in [README, *pages(), REPO / "CHANGELOG.md"]]
    said = [
        word
        for text in texts
        for word in re.findall(r"(?:registered suite[,:]?|\bthe) (\w+) (?:live )?scenarios", text)
        if word in NUMBER_WORDS
    ]
    [fixture_run] = re.findall(
        r"default world sizes, 1 and 2, that is (\w+) scenarios", " ".join(texts[0].split())
    )

    assert sorted(listed) == sorted(names)
    assert int(files) == len(schema.artifact_files(names))
    assert said and {NUMBER_WORDS[w] for w in said} == {len(names)}
    assert NUMBER_WORDS[fixture_run] == len(plan.fixture_plan("m:f").names)


def test_the_diagnoses_are_listed_in_their_rank() -> None:
    text = section(DOCS / "diagnoses.md", "## The causes, ranked")
    listed = re.findall(r"^- `([^`]+)`:", text, re.M)

    # A timeout has no rank of its own: it sorts after every ranked cause.
    assert listed == [*diagnosis.RANKED_CAUSES, TIMEOUT]


# --- links -------------------------------------------------------------------------------


def slugs(path: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub and MkDocs make them from plain words:
    lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", without_code_blocks(path), re.M)
    return {re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())) for h in headings}


@pytest.mark.parametrize(
    "name",
    ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs"],
)
def test_every_relative_link_resolves(name: str) -> None:
    paths = pages() if name == "docs" else [REPO / name]
    broken = []
    for path in paths:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(path)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert broken == []
