"""Every output format the tool writes, in one registry: its name, the file extensions that
choose it, and what it holds. A command lists the names it writes and takes `--format` and
`-o FILE`'s extension from here, so a format has the same name on every command (as sqlite-utils
offers `--csv`, `--json`, `--nl` and `--table` everywhere). Pure data: the CLI reads it at
start-up, before polars or pydantic are imported."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """A format: the name `--format` takes, the extensions that choose it, what it writes."""

    name: str
    suffixes: tuple[str, ...]
    holds: str


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("table", (".txt",), "the readable table"),
        Format("text", (".txt",), "readable text"),
        Format("markdown", (".md", ".markdown"), "markdown"),
        Format("json", (".json",), "the JSON contract"),
        Format("jsonl", (".jsonl", ".ndjson"), "JSON Lines, one record a line"),
        Format("csv", (".csv",), "CSV, one record a row"),
        Format("timesketch", (), "JSON Lines for Timesketch"),
        Format("html", (".html", ".htm"), "one self-contained HTML file"),
        Format("png", (".png",), "a PNG picture"),
        Format("svg", (".svg",), "an SVG picture"),
        Format("pdf", (".pdf",), "a PDF"),
    )
}


def by_suffix(names: tuple[str, ...]) -> dict[str, str]:
    """{extension: format name} for the formats `names` (the first format claiming an
    extension has it)."""
    found: dict[str, str] = {}
    for name in names:
        for suffix in FORMATS[name].suffixes:
            found.setdefault(suffix, name)
    return found


def listing(names: tuple[str, ...]) -> str:
    """'table (.txt): the readable table; json (.json): ...' for a command's --help."""
    return "; ".join(
        f"{name}"
        + (f" ({', '.join(FORMATS[name].suffixes)})" if FORMATS[name].suffixes else "")
        + f": {FORMATS[name].holds}"
        for name in names
    )
