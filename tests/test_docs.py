"""The README and docs/: a README a newcomer reads in minutes, links that lead somewhere, no
measurement history written by hand (numbers come from a run), and every module, file and
docs page they name exists."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *DOCS]

#: A dated measurement log: a commit hash followed by what it took, ran or passed; a date; or
#: a "Measured (" preamble. Numbers like these belong to a run's artifacts or a change's
#: closing note, where they cannot go stale.
DATED_LOG = re.compile(r"[0-9a-f]{7}\b.*(took|ran|passed)|20[0-9]{2}-[0-9]{2}-[0-9]{2}|Measured \(")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """(line number, line) of a Markdown text outside its fenced code blocks."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation other than '-' and '_'
    dropped, spaces made '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 ... for repeated ones."""
    seen, found = {}, set()
    for _, line in prose_lines(path.read_text()):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_links(path):
    """The relative links of a Markdown file whose file or heading anchor does not exist."""
    broken = []
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.name}:{number}: {target} (no such file)")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                broken.append(f"{path.name}:{number}: {target} (no such heading)")
    return broken


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: move details into docs/"


def test_the_readme_opens_with_the_quick_start():
    """The first screen says what the project is and how to set it up and test it."""
    first_screen = "\n".join(README.read_text().splitlines()[:30])
    assert "python3 -m venv .venv && . .venv/bin/activate" in first_screen
    assert "pip install -e '.[dev]' && python -m pytest" in first_screen


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(document):
    assert broken_links(document) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_dated_measurement_log(document):
    """Outside commands (code blocks), no line is a dated measurement."""
    logs = [f"{number}: {line}" for number, line in prose_lines(document.read_text())
            if DATED_LOG.search(line)]
    assert logs == [], "\n".join(logs)


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(README.read_text())}
    assert DOCS, "docs/ holds no page"
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def _named(pattern):
    return sorted({name for document in DOCUMENTS
                   for name in re.findall(pattern, document.read_text())})


def test_every_python_module_named_exists():
    """`python -m X` of the README and docs/ names a module of this project or its
    dependencies (found without running it)."""
    modules = [m for m in _named(r"python -m ([\w.<>]+)")
               if "<" not in m]  # experiments.<module>: a placeholder
    assert "experiments.bench_kernels" in modules
    assert [m for m in modules if importlib.util.find_spec(m) is None] == []


def test_every_project_path_named_exists():
    """A file or folder of the repository named in backticks (`layers/...`, `tests/...`, a
    notebook) exists, so the docs follow a rename; what a run generates (`figures/claims.md`,
    paths with <run> or <id>) is not checked."""
    paths = _named(r"`((?:layers|experiments|tests|profiles|docs)/[^`<>{}*\s]+"
                   r"|figures/[^`<>{}*\s]+\.ipynb)`")
    assert "layers/kernels/cpu.py" in paths
    missing = [p for p in paths if not (ROOT / p.split("::")[0]).exists()]
    assert missing == []


# ------------------------------------------------------------- the checks themselves can fail
def test_github_anchors_follow_githubs_rules():
    assert github_anchor("torch.compile, fake tensors and simulated memory") == \
        "torchcompile-fake-tensors-and-simulated-memory"
    assert github_anchor("PyTorch's BatchNorm utilities") == "pytorchs-batchnorm-utilities"
    assert github_anchor("Multi-process training (DDP)") == "multi-process-training-ddp"


def test_broken_links_and_dated_logs_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# A title\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-title) [ok](other.md#twice-1) [ok](#page)\n"
                    "[file](missing.md) [heading](other.md#nothing) [web](https://x.org/a)\n"
                    "```\n[in code](missing.md)\n```\n")
    assert broken_links(page) == ["page.md:4: missing.md (no such file)",
                                  "page.md:4: other.md#nothing (no such heading)"]
    assert DATED_LOG.search("at `381e35a` the same command took 26m02s")
    assert DATED_LOG.search("Checked on 2026-11-28")
    assert not DATED_LOG.search("the benchmark `python -m experiments.bench_kernels` measures it")
