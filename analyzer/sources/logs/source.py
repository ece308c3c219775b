"""Server logs as a source: any file (plain or .gz) that reads as a dstack log, by content."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

from analyzer.sources import InputInfo, Limitation, Source, SourceData, bytes_facts, file_facts
from analyzer.sources.logs.messages import records_to_events
from analyzer.sources.logs.reader import SNIFF_BYTES, LogRead, read_log, read_log_bytes, sniff_log


def _sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError:
        return False
    if head.startswith(b"\x1f\x8b"):
        try:
            with gzip.open(path, "rb") as handle:
                head = handle.read(SNIFF_BYTES)
        except (OSError, EOFError):
            pass
    if not head.strip():
        return _empty_log_name(path)
    return sniff_log(head)


def _empty_log_name(path: Path) -> bool:
    """An empty file is only taken as a log when nothing else could be meant (a file named
    like a log): it then says, as a limitation, that it holds nothing."""
    return ".log" in path.name


def _load(path: Path, server: str) -> SourceData:
    return _from_read(file_facts(path, "log"), read_log(path), server)


def load_stdin(server: str) -> SourceData:
    data = sys.stdin.buffer.read()
    return _from_read(bytes_facts(data, "-", "log"), read_log_bytes(data, "-"), server)


def _from_read(info: InputInfo, read: LogRead, server: str) -> SourceData:
    path = info.path
    events, facts = records_to_events(read.records, path, server)
    info.kind = (
        f"log ({read.format or 'empty'}" + (f", {read.wrapper}" if read.wrapper else "") + ")"
    )
    info.records = facts.relevant
    info.unparsed = read.unparsed.height
    info.server_version = facts.server_version
    info.notes.append(
        f"{read.lines_total} lines: {read.records.height} records "
        f"({facts.relevant} relevant, {facts.irrelevant} irrelevant, "
        f"{facts.unrecognised} unrecognised dstack lines), {read.lines_irrelevant} blank/logo, "
        f"{read.unparsed.height} unparsed"
    )
    info.notes.extend(read.damage)
    for shape, count in list(facts.unrecognised_shapes.items())[:20]:
        info.notes.append(f"unrecognised dstack line x{count}: {shape}")
    data = SourceData(events=events, inputs=[info])
    for text in (read.records["message"], read.unparsed["text"]):
        tokens = text.str.extract(r"The admin token is (\S+)", 1).drop_nulls()
        data.secrets.update(tokens.to_list())
    data.log_reads.append((read, facts))
    if facts.ambiguous_jobs:
        data.limitations.append(
            Limitation(
                "log_run_attribution_ambiguous",
                f"{facts.ambiguous_jobs} job(s) appeared while several runs of the same name were "
                "alive (log lines carry no project): each was given to the run whose job-creating "
                "event came last; a database of the same server removes the ambiguity",
                path,
            )
        )
    if facts.relevant == 0:
        levels = ", ".join(f"{k}: {v}" for k, v in sorted(facts.levels.items())) or "no records"
        data.limitations.append(
            Limitation(
                "log_without_run_evidence",
                "this log holds no run or job lifecycle line (" + levels + "); at dstack's "
                "WARNING level nothing about these incidents is logged, so it cannot show "
                "whether any happened (run the server at INFO, dstack server's default)",
                path,
            )
        )
    return data


SOURCE = Source(kind="log", sniff=_sniff, load=_load)
