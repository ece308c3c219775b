"""The README documents every command: its command reference is `--help` itself (cog), and the
synopsis under "## Commands" names each command."""

from __future__ import annotations

import re
from pathlib import Path

from cogapp import Cog

from analyzer.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_generated_command_reference_is_current():
    status = Cog().main(["cog", "--check", str(README)])
    assert status == 0, "README.md's command reference is stale: run `cog -r README.md`"


def test_every_command_has_its_help_in_the_readme():
    section = _section("Commands")
    documented = set(re.findall(r"<summary><code>dstack-audit (\S+)</code></summary>", section))
    assert documented == set(main.commands)


def test_every_command_is_in_the_synopsis():
    synopsis = _section("Commands").split("```")[1]
    named = set(re.findall(r"^dstack-audit (\S+)", synopsis, flags=re.M))
    assert named == set(main.commands)
