"""dstack's REST API and CLI exports -> the canonical model (reference sections 8.3 and 10).

What a user without database access can hand over, recognised by content, never by name:

- a runs list page (`POST /api/runs/list`: a JSON array of Run objects),
- one run (`POST /api/project/<p>/runs/get`, or `dstack run get --json`: one Run object),
- `dstack ps --json` output (`{"project": ..., "runs": [Run, ...]}`, latest submissions only),
- an events list page (`POST /api/events/list`: a JSON array of events with `targets`),
- `dstack event` text output (`[2026-11-02 09:09:12] [run web] Run status changed ...`, the
  client's local time, names but no ids),
- `POST /api/server/get_info` (`{"server_version": ...}`), for the server version.

One file alone is loaded on its own. A folder whose every file is such an export (or a
companion that no other source claims, such as the exporter's manifest) is loaded as one set:
the same run, job or event seen in several files (runs list and runs get; the `all`,
`within_project` and `within_run` event listings; `event.txt` and `event-since.txt`) becomes
one row, job events get their run id from the runs of the set, and `dstack event` lines get
ids from the set's runs JSON (names are resolved, and their times aligned with the JSON's UTC
times when the lines and the JSON agree on an offset). Whatever the loading unit, the rows
use full dashed ids and the same values as the other sources, so the project's combine step
collapses the overlap between sets, files and the database."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from analyzer.sources.api.recognise import EVENT_TEXT, KIND, classify, folder_files, sniff_export
from analyzer.sources.base import InputKind, LoadContext, SourceData

__all__ = ["EVENT_TEXT", "KIND", "classify", "load_folder", "source"]


def source(elsewhere: Callable[[Path], bool]) -> InputKind:
    """The API export source; `elsewhere` says whether another source recognises a path (a
    folder holding one is left to the registry, entry by entry). What reads an export (its
    pydantic models, the rows) is imported when one is loaded, not to recognise one."""

    def load(given: str, ctx: LoadContext) -> SourceData:
        from analyzer.sources.api.exports import load_set

        path = Path(given)
        if path.is_dir():
            files = folder_files(path, elsewhere) or []
            return load_set(files, ctx.server, given, tolerant=True)
        return load_set([path], ctx.server, given, tolerant=False)

    return InputKind(kind=KIND, load=load, sniff=lambda path: sniff_export(path, elsewhere))


def load_folder(folder: Path, server: str) -> SourceData:
    """Every file of a folder known to be API pages (a collection): none is left to another
    source."""
    from analyzer.sources.api.exports import load_set

    files = folder_files(folder, lambda path: False) or []
    return load_set(files, server, str(folder), tolerant=True)
