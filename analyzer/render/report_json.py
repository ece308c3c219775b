"""The JSON report, rendered piece by piece: the same bytes as `model_dump_json(indent=2)` and a
newline, without the whole text in memory at once (a 100k-run report is ~250 MB of JSON).

Pieces are whole lines: the head (every field but the runs and the findings), each run
verdict and each finding on its own (indented as pydantic's `indent=2` places it in the
list), and the closing brackets. JSON escapes every newline inside a string, so each string of
the report lies on one line, inside one piece (analyzer.redact.redact_pieces relies on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel

from analyzer.contract import Report

if TYPE_CHECKING:
    from analyzer.pipeline.partitions import MergedReport

STREAMED = ("runs", "findings")  # Report's last fields, in order: its lists of many items
_ITEM_INDENT = "    "  # a top-level field's list items, at `indent=2`


def json_pieces(report: Report | MergedReport) -> Iterator[str]:
    """`report.model_dump_json(indent=2) + "\\n"`, as consecutive whole lines (a merge of
    partitions: its runs and findings read from the partitions' files as they are written)."""
    if not isinstance(report, Report):
        yield from _pieces(report.head, report.counts, report.texts)
        return
    if tuple(type(report).model_fields)[-len(STREAMED) :] != STREAMED:
        yield report.model_dump_json(indent=2) + "\n"  # a contract that moved them: whole
        return

    def texts(name: str) -> Iterator[str]:
        items: list[BaseModel] = getattr(report, name)
        return (item.model_dump_json(indent=2) for item in items)

    counts = {name: len(getattr(report, name)) for name in STREAMED}
    yield from _pieces(report, counts, texts)


def _pieces(
    report: Report, counts: dict[str, int], texts: Callable[[str], Iterator[str]]
) -> Iterator[str]:
    head = report.model_dump_json(indent=2, exclude=set(STREAMED))
    yield head.removesuffix("\n}") + ",\n"
    for number, name in enumerate(STREAMED):
        closing = "\n" if number == len(STREAMED) - 1 else ",\n"
        if not counts[name]:
            yield f'  "{name}": []{closing}'
            continue
        yield f'  "{name}": [\n'
        last = counts[name] - 1
        for index, item in enumerate(texts(name)):
            text = item.replace("\n", "\n" + _ITEM_INDENT)
            yield _ITEM_INDENT + text + (",\n" if index < last else "\n")
        yield f"  ]{closing}"
    yield "}\n"
