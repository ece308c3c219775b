"""What an API or CLI export is, by content: the shape of each file (runs page, run, ps --json,
events page, `dstack event` text, server info) and which folders are a set of them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.sources.base import HEAD_BYTES, file_head

KIND = "api-export"


# What one file holds (its content shape).
RUNS_PAGE = "runs list page"


RUN = "run"


PS_JSON = "dstack ps --json"


EVENTS_PAGE = "events list page"


EVENT_TEXT = "dstack event text"


SERVER_INFO = "server info"


FLEETS_PAGE = "fleets list page"


INSTANCES_PAGE = "instances list page"


EMPTY_LIST = "empty JSON list"


DAMAGED = "damaged export"


EXPORT_SHAPES = (
    RUNS_PAGE,
    RUN,
    PS_JSON,
    EVENTS_PAGE,
    EVENT_TEXT,
    SERVER_INFO,
    FLEETS_PAGE,
    INSTANCES_PAGE,
    DAMAGED,
)


AUDITED_SHAPES = (RUNS_PAGE, RUN, PS_JSON, EVENTS_PAGE, EVENT_TEXT, DAMAGED)


SNIFF_BYTES = 64 * 1024


MAX_JSON_BYTES = 512 * 1024 * 1024


MAX_FOLDER_ENTRIES = 5000


# Keys as they start a JSON member (not inside an escaped string, as in a JSON log line).
_KEY = r'(?<!\\)"{}"\s*:'


_RUN_MARKERS = (re.compile(_KEY.format("run_spec")), re.compile(_KEY.format("project_name")))


_EVENT_MARKERS = (
    re.compile(_KEY.format("targets") + r"\s*\["),
    re.compile(_KEY.format("recorded_at")),
)


_INFO_MARKER = re.compile(r'^\{\s*"server_version"\s*:')


# `dstack event` (src/dstack/_internal/cli/services/events.py: print_event): local time, the
# actor only for user actions, targets "<type> <name>" joined by ", ", then the message.
TARGET_TYPES = "project|user|fleet|instance|run|job|volume|gateway|gateway-replica|secret|preset"


_TARGET = rf"(?:{TARGET_TYPES}) [^,\]]+"


EVENT_LINE = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] "
    r"(?:\[\N{BUST IN SILHOUETTE}(?P<actor>[^\]]*)\] )?"
    rf"\[(?P<targets>(?:{_TARGET}(?:, {_TARGET})*)?)\] (?P<message>.*)$"
)


ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


# ---------------------------------------------------------------------------------------------
# Recognition


_shape_cache: dict[tuple[str, int, int], str | None] = {}


def _is_run(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "run_spec", "status"} <= item.keys()


def _is_event(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "message", "recorded_at", "targets"} <= item.keys()


def _is_fleet(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "spec", "created_at", "instances"} <= item.keys()


def _is_instance(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "instance_num", "status", "created"} <= item.keys()


def shape_of(doc: Any) -> str | None:
    """The export a parsed JSON document is, or None."""
    if isinstance(doc, list):
        if not doc:
            return EMPTY_LIST
        if all(_is_event(item) for item in doc):
            return EVENTS_PAGE
        if all(_is_run(item) for item in doc):
            return RUNS_PAGE
        if all(_is_fleet(item) for item in doc):
            return FLEETS_PAGE
        if all(_is_instance(item) for item in doc):
            return INSTANCES_PAGE
        return None
    if isinstance(doc, dict):
        if _is_run(doc):
            return RUN
        runs = doc.get("runs")
        if "project" in doc and isinstance(runs, list) and all(_is_run(r) for r in runs):
            return PS_JSON
        if (
            isinstance(doc.get("server_version"), str)
            and len(doc) <= 8
            and all(not isinstance(v, dict | list) for v in doc.values())
        ):
            return SERVER_INFO
    return None


def _text_shape(head: bytes) -> str | None:
    text = ANSI.sub("", head.decode("utf-8", "replace"))
    lines = [line.rstrip() for line in text.splitlines()[:-1] or text.splitlines()]
    lines = [line for line in lines if line.strip()][:20]
    if not lines or not EVENT_LINE.match(lines[0]):
        return None
    matched = sum(1 for line in lines if EVENT_LINE.match(line))
    return EVENT_TEXT if matched >= 0.8 * len(lines) else None


def classify(path: Path) -> str | None:
    """What export a file is (by content), DAMAGED for an export that does not parse, or None."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _shape_cache:
        if len(_shape_cache) > 4096:
            _shape_cache.clear()
        _shape_cache[key] = _classify(path, stat.st_size)
    return _shape_cache[key]


