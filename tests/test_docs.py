"""The README and docs/ say what the tool does now: every generated block (each command's `--help`,
the example outputs, the JSON records, the schema version, the benchmark list) is current (cog),
the README opens with the two commands CI runs as written, every command, verdict, module and
link the documents name exists, and the README stays short."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cogapp import Cog

from analyzer.cli import main
from analyzer.vocabulary import VERDICTS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
GENERATED = [path for path in [README, *DOCS] if "[[[cog" in path.read_text(encoding="utf-8")]


def _section(path: Path, title: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```$", text, flags=re.M | re.S)


@pytest.mark.parametrize("path", GENERATED, ids=lambda path: path.name)
def test_every_generated_block_is_current(path):
    status = Cog().main(["cog", "--check", str(path)])
    assert status == 0, (
        f"{path.name}'s generated blocks are stale: run `cog -r README.md docs/*.md`"
    )


def test_the_readme_and_the_command_reference_are_generated():
    assert {README, ROOT / "docs" / "cli.md", ROOT / "docs" / "json-contract.md"} <= set(GENERATED)


def test_the_readme_is_read_in_a_minute():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    first, second = _fenced_blocks(text)[:2]
    assert first == _marked_command("audit") + "\n"
    assert second == _marked_command("test") + "\n"


def _marked_command(name: str) -> str:
    """The command `.ci/run` runs for NAME, as `.ci/readme-command` reads it from the README."""
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "readme-command"), name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


def test_the_readme_opens_with_an_audit_of_a_bundled_sample_and_the_tests():
    audit = _marked_command("audit")
    assert "pip install . " in audit
    sample = audit.split("dstack-audit audit ", 1)[1].split()[0]
    assert (ROOT / sample).is_dir()
    test = _marked_command("test")
    assert "pip install '.[test]'" in test and test.endswith("-m pytest")


def test_ci_runs_the_readme_commands_not_a_copy():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme-command audit" in ci and "readme-command test" in ci
    assert "pytest" not in ci and "dstack-audit audit" not in ci


def test_a_missing_marker_is_one_line_and_exit_2():
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "readme-command"), "no-such-block"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1


def test_the_readme_names_every_verdict():
    table = _section(README, "Verdicts")
    named = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert named == list(VERDICTS)


def test_every_command_has_its_help_in_the_reference():
    section = _section(ROOT / "docs" / "cli.md", "Reference")
    documented = set(re.findall(r"<summary><code>dstack-audit (\S+)</code></summary>", section))
    assert documented == set(main.commands)


def test_every_command_is_in_the_synopsis():
    synopsis = _fenced_blocks((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))[0]
    named = set(re.findall(r"^dstack-audit (\S+)", synopsis, flags=re.M))
    assert named == set(main.commands)


def test_the_layout_names_every_module():
    layout = _fenced_blocks(_section(ROOT / "docs" / "design.md", "Layout"))[0]
    package = ROOT / "analyzer"
    entries = [
        path.name + ("/" if path.is_dir() else "")
        for path in package.iterdir()
        if path.name != "__pycache__" and (path.is_dir() or path.suffix == ".py")
    ]
    missing = [
        entry for entry in entries if not re.search(rf"(?<![\w/]){re.escape(entry)}", layout)
    ]
    assert not missing, f"docs/design.md's layout does not name {missing}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda path: path.name)
def test_every_relative_link_resolves(path):
    for link in _links(path):
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        page = (path.parent / target).resolve() if target else path
        assert page.exists(), f"{path.name}: {link} names no file"
        if anchor and page.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
            assert anchor in {_anchor(heading) for heading in headings}, f"{path.name}: {link}"


def test_the_readme_links_every_doc():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(README)}
    assert set(DOCS) <= linked, f"not linked from README.md: {set(DOCS) - linked}"
