"""The documentation's generated parts: every command's `--help` as it prints it, and real
example outputs of the bundled samples. README.md and docs/*.md embed them through cog blocks
(`cog -r README.md docs/*.md`); `tests/test_docs.py` fails when a block is stale, so the
documentation cannot drift from the tool.

`python -m analyzer.cli.docgen` prints the command reference."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from analyzer.cli import main

# The checkout the samples are read from: examples name them relative to it, as a user would.
CHECKOUT = Path(__file__).resolve().parents[2]


def _invoke(args: list[str], width: int) -> str:
    """Standard output of `dstack-audit ARGS` written to a pipe `width` columns wide."""
    result = CliRunner().invoke(
        main, args, prog_name="dstack-audit", terminal_width=width, env={"COLUMNS": str(width)}
    )
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    if crashed or result.exit_code not in (0, 1):
        raise RuntimeError(f"dstack-audit {shlex.join(args)}: {result.output or result.exception}")
    return result.stdout


def command_reference(width: int = 100) -> str:
    """Every command's `--help`, the group's first, each folded under its name (markdown)."""
    parts = []
    for name in ["", *sorted(main.commands)]:
        title = f"dstack-audit {name}".strip()
        help_text = _invoke([name, "--help"] if name else ["--help"], width)
        parts.append(
            f"<details><summary><code>{title}</code></summary>\n\n"
            f"```text\n{help_text}```\n\n</details>\n"
        )
    return "\n".join(parts)


def command_summaries() -> str:
    """One markdown list item per command: its name and the first sentence of its help."""
    return "\n".join(
        f"- `dstack-audit {name}`: {command.get_short_help_str(limit=100)}"
        for name, command in sorted(main.commands.items())
    )


def example(command: str, width: int = 80) -> str:
    """`$ dstack-audit COMMAND` and what it prints to a pipe `width` columns wide, run in the
    checkout as a user would (a fenced block)."""
    here = Path.cwd()
    os.chdir(CHECKOUT)
    try:
        output = _invoke(shlex.split(command), width)
    finally:
        os.chdir(here)
    return f"```\n$ dstack-audit {command}\n{output.rstrip()}\n```"


def _type_name(annotation: object) -> str:
    """A field's Python type without module prefixes: `str | None`, `list[Victim]`."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"\b(?:typing|datetime|analyzer\.contract)\.", "", text)
    return text.replace("Literal[", "one of [")


def contract_reference() -> str:
    """The JSON report's records, `Report` first, then each record below the one that first
    holds it: one markdown table per record (field, type, default)."""
    from pydantic import BaseModel

    from analyzer import contract

    order: list[type[BaseModel]] = [contract.Report]
    parts = []
    for model in order:
        rows = ["| field | type | default |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            default = field.get_default(call_default_factory=True)
            absent = "(required)" if field.is_required() else f"`{json.dumps(default)}`"
            shown = _type_name(field.annotation).replace("|", "\\|")
            rows.append(f"| `{name}` | `{shown}` | {absent} |")
            for used in re.findall(r"analyzer\.contract\.(\w+)", str(field.annotation)):
                record = getattr(contract, used)
                if record not in order:
                    order.append(record)
        parts.append(f"### `{model.__name__}`\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def rules_reference() -> str:
    """The rules of the detector (analyzer.pipeline.rules.RULES), in the order they are asked:
    one row per rule id, its outcome and the dstack behaviour it encodes."""
    from analyzer.pipeline.rules import RULES

    rows = ["| rule | outcome | the dstack behaviour it encodes |", "|---|---|---|"]
    for rule in RULES:
        said = rule.dstack.replace("|", "\\|")
        rows.append(f"| `{rule.id}` | {rule.outcome} | {said} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(command_reference(), end="")
