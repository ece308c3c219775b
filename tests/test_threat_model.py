"""docs/threat-model.md is kept current: every test it names exists, every registered source
kind has its row among the inputs, every output format and command is named among the outputs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click

from analyzer.cli import main
from analyzer.sources import sources

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "docs" / "threat-model.md"


def section(title: str) -> str:
    text = MODEL.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def defined_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def test_every_test_the_threat_model_names_exists():
    named = set(re.findall(r"`(test_\w+)`", MODEL.read_text(encoding="utf-8")))
    assert named, "the threat model names no test"
    assert named - defined_tests() == set()


def test_every_boundary_row_names_a_test():
    for title in ("What crosses into the tool", "What leaves it"):
        rows = [line for line in section(title).splitlines() if line.startswith("| ")][2:]
        assert rows, title
        for row in rows:
            assert re.search(r"`test_\w+`", row.rsplit("|", 2)[-2]), row


def test_every_registered_source_kind_has_a_row():
    inputs = section("What crosses into the tool")
    missing = [s.kind for s in sources() if f"(`{s.kind}`)" not in inputs]
    assert missing == []


def test_every_output_format_and_command_is_named():
    outputs = section("What leaves it")
    whole = MODEL.read_text(encoding="utf-8")
    for name, command in main.commands.items():
        for param in command.params:
            if param.name == "fmt" and isinstance(param.type, click.Choice):
                for choice in param.type.choices:
                    assert f"`{name} --format {choice}`" in outputs, (name, choice)
        assert re.search(rf"`{name}[ `]", whole), name
    for folder in (
        "audit --bundle",
        "audit --quarantine",
        "ingest --to",
        "collect --to",
        "synth OUT",
    ):
        assert f"`{folder}`" in outputs, folder
