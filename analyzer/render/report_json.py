"""The JSON report, rendered piece by piece: the same bytes as `model_dump_json(indent=2)` and a
newline, without the whole text in memory at once (a 100k-run report is ~250 MB of JSON).

Pieces are whole lines: the head (every field but the runs and the findings), each run
verdict and each finding on its own (indented as pydantic's `indent=2` places it in the
list), and the closing brackets. JSON escapes every newline inside a string, so each string of
the report lies on one line, inside one piece (analyzer.redact.redact_pieces relies on it).

A fleet of servers audited one server per task (analyzer.cluster.audit_servers) renders and
redacts each server's runs and findings in its task (`server_json`); this process only puts
the pieces in the one-process order after the head it renders (`fleet_json`). One audit's
partitions on local workers likewise pass their runs and findings through the final pass in
their processes, in the merge's spill files (`json_partitions`): the command passes the head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, AnyStr, NamedTuple

from pydantic import BaseModel

from analyzer.contract import Report

if TYPE_CHECKING:
    import polars as pl

    from analyzer.cluster import FleetTasks
    from analyzer.pipeline.partitions import ForesightPiece, MergedReport, SpilledPartition

STREAMED = ("runs", "findings")  # Report's last fields, in order: its lists of many items
_ITEM_INDENT = "    "  # a top-level field's list items, at `indent=2`
_ITEM_END = ",\n"  # an item's piece ends so; the last of its list with "\n" alone
_ITEM_INDENT_BYTES = _ITEM_INDENT.encode()
_ITEM_END_BYTES = _ITEM_END.encode()


def json_pieces(
    report: Report | MergedReport, rendered: Callable[[BaseModel], str] | None = None
) -> Iterator[str]:
    """`report.model_dump_json(indent=2) + "\\n"`, as consecutive whole lines (`rendered`:
    each run's and finding's piece, rendered already, as `item_piece` renders it; a merge of
    partitions: its runs and findings read from the partitions' files as they are written)."""
    if not isinstance(report, Report):
        merged = report

        def spilled(name: str) -> Iterator[str]:
            return (_as_piece(text) for text in merged.texts(name))

        yield from _pieces(merged.head, merged.counts, spilled)
        return
    if tuple(type(report).model_fields)[-len(STREAMED) :] != STREAMED:
        yield report.model_dump_json(indent=2) + "\n"  # a contract that moved them: whole
        return
    piece = rendered or item_piece

    def held(name: str) -> Iterator[str]:
        items: list[BaseModel] = getattr(report, name)
        return (piece(item) for item in items)

    counts = {name: len(getattr(report, name)) for name in STREAMED}
    yield from _pieces(report, counts, held)


def _pieces(
    report: Report, counts: dict[str, int], pieces: Callable[[str], Iterator[Any]]
) -> Iterator[Any]:
    """The report's JSON: its head, then each list's `pieces` (text, or UTF-8 bytes already
    ended as `_as_piece_bytes` ends them) between brackets; the head and brackets as text."""
    head = report.model_dump_json(indent=2, exclude=set(STREAMED))
    yield head.removesuffix("\n}") + ",\n"
    for number, name in enumerate(STREAMED):
        closing = "\n" if number == len(STREAMED) - 1 else ",\n"
        if not counts[name]:
            yield f'  "{name}": []{closing}'
            continue
        yield f'  "{name}": [\n'
        last = counts[name] - 1
        for index, text in enumerate(pieces(name)):
            yield text if index < last else _last_of_list(text)
        yield f"  ]{closing}"
    yield "}\n"


def _last_of_list(piece: AnyStr) -> AnyStr:
    """An item's piece (`_as_piece`, text or bytes) as the last of its list: its `_ITEM_END`
    (",\n") cut to its newline (a newline added to a piece the final pass left without it)."""
    if isinstance(piece, bytes):
        return piece.removesuffix(_ITEM_END_BYTES) + b"\n"
    return piece.removesuffix(_ITEM_END) + "\n"


def item_piece(item: BaseModel) -> str:
    """One run verdict or finding as the report's JSON lists it (followed by another)."""
    return _as_piece(item.model_dump_json(indent=2))


def _as_piece(text: str) -> str:
    """An item's `indent=2` JSON text as the report's list holds it (followed by another)."""
    return _ITEM_INDENT + text.replace("\n", "\n" + _ITEM_INDENT) + _ITEM_END


def _as_piece_bytes(text: bytes) -> bytes:
    """`_as_piece` of an item's text as UTF-8 bytes."""
    indented = text.replace(b"\n", b"\n" + _ITEM_INDENT_BYTES)
    return _ITEM_INDENT_BYTES + indented + _ITEM_END_BYTES


@dataclass
class ServerJson:
    """One server's report as its task sends it: its runs and findings rendered and redacted
    (`runs`, `findings`, in the report's order), and the report, its runs and findings cut
    down to what the merge reads once it leaves its process (pickled: `__reduce__`). The
    servers the command audits itself are merged as they are: never sent, they need no
    cutting (some 3,000 model copies a server of 2k runs, 0.01 s)."""

    report: Report
    runs: list[str]
    findings: list[str]

    def __reduce__(self) -> tuple[type[ServerJson], tuple[Report, list[str], list[str]]]:
        return ServerJson, (_merged_only(self.report), self.runs, self.findings)


def _merged_only(report: Report) -> Report:
    """`report` with its runs and findings cut down to what the merge reads (its capacity
    foresight answered in the server's own task)."""
    from analyzer.pipeline.partitions import slim_finding, slim_verdict

    return report.model_copy(
        update={
            "runs": [slim_verdict(v) for v in report.runs],
            "findings": [slim_finding(f, False) for f in report.findings],
        }
    )


def server_json(report: Report, rendered: ItemPieces | None = None) -> ServerJson:
    """`report`'s runs and findings rendered (or as `rendered` already holds them), each
    through the final redaction pass (every secret shape, every control character) the
    command gives the whole text: both in one pass, whose fixed cost is a third of a server's
    runs' (0.01-0.02 s a server of 2k runs)."""
    runs, findings = rendered or ItemPieces.of(report)
    redacted = _redacted([*runs, *findings])
    return ServerJson(report, redacted[: len(runs)], redacted[len(runs) :])


class ItemPieces(NamedTuple):
    """A report's runs and findings, each as the report's JSON lists it (item_piece)."""

    runs: list[str]
    findings: list[str]

    @classmethod
    def of(cls, report: Report) -> ItemPieces:
        return cls([item_piece(v) for v in report.runs], [item_piece(f) for f in report.findings])


def _redacted(pieces: Sequence[str]) -> list[str]:
    import polars as pl

    if not pieces:
        return []
    return _final_pass(pl.Series(pieces, dtype=pl.String)).to_list()


def _final_pass(pieces: pl.Series) -> pl.Series:
    """The final redaction pass over each piece of JSON, as `without_controls` then
    `Redactor.apply` with no known value give it: the hidden characters (`without_controls`'
    own) removed in one column, then every secret shape masked (all `apply` has left to do
    then), each piece on its own (items are distinct: none to find first, 0.04 s of 0.13 s a
    partition of 8k runs). JSON escapes every C0 control: in ASCII pieces only DEL can stand
    raw, which a plain search finds (the class of every hidden character, 0.03 s more)."""
    from analyzer.redact import HIDDEN, redact_shapes

    ascii = (pieces.str.len_bytes() == pieces.str.len_chars()).all()
    if not ascii or pieces.str.contains("\x7f", literal=True).any():
        pieces = pieces.str.replace_all(HIDDEN, "")
    return redact_shapes(pieces, dedupe=False)


@dataclass
class FleetJson:
    """A fleet's JSON report: the merged report (its runs and findings cut down, for the
    command's gate and its outputs' checks) and its pieces, ready to write."""

    report: Report
    parts: list[ServerJson]

    def pieces(self) -> Iterator[str]:
        """The one-process JSON report: the head rendered and redacted here, each run and
        finding as its server's task rendered and redacted it."""
        rendered = {
            id(item): piece
            for part in self.parts
            for items, pieces in (
                (part.report.runs, part.runs),
                (part.report.findings, part.findings),
            )
            for item, piece in zip(items, pieces, strict=True)
        }
        yield from _head_passed(json_pieces(self.report, lambda item: rendered[id(item)]))


def _head_passed(lines: Iterator[Any]) -> Iterator[Any]:
    """The JSON report's pieces, their runs and findings through the final pass already: the
    head (text) passed here, the rest as it is (brackets, and items as text or bytes)."""
    from analyzer.redact import Redactor, without_controls

    yield Redactor().apply(without_controls(next(lines)))
    yield from lines


def finished_json(merged: Any) -> tuple[Report, Iterator[str] | Iterator[bytes]] | None:
    """The merged report's head and its JSON text ready to write (in chunks: a write a
    piece is 20k writes at 16k runs), when its runs and findings were rendered and passed the
    final pass in their tasks (a fleet's servers: FleetJson; partitions on local workers:
    `json_partitions`); None: the command's final pass is left to give the whole text."""
    from analyzer.pipeline.partitions import MergedReport
    from analyzer.redact import chunked

    if isinstance(merged, FleetJson):
        return merged.report, chunked(merged.pieces())
    if isinstance(merged, MergedReport) and merged.passed:

        def passed(name: str) -> Iterator[bytes]:
            return (_as_piece_bytes(text) for text in merged.texts_bytes(name))

        pieces = _head_passed(_pieces(merged.head, merged.counts, passed))
        # the head and the brackets are text: encoded, every piece is bytes
        encoded = (p.encode("utf-8") if isinstance(p, str) else p for p in pieces)
        return merged.head, chunked(encoded)
    return None


def fleet_json(parts: list[ServerJson]) -> FleetJson:
    """The fleet's JSON report from its servers' parts, in the order the servers were given."""
    from analyzer.pipeline.assemble import merge_reports

    return FleetJson(merge_reports([part.report for part in parts]), parts)


@dataclass
class RenderedServer:
    """A server audited in its task with its JSON rendered there too, before the other
    servers' secret values are known: most often they mask nothing more in it."""

    audited: Any  # analyzer.api.ServerAudit
    json: ServerJson

    @property
    def head(self) -> Any:
        return replace(self.audited.head, part=self.json)


def audit_server_json(paths: Sequence[str], label: str, options: dict) -> RenderedServer:
    """One server of a fleet audited and rendered where its task runs."""
    from analyzer.api import audit_server

    rendered: list[ItemPieces] = []

    def pieces(report: Report) -> list[str]:
        """The report's JSON in the pieces the server's part is made of (its head, then each
        run and finding as written): the guard looks at the text written, not a dump."""
        rendered.append(ItemPieces.of(report))
        head = report.model_dump_json(exclude=set(STREAMED))
        return [head, *rendered[0].runs, *rendered[0].findings]

    audited = audit_server(paths, label, options, pieces)
    return RenderedServer(audited, server_json(audited.report, rendered[0]))


def finish_server_json(rendered: RenderedServer, secrets: frozenset[str]) -> ServerJson | None:
    """The server's JSON rendered again when the other servers' secret values mask more in
    it (analyzer.api.finish_server); None when its head's part stands."""
    from analyzer.api import finish_server

    report = finish_server(rendered.audited, secrets)
    return None if report is None else server_json(report)


def look_ahead_json(rendered: RenderedServer, secrets: frozenset[str]) -> None:
    """analyzer.api.look_ahead, for a server rendered in its task."""
    from analyzer.api import look_ahead

    look_ahead(rendered.audited, secrets)


@cache
def json_fleet() -> FleetTasks:
    """A fleet's servers audited one per task into the JSON report one process writes; made
    on first use, so that an audit in one process never imports the cluster's modules
    (analyzer.cluster)."""
    from analyzer.cluster import FleetTasks

    return FleetTasks(audit_server_json, finish_server_json, fleet_json, ahead=look_ahead_json)


def _passed_texts(texts: pl.Series) -> pl.Series | None:
    """Run verdicts' and findings' texts (`indent=2`) as the final pass leaves their pieces
    (each as the report's list holds it: `_as_piece`), back as texts, as one process's pass
    over the pieces written one after another leaves them (a rule that spans lines aside,
    as for a fleet's servers: `server_json`); None when a piece it changed is no longer one
    (a mask across its lines), or its text could not lie in a spill file."""
    import polars as pl

    pieces = pl.select(
        pl.concat_str(
            pl.lit(_ITEM_INDENT),
            pl.lit(texts).str.replace_all("\n", "\n" + _ITEM_INDENT, literal=True),
            pl.lit(_ITEM_END),
        )
    ).to_series()
    passed = _final_pass(pieces)
    changed = (passed != pieces).arg_true()
    if changed.is_empty():
        return texts
    back = []
    for piece in passed.gather(changed).to_list():
        text = piece.removeprefix(_ITEM_INDENT).removesuffix(_ITEM_END)
        text = text.replace("\n" + _ITEM_INDENT, "\n")
        if _as_piece(text) != piece or "\n\n" in f"\n{text}\n":
            return None
        back.append(text)
    return texts.clone().scatter(changed, back)


def finish_partitions_json(
    parts: dict[int, SpilledPartition], others: tuple[str, dict[int, ForesightPiece]]
) -> dict[int, SpilledPartition]:
    """The partitions one local process audited finished there (analyzer.api
    foresight_of_part), then their runs and findings through the JSON report's final pass
    there too, in parallel with the other processes' (as a fleet's servers': `server_json`):
    the command passes only the head."""
    from analyzer.api import foresight_of_part
    from analyzer.pipeline.partitions import texts_passed

    folder = Path(others[0])
    return {
        index: replace(part, passed=texts_passed(folder, index, _passed_texts))
        for index, part in foresight_of_part(parts, others).items()
    }


@cache
def json_partitions() -> FleetTasks:
    """One audit's partitions on local workers for the JSON report: analyzer.api
    partition_tasks, with `finish_partitions_json` for their second step."""
    from analyzer.api import partition_tasks

    return replace(partition_tasks(), then=finish_partitions_json)