def _classify(path: Path, size: int) -> str | None:
    whole = file_head(path)
    if whole is None:
        return None
    head = whole[:SNIFF_BYTES]
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if start not in (b"[", b"{") or _text_shape(head):  # event lines start with "[" too
        return _text_shape(head)
    text_head = head.decode("utf-8", "replace")
    looks_like_export = (
        (start == b"[" and all(m.search(text_head) for m in _EVENT_MARKERS))
        or all(m.search(text_head) for m in _RUN_MARKERS)
        or bool(_INFO_MARKER.match(text_head.lstrip("\ufeff \t\r\n")))
    )
    if size > MAX_JSON_BYTES:
        return DAMAGED if looks_like_export else None
    if _json_lines(head):
        return None  # one JSON value per line (a json-format log): never an API export
    try:
        doc = json.loads(
            whole if len(whole) < HEAD_BYTES or _no_json_early(whole) else path.read_bytes()
        )
    except (ValueError, OSError, RecursionError):
        return DAMAGED if looks_like_export else None
    return shape_of(doc)


# How far from where a head was cut a JSON error may depend on what follows (an escape, a
# number, a literal such as -Infinity are read a few characters ahead)
_CUT_MARGIN = 64


def _no_json_early(head: bytes) -> bool:
    """Whether a file's head is no JSON well before where it was cut: the whole file fails
    alike at the same place, so it is not read whole to learn that (a rich log's lines open
    with ``[``: 22 MB read and decoded for nothing). A string left open may close later."""
    try:
        json.loads(head)
    except json.JSONDecodeError as error:
        open_string = error.msg.startswith("Unterminated string")
        return not open_string and error.pos + _CUT_MARGIN < len(error.doc)
    except (ValueError, RecursionError):  # a character cut in two, a deep nesting
        return False
    return False


def _json_lines(head: bytes) -> bool:
    """The first line is a complete JSON value and more follows: JSON Lines, not a document."""
    first, newline, rest = head.partition(b"\n")
    if not newline or not rest.strip():
        return False
    try:
        json.loads(first)
    except (ValueError, RecursionError):
        return False
    return True


def folder_files(folder: Path, elsewhere: Callable[[Path], bool]) -> list[Path] | None:
    """Every non-hidden file below `folder`, or None when another source recognises something
    inside (`elsewhere`, the registry's other sniffers), or a linked folder is inside (then the
    registry meets the folder's entries one by one instead, as it does for any folder)."""
    files: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        for entry in [here / d for d in dirs] + [here / n for n in sorted(names)]:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                return None
            if entry.name.startswith("."):
                continue
            if entry.is_dir() and entry.is_symlink():
                return None  # os.walk does not follow it: let the registry decide
            if entry.is_file() and classify(entry) in EXPORT_SHAPES:
                files.append(entry)
                continue
            if elsewhere(entry):
                return None
            if entry.is_file():
                files.append(entry)
    return files


def sniff_export(path: Path, elsewhere: Callable[[Path], bool]) -> bool:
    if path.is_file():
        return classify(path) in EXPORT_SHAPES
    if path.is_dir():
        files = folder_files(path, elsewhere)
        return files is not None and any(classify(f) in AUDITED_SHAPES for f in files)
    return False
