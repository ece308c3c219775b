"""Tests for analyzer.sources.logs.reader on the real captures and fixtures built from them."""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from analyzer.magic import MATTER_WORDS
from analyzer.model import LOG_RECORDS_SCHEMA
from analyzer.sources.logs import layouts, quiet, reader
from analyzer.sources.logs import lines as log_lines
from analyzer.sources.logs.lines import rotated_set, split_text, split_with_csv_reader
from analyzer.sources.logs.messages import (
    MATTER_LOGGER_PATTERNS,
    MATTER_TEXT_PATTERNS,
    EventCollector,
    records_to_events,
)
from analyzer.sources.logs.reader import (
    LogRead,
    LogStream,
    read_log,
    read_log_bytes,
    sniff_log,
)
from analyzer.sources.logs.wrappers import unwrap
from analyzer.synth import rich_fold

DATA = Path(__file__).parent / "data" / "logs"
CAPTURES = Path(__file__).resolve().parent / "data" / "captures"  # the project's copies
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "dstack-data.md"
NO_CAPTURES = "the real captures (tests/data/captures) are not available"
needs_captures = pytest.mark.skipif(not CAPTURES.is_dir(), reason=NO_CAPTURES)

CAPTURE_DIRS = sorted(CAPTURES.glob("*/*/logs")) if CAPTURES.is_dir() else []
CAPTURE_LOGS = sorted(p for d in CAPTURE_DIRS for p in d.glob("*.log"))


def _ids(paths: list[Path]) -> list[str]:
    return ["/".join(p.relative_to(CAPTURES).parts) for p in paths]


def accounted(read: LogRead) -> LogRead:
    """The accounting invariant and the output shapes, checked for every read in this file."""
    assert read.records.schema == pl.Schema(LOG_RECORDS_SCHEMA)
    assert read.unparsed.schema == pl.Schema(
        {"file": pl.String, "line": pl.Int64, "text": pl.String}
    )
    counted = int(read.records["line_count"].sum() or 0)
    assert counted + read.lines_irrelevant + read.unparsed.height == read.lines_total
    assert (read.records["line_count"] >= 1).all()
    # records and unparsed lines do not overlap and are in file order
    spans = read.records.select(
        pl.int_ranges("line", pl.col("line") + pl.col("line_count")).alias("l")
    ).explode("l")["l"]
    assert spans.is_unique().all()
    assert set(spans.to_list()).isdisjoint(read.unparsed["line"].to_list())
    assert read.records["line"].is_sorted()
    return read


def read(path: Path | str, **kwargs) -> LogRead:
    return accounted(read_log(path, **kwargs))


def parse(data: bytes, name: str = "mem.log") -> LogRead:
    return accounted(read_log_bytes(data, name))


def lines_of(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


# ---------------------------------------------------------------------------------------------
# rich's folding (rich/_wrap.py divide_line, Text.wrap, the DstackRichHandler grid), for
# single-cell characters: analyzer.synth.rich_fold. It built the *.rich80.log fixtures and
# reproduces every 120-column capture byte for byte (test below).


def rich_render(records: list[tuple[str, str, str]], width: int) -> list[str]:
    """(HH:MM:SS, level, message column text) -> the lines rich prints at this width."""
    lines: list[str] = []
    last = None
    for tod, level, text in records:
        stamp = f"[{tod}]"
        shown = " " * 10 if stamp == last else stamp
        last = stamp
        for i, piece in enumerate(rich_fold(text, width - 20)):
            head = f"{shown} {level:<8} " if i == 0 else " " * 20
            lines.append((head + piece).ljust(width))
    return lines


def _linenos(rich_log: Path) -> list[str]:
    pattern = re.compile(r"^(?:\[\d\d:\d\d:\d\d\]| {10}) \S+\s+\S+?:(\d+) ")
    return [m.group(1) for line in rich_log.read_text().splitlines() if (m := pattern.match(line))]


def _rich_rows(records: pl.DataFrame, linenos: list[str]) -> list[tuple[str, str, str]]:
    return [
        (tod.strftime("%H:%M:%S"), level, f"{logger}:{lineno} {message}")
        for tod, level, logger, message, lineno in zip(
            records["time_of_day"],
            records["level"],
            records["logger"],
            records["message"],
            linenos,
            strict=True,
        )
    ]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# ---------------------------------------------------------------------------------------------
# the real captures


@needs_captures
@pytest.mark.parametrize("path", CAPTURE_LOGS, ids=_ids(CAPTURE_LOGS))
def test_capture_log_parses_completely(path: Path) -> None:
    result = read(path)
    assert result.unparsed.height == 0
    assert result.damage == []
    assert result.wrapper is None
    standard = path.parent / "server-info.standard.log"
    if "warning" in path.name:
        expected = len(path.read_text().splitlines())
    else:
        expected = len(standard.read_text().splitlines())
    assert result.records.height == expected
    if expected:
        assert result.format == path.name.split(".")[1]
    if result.format == "rich":
        assert result.rich_width == 120
        assert result.records["local_time"].null_count() == result.records.height
        assert (result.records["day_offset"] == 0).all()
    else:
        assert result.rich_width is None
        assert result.records["day_offset"].null_count() == result.records.height
    assert result.records["time_of_day"].null_count() == 0


@needs_captures
@pytest.mark.parametrize("logs", CAPTURE_DIRS, ids=_ids(CAPTURE_DIRS))
def test_capture_formats_hold_the_same_records(logs: Path) -> None:
    standard = read(logs / "server-info.standard.log").records
    as_json = read(logs / "server-info.json.log").records
    rich = read(logs / "server-info.rich.log").records
    for column in ("level", "logger", "message", "local_time", "time_of_day"):
        assert as_json[column].to_list() == standard[column].to_list(), column
    assert rich["level"].to_list() == standard["level"].to_list()
    assert rich["logger"].to_list() == standard["logger"].to_list()
    seconds = [t.replace(microsecond=0) for t in standard["time_of_day"].to_list()]
    assert rich["time_of_day"].to_list() == seconds
    pairs = list(zip(standard["message"], rich["message"], strict=True))
    # any difference could only be whitespace at a fold; on the captures there is none
    assert all(_squash(a) == _squash(b) for a, b in pairs)
    assert [b for a, b in pairs if a != b] == []


@needs_captures
def test_capture_empty_warning_file() -> None:
    path = CAPTURES / "v0.22.5" / "seed" / "logs" / "server-warning.standard.log"
    result = read(path)
    assert (result.records.height, result.lines_total, result.format) == (0, 0, None)
    assert result.damage == []
    assert not sniff_log(path.read_bytes())


def test_empty_input(tmp_path: Path) -> None:
    empty = tmp_path / "server-warning.standard.log"
    empty.write_bytes(b"")
    result = read(empty)
    assert (result.records.height, result.lines_total, result.lines_irrelevant) == (0, 0, 0)
    assert result.format is None and result.wrapper is None and result.damage == []
    assert result.path == str(empty)


@needs_captures
def test_fold_helper_reproduces_the_real_rich_captures() -> None:
    for logs in CAPTURE_DIRS:
        standard = read(logs / "server-info.standard.log").records
        linenos = _linenos(logs / "server-info.rich.log")
        expected = (logs / "server-info.rich.log").read_text().splitlines()
        assert rich_render(_rich_rows(standard, linenos), 120) == expected, logs


@needs_captures
@pytest.mark.parametrize("version", ["v0.22.5", "v0.19"])
def test_rich80_fixtures_are_the_fold_of_the_captures(version: str) -> None:
    logs = CAPTURES / version / "multi-replica-crash" / "logs"
    standard = read(DATA / f"{version}-multi-replica-crash.standard.log").records
    rows = _rich_rows(standard, _linenos(logs / "server-info.rich.log"))
    assert rich_render(rows, 80) == lines_of(f"{version}-multi-replica-crash.rich80.log")


# ---------------------------------------------------------------------------------------------
# rich


@pytest.mark.parametrize("version", ["v0.22.5", "v0.19"])
def test_rich80_stitches_back_to_the_standard_records(version: str) -> None:
    standard = read(DATA / f"{version}-multi-replica-crash.standard.log").records
    rich = read(DATA / f"{version}-multi-replica-crash.rich80.log")
    assert (rich.format, rich.rich_width, rich.unparsed.height) == ("rich", 80, 0)
    assert rich.records.height == standard.height
    assert rich.records["logger"].to_list() == standard["logger"].to_list()
    assert rich.records["level"].to_list() == standard["level"].to_list()
    assert rich.records["message"].to_list() == standard["message"].to_list()
    seconds = [t.replace(microsecond=0) for t in standard["time_of_day"].to_list()]
    assert rich.records["time_of_day"].to_list() == seconds
    assert (rich.records["line_count"] > 1).any()


def test_rich80_mid_word_fold_and_blank_repeated_times() -> None:
    lines = lines_of("v0.22.5-multi-replica-crash.rich80.log")
    records = read(DATA / "v0.22.5-multi-replica-crash.rich80.log").records
    cut = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("jobs_runni")]
    assert cut, "the fixture must fold a logger name mid-word"
    folded = records.filter(pl.col("line").is_in(cut))
    assert folded.height == len(cut)
    assert set(folded["logger"]) == {
        "dstack._internal.server.background.pipeline_tasks.jobs_running"
    }
    assert (
        folded["message"].str.contains(r"^job\([0-9a-f]{6}\)\S+: non-zero exit status \d+$").all()
    )
    blank_time = [i + 1 for i, line in enumerate(lines) if line.startswith(" " * 11 + "INFO")]
    assert blank_time
    carried = records.filter(pl.col("line").is_in(blank_time))
    assert carried["time_of_day"].null_count() == 0


def test_rich_with_trailing_spaces_stripped() -> None:
    source = DATA / "v0.22.5-multi-replica-crash.rich80.log"
    stripped = "".join(line.rstrip() + "\n" for line in source.read_text().splitlines())
    result = parse(stripped.encode())
    expected = read(source).records
    assert result.rich_width is not None and result.rich_width <= 80
    assert result.records["message"].to_list() == expected["message"].to_list()
    assert result.records["logger"].to_list() == expected["logger"].to_list()


def test_rich_with_ansi_colour() -> None:
    pattern = re.compile(r"^(\[\d\d:\d\d:\d\d\]| {10}) (\S+)( +)(\S+?)(:\d+)(.*)$")
    coloured = []
    for line in lines_of("v0.22.5-multi-replica-crash.rich80.log"):
        m = pattern.match(line)
        if m:
            line = (
                f"\x1b[2;36m{m[1]}\x1b[0m \x1b[34m{m[2]}\x1b[0m{m[3]}"
                f"\x1b]8;id=1;file:///x.py\x1b\\\x1b[2m{m[4]}\x1b[0m\x1b]8;;\x1b\\{m[5]}{m[6]}"
            )
        coloured.append(line)
    result = parse(("\n".join(coloured) + "\n").encode())
    expected = read(DATA / "v0.22.5-multi-replica-crash.rich80.log").records
    assert result.rich_width == 80
    assert result.records.drop("file").equals(expected.drop("file"))


def test_rich_midnight_rollover_and_clock_step_back() -> None:
    path = DATA / "midnight.rich80.log"
    result = read(path)
    records = result.records
    assert records["day_offset"].to_list() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    assert [t.strftime("%H:%M:%S") for t in records["time_of_day"]] == [
        "23:59:58", "23:59:58", "23:59:59", "00:00:01", "00:00:01", "00:00:00",
        "00:00:02", "00:40:00", "12:00:00", "01:00:00", "01:00:00", "01:00:07",
    ]  # fmt: skip
    assert records["local_time"].null_count() == records.height
    step_back = records["line"][5]
    assert result.damage == [f"clock went backwards at {path}:{step_back}"]


def test_rich_damaged_line_breaks_only_its_record() -> None:
    lines = lines_of("v0.22.5-multi-replica-crash.rich80.log")
    clean = read(DATA / "v0.22.5-multi-replica-crash.rich80.log").records
    # line 2 continues record 1 (lines 1-3); put junk there
    assert lines[1].startswith(" " * 20) and lines[2].startswith(" " * 20)
    assert not lines[3].startswith(" " * 20)
    damaged = [lines[0], "\x00\x07garbage from a bad disk", *lines[2:]]
    result = parse(("\n".join(damaged) + "\n").encode())
    assert result.unparsed["line"].to_list() == [2, 3]
    assert result.records.height == clean.height
    assert result.records["line_count"][0] == 1
    assert result.records["message"][1:].to_list() == clean["message"][1:].to_list()
    assert any("NUL" in note for note in result.damage)


# ---------------------------------------------------------------------------------------------
# standard / json specifics


def test_traceback_in_the_three_formats() -> None:
    standard = read(DATA / "traceback.standard.log")
    as_json = read(DATA / "traceback.json.log")
    rich = read(DATA / "traceback.rich80.log")
    assert standard.records["line_count"].to_list() == [1, 14, 1, 1]
    assert as_json.records["line_count"].to_list() == [1, 1, 1, 1]
    error = standard.records.row(1, named=True)
    assert error["level"] == "ERROR"
    assert error["message"].count("\n") == 13
    assert "\n\nThe above exception was the direct cause" in error["message"]
    assert error["message"].endswith("RuntimeError: job processing failed")
    for other in (as_json, rich):
        assert other.records["message"].to_list() == standard.records["message"].to_list()
        assert other.records["level"].to_list() == standard.records["level"].to_list()
        assert other.unparsed.height == 0


def test_standard_blank_lines_after_a_record_are_irrelevant() -> None:
    lines = lines_of("v0.22.5-multi-replica-crash.standard.log")[:3]
    data = f"{lines[0]}\n\n   \n{lines[1]}\n{lines[2]}\n\n".encode()
    result = parse(data)
    assert result.records["line_count"].to_list() == [1, 1, 1]
    assert (result.lines_irrelevant, result.lines_total) == (3, 6)


@pytest.mark.parametrize(
    ("name", "logo_lines", "logger"),
    [
        ("startup-old-logo.rich80.log", 11, None),
        ("startup.standard.log", 6, "dstack._internal.server.app"),
        ("startup.json.log", 6, "dstack._internal.server.app"),
    ],
)
def test_startup_logo_and_lines(name: str, logo_lines: int, logger: str | None) -> None:
    result = read(DATA / name)
    assert result.lines_irrelevant == logo_lines
    assert result.unparsed.height == 0
    assert result.records.height == 9
    startup = result.records.head(4)
    assert startup["logger"].to_list() == [logger] * 4
    assert startup["message"][2] == "The admin token is 00000000-0000-4000-8000-000000000000"
    applying = startup["message"][0]
    if name.endswith("rich80.log"):
        assert applying == "Applying ~/.dstack/server/config.yml..."  # markup rendered away
    else:
        assert applying.startswith("Applying [link=file://")
    assert (result.records["logger"][4:] == "dstack._internal.server.services.backends").all()


def test_mixed_formats_in_one_capture() -> None:
    result = read(DATA / "mixed-restart.log")
    assert result.records["format"].to_list() == ["standard"] * 6 + ["json"] * 4
    assert result.format == "standard"
    assert result.lines_irrelevant == 6  # the logo and the blank line after it
    assert result.unparsed.height == 0
    assert result.damage == ["mixed formats: 4 json, 6 standard records"]


def test_json_fields_whatever_the_key_order_or_spacing() -> None:
    """dstack's own key order is cut at its separators, any other layout is searched: both
    give the same fields (a value with an escape or outside ASCII included)."""
    objects = [
        {
            "timestamp": "2026-11-04 10:39:14,469",
            "logger": logger,
            "level": "INFO",
            "message": "run(2d0e5d)svc: now is running",
        }
        for logger in ("dstack._internal.server.services.runs", "dstack.t\u00e9st", 'q"uote')
    ]
    layouts = [
        [json.dumps(o, ensure_ascii=False) for o in objects],  # dstack's (json_ensure_ascii=False)
        [json.dumps(o) for o in objects],
        [json.dumps(dict(reversed(o.items()))) for o in objects],
        [json.dumps(o, separators=(",", ":")) for o in objects],
    ]
    for number, lines in enumerate(layouts):
        records = parse(("\n".join(lines) + "\n").encode()).records
        # a value outside ASCII is read as written; one with an escape is not read
        written = "dstack.t\u00e9st" if number == 0 else None
        assert records["logger"].to_list() == [objects[0]["logger"], written, None], lines
        assert records["level"].to_list() == ["INFO"] * 3
        assert records["local_time"].to_list() == [datetime(2026, 11, 4, 10, 39, 14, 469000)] * 3


def test_json_exc_info_and_escapes() -> None:
    objects = [
        {
            "timestamp": "2026-11-04 10:39:14,469",
            "logger": "dstack._internal.server.services.runs",
            "level": "ERROR",
            "message": 'run(2d0e5d)svc: "quoted" \\ back\tslash \u00e9 \U0001f600',
            "exc_info": "Traceback (most recent call last):\nValueError: x",
        },
        {"timestamp": "2026-11-04 10:39:15,000", "level": "INFO", "message": "no logger"},
    ]
    data = "".join(json.dumps(o) + "\n" for o in objects).encode()
    records = parse(data).records
    assert records["message"].to_list() == [
        objects[0]["message"] + "\n" + objects[0]["exc_info"],
        "no logger",
    ]
    assert records["logger"].to_list() == ["dstack._internal.server.services.runs", None]
    assert records["local_time"][0] == datetime(2026, 11, 4, 10, 39, 14, 469000)
    assert records["time_of_day"][0] == time(10, 39, 14, 469000)


def test_json_message_sliced_or_parsed_alike() -> None:
    """A line of dstack's own layout with nothing JSON escapes has its message sliced off;
    the others go through the JSON parser: each message is what json.loads reads, and a line
    that is no JSON (a raw control character, text after the object) is no record."""
    head = '{"timestamp": "2026-11-04 10:39:14,469", "logger": "dstack.x", "level": "INFO", '
    valid = [
        "run(2d0e5d)svc: now is running",
        "caf\u00e9 \u2028 \x7f {}[]:, 'single'",
        '"quoted"',
        "back\\slash",
        "",
    ]
    lines = [head + '"message": ' + json.dumps(m, ensure_ascii=False) + "}" for m in valid]
    invalid = [
        head + '"message": "tab\there"}',
        head + '"message": "after"} x',
        head + '"message": "no end"',
    ]
    result = parse(("\n".join(lines + invalid) + "\n").encode())
    assert result.records["message"].to_list() == valid
    assert result.records["format"].to_list() == ["json"] * len(valid)
    assert result.unparsed["line"].to_list() == [6, 7, 8]


def test_json_time_with_a_comma_or_a_dot() -> None:
    """python logging's `,mmm` and another writer's `.mmm` read alike; a stamp that is no
    such time makes no record."""
    stamps = ["2026-11-04 10:39:14,469", "2026-11-04 10:39:14.469", "2026-11-04 10:39:14,46"]
    data = "".join(
        json.dumps({"timestamp": stamp, "logger": "dstack.x", "level": "INFO", "message": "m"})
        + "\n"
        for stamp in stamps
    )
    result = parse(data.encode())
    assert result.records["local_time"].to_list() == [datetime(2026, 11, 4, 10, 39, 14, 469000)] * 2
    assert result.unparsed["line"].to_list() == [3]


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.text(alphabet="ab\n", max_size=300).map(str.encode),
        st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"\n")),
    ),
    block=st.integers(min_value=1, max_value=50),
    chunk=st.integers(min_value=1, max_value=120),
    limit=st.integers(min_value=1, max_value=40),
)
def test_line_chunks_are_the_lines_with_long_ones_stood_in_for(data, block, chunk, limit):
    """Whatever the blocks (each under the limit): the chunks joined are the bytes read with
    each line over the limit replaced by its stand-in, every chunk but the last ends at a line
    break and holds at least CHUNK_BYTES, and `ends` says whether the bytes ended with one."""
    ends: list[bool] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(log_lines, "MAX_LINE_BYTES", limit)
        patch.setattr(log_lines, "CHUNK_BYTES", chunk)
        block = min(block, limit)  # as BLOCK_BYTES is under MAX_LINE_BYTES
        blocks = [data[i : i + block] for i in range(0, len(data), block)]
        chunks = list(log_lines.line_chunks(blocks, ends))
        texts = [line.removesuffix(b"\n") for line in data.splitlines(keepends=True)]
        expected = b"".join(
            (log_lines._overlong(len(text)) if len(text) > limit else text) + b"\n"
            for text in texts
        ).removesuffix(b"" if data.endswith(b"\n") else b"\n")
    assert b"".join(chunks) == expected
    assert all(c.endswith(b"\n") and len(c) >= chunk for c in chunks[:-1])
    assert ends == [data.endswith(b"\n")]


def test_crlf_line_endings() -> None:
    source = DATA / "v0.19-multi-replica-crash.standard.log"
    crlf = source.read_bytes().replace(b"\n", b"\r\n")
    result = parse(crlf)
    expected = read(source).records
    assert result.records.drop("file").equals(expected.drop("file"))


def test_huge_line() -> None:
    line = lines_of("v0.22.5-multi-replica-crash.standard.log")[0]
    huge = line + " " + "x" * 1_000_000
    junk = "y" * 1_000_000
    result = parse(f"{huge}\n{line}\n\x01{junk}\n".encode())
    assert result.records["message"].str.len_chars().to_list()[0] > 1_000_000
    assert result.records.height == 2
    assert result.unparsed["line"].to_list() == [3]


# ---------------------------------------------------------------------------------------------
# damage


def test_invalid_utf8() -> None:
    lines = (DATA / "v0.22.5-multi-replica-crash.standard.log").read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"Emitting", b"Emit\xff\xfeting")
    result = parse(b"\n".join(lines))
    assert result.records.height == 67
    assert "Emit\ufffd\ufffdting" in result.records["message"][3]
    assert result.damage == ["invalid UTF-8 on 1 lines (decoded with replacement characters)"]


def test_damaged_lines_in_the_middle_of_a_standard_log() -> None:
    lines = lines_of("v0.22.5-multi-replica-crash.standard.log")
    cut_record = lines[9][:20]  # a record cut while being written, the next one glued below
    damaged = [*lines[:9], cut_record, *lines[10:20], "\x00\x00\x00\x9c\x03binary", *lines[20:]]
    result = parse("\n".join(damaged).encode())
    assert result.unparsed["line"].to_list() == [10, 21]
    assert result.unparsed["text"][0] == cut_record
    assert result.records.height == len(lines) - 1
    assert (result.records["line_count"] == 1).all()
    assert "NUL bytes on 1 lines" in result.damage


def test_gzip_and_truncated_gzip(tmp_path: Path) -> None:
    source = DATA / "v0.22.5-multi-replica-crash.standard.log"
    full = read(source).records
    packed = gzip.compress(source.read_bytes())
    whole = tmp_path / "server.log.1.gz"
    whole.write_bytes(packed)
    result = read(whole)
    assert result.damage == []
    assert result.path == str(whole)
    assert result.records.drop("file").equals(full.drop("file"))

    cut = tmp_path / "server.log.2.gz"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    partial = read(cut)
    assert len(partial.damage) == 1
    assert re.fullmatch(r"truncated gzip stream after \d+ lines", partial.damage[0])
    assert 0 < partial.records.height < full.height
    n = partial.records.height - 1  # the last record may be cut mid-line
    assert partial.records["message"][:n].to_list() == full["message"][:n].to_list()


def test_not_really_gzip() -> None:
    result = parse(b"\x1f\x8bthis is not a gzip stream\nsecond line\n")
    assert result.records.height == 0
    assert result.unparsed.height == 2
    assert result.damage and "gzip" in result.damage[0]


def test_rotated_set(tmp_path: Path) -> None:
    lines = (DATA / "v0.22.5-multi-replica-crash.standard.log").read_bytes().split(b"\n")[:-1]
    chunks = [lines[0:10], lines[10:20], lines[20:30], lines[30:40], lines[40:]]
    names = ["server.log.10.gz", "server.log.2.gz", "server.log.1", "server.log"]
    members = [tmp_path / name for name in names]
    for member, chunk in zip(members, chunks[1:], strict=True):
        data = b"\n".join(chunk) + b"\n"
        member.write_bytes(gzip.compress(data) if member.suffix == ".gz" else data)
    (tmp_path / "server.log.bak").write_bytes(b"x\n")
    (tmp_path / "other.log.3").write_bytes(b"x\n")
    assert rotated_set(tmp_path / "server.log") == members
    reads = [read(member) for member in rotated_set(tmp_path / "server.log")]
    assert [r.path for r in reads] == [str(m) for m in members]
    messages = [m for r in reads for m in r.records["message"]]
    expected = read(DATA / "v0.22.5-multi-replica-crash.standard.log").records["message"]
    assert messages == expected[10:].to_list()
    assert rotated_set(tmp_path / "missing.log") == []


# ---------------------------------------------------------------------------------------------
# wrappers


def test_docker_timestamps_standard() -> None:
    result = read(DATA / "docker-timestamps.standard.log")
    assert (result.wrapper, result.format, result.unparsed.height) == ("docker", "standard", 0)
    records = result.records
    assert records.height == 12
    assert (records["wrapper"] == "docker").all()
    assert records["wrapper_time"][0] == datetime(2026, 11, 3, 14, 0, 0, 417, tzinfo=UTC)
    # line 6 was written with +01:00: same instant in UTC
    assert records["wrapper_time"][5] == datetime(2026, 11, 3, 14, 0, 41, 299422, tzinfo=UTC)
    unwrapped = "".join(
        line.split(" ", 1)[1] + "\n" for line in lines_of("docker-timestamps.standard.log")
    )
    plain = parse(unwrapped.encode()).records
    assert records.drop("file", "wrapper", "wrapper_time").equals(
        plain.drop("file", "wrapper", "wrapper_time")
    )


def test_docker_timestamps_rich() -> None:
    result = read(DATA / "docker-timestamps.rich80.log")
    assert (result.wrapper, result.format, result.rich_width) == ("docker", "rich", 80)
    plain = read(DATA / "v0.22.5-multi-replica-crash.rich80.log").records
    n = result.records.height - 1  # the excerpt may cut its last record
    assert result.records["message"][:n].to_list() == plain["message"][:n].to_list()
    assert result.records["wrapper_time"].null_count() == 0
    assert result.records["wrapper_time"][0] == datetime(2026, 11, 4, 10, 30, 17, 123456, UTC)


def test_journald() -> None:
    result = read(DATA / "journald.json")
    assert (result.wrapper, result.format, result.lines_total) == ("journald", "standard", 8)
    records = result.records
    assert records["line"].to_list() == [1, 2, 3, 4, 5, 6, 8]
    assert records["wrapper_time"][0] == datetime(2026, 11, 3, 14, 0, 0, 250, tzinfo=UTC)
    assert "adm\ufffdin" in records["message"][3]
    assert result.unparsed["line"].to_list() == [7]
    assert len(result.damage) == 2
    assert "invalid UTF-8 in 1 journal entries" in result.damage[0]
    assert "without a MESSAGE text" in result.damage[1]
    plain = lines_of("docker-timestamps.standard.log")[:8]
    expected = parse("".join(line.split(" ", 1)[1] + "\n" for line in plain).encode()).records
    keep = [0, 1, 2, 4, 5, 7]  # entry 4 has the damaged byte, entry 7 no MESSAGE
    assert records["message"].gather([0, 1, 2, 4, 5, 6]).to_list() == [
        expected["message"][i] for i in keep
    ]


def test_journald_ansi_rich() -> None:
    result = read(DATA / "journald-ansi.rich80.json")
    assert (result.wrapper, result.format, result.rich_width) == ("journald", "rich", 80)
    assert result.damage == []
    plain = read(DATA / "v0.22.5-multi-replica-crash.rich80.log").records
    n = result.records.height - 1  # the 10-line excerpt cuts its last record
    assert result.records["message"][:n].to_list() == plain["message"][:n].to_list()
    assert result.records["logger"].to_list() == plain["logger"][: n + 1].to_list()


# ---------------------------------------------------------------------------------------------
# entry points and sniffing


def test_read_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    data = (DATA / "v0.19-multi-replica-crash.standard.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    result = read("-")
    assert result.path == "-"
    assert result.records.height == 49
    assert (result.records["file"] == "-").all()


def test_display_path() -> None:
    result = read(DATA / "v0.19-multi-replica-crash.standard.log", display_path="evidence/a.log")
    assert result.path == "evidence/a.log"
    assert (result.records["file"] == "evidence/a.log").all()


@pytest.mark.parametrize("path", sorted(DATA.glob("*.log")) + sorted(DATA.glob("*.json")))
def test_sniff_fixtures(path: Path) -> None:
    head = path.read_bytes()
    assert sniff_log(head[:65536])
    assert sniff_log(gzip.compress(head)[:4096])


def test_sniff_rejects_other_files() -> None:
    assert not sniff_log(b"")
    assert not sniff_log(b"\n\n")
    assert not sniff_log(b"SQLite format 3\x00" + bytes(range(256)) * 4)
    assert not sniff_log(b"id,name,status\n1,web,RUNNING\n")
    assert not sniff_log(json.dumps({"runs": [{"run_name": "web"}]}, indent=2).encode())
    line = lines_of("v0.19-multi-replica-crash.standard.log")[0]
    document = "# notes\n\n" + "".join(f"prose line {i}\n" for i in range(20)) + line + "\n"
    assert not sniff_log(document.encode())
    if REFERENCE.is_file():
        assert not sniff_log(REFERENCE.read_bytes()[:65536])


@needs_captures
def test_sniff_captures() -> None:
    for path in CAPTURE_LOGS:
        assert sniff_log(path.read_bytes()[:65536]) == (path.stat().st_size > 0), path
    for truth in CAPTURES.glob("*/*/truth.json"):
        assert not sniff_log(truth.read_bytes()[:65536])
    for table in list(CAPTURES.glob("*/*/tables/*.csv"))[:20]:
        assert not sniff_log(table.read_bytes()[:65536])
    for db in CAPTURES.glob("*/*/server.db"):
        assert not sniff_log(db.read_bytes()[:65536])


def _parsed_as_log(head: bytes, monkeypatch: pytest.MonkeyPatch) -> bool:
    """What sniff_log decides by parsing the head, without its byte-level pre-check."""
    with monkeypatch.context() as patched:
        patched.setattr(reader, "_may_be_log", lambda head: True)
        return sniff_log(head)


def test_pre_check_never_rejects_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every head the parse takes for a log passes the pre-check: from the file's start and
    from the middle of it (a rotated file begins anywhere, a traceback line first)."""
    checked = 0
    for place, head in _heads(fixture_starts=12, capture_starts=2):
        if _parsed_as_log(head, monkeypatch):
            assert reader._may_be_log(head), place
            checked += 1
    assert checked > 100


def _heads(fixture_starts: int, capture_starts: int) -> Iterator[tuple[tuple[Path, int], bytes]]:
    """Each fixture's and capture's log heads (64 KB) from its start and from `*_starts`
    places in the middle (a rotated file begins anywhere, a traceback line first)."""
    fixtures = sorted(DATA.glob("*.log")) + sorted(DATA.glob("*.json"))
    captures = CAPTURE_LOGS + sorted(p for d in CAPTURE_DIRS for p in d.glob("*.gz"))
    for path in fixtures + captures:
        data = path.read_bytes()
        if data.startswith(b"\x1f\x8b"):
            data = gzip.decompress(data)
        starts = fixture_starts if path in fixtures else capture_starts
        for start in (0, *range(1, len(data), max(1, len(data) // starts))):
            yield (path, start), data[start : start + 65536]


def test_pre_check_rejects_documents_tables_and_databases() -> None:
    assert not reader._may_be_log(json.dumps({"runs": [{"run_name": "web"}]}, indent=2).encode())
    assert not reader._may_be_log(b'[{"project_id":"af18","status":"failed"}]')
    assert not reader._may_be_log(b"id,name,status,termination_reason\n1,web,FAILED,ERROR\n")
    assert not reader._may_be_log(b"SQLite format 3\x00" + bytes(range(256)) * 4)
    assert not reader._may_be_log(b" NAME    BACKEND    STATUS\n web     aws        failed\n")
    quoted = json.dumps({"log_tail": "     _     _             _\n[09:14:00] WARNING  x"}, indent=1)
    assert not reader._may_be_log(quoted.encode())  # a manifest quoting a log's lines


# ---------------------------------------------------------------------------------------------
# properties

REAL_STANDARD = lines_of("v0.22.5-multi-replica-crash.standard.log") + lines_of(
    "v0.19-multi-replica-crash.standard.log"
)
REAL_OTHER = (
    lines_of("traceback.json.log")
    + lines_of("v0.22.5-multi-replica-crash.rich80.log")[:40]
    + lines_of("traceback.standard.log")[2:8]
    + lines_of("startup.standard.log")[:6]
)
_STD_LINE = re.compile(r"^(\S+) (\S+) (\S+) (.*)$")
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    st.lists(st.sampled_from([*REAL_STANDARD, *REAL_OTHER, "", "prose", "{", "  x"]), max_size=8)
)
def test_pre_check_holds_for_any_mix_of_lines(picked: list[str]) -> None:
    head = "".join(line + "\n" for line in picked).encode()
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(reader, "_may_be_log", lambda head: True)
        parsed = sniff_log(head)
    assert not parsed or reader._may_be_log(head)


def test_certain_heads_are_logs() -> None:
    """A head ``certainly_log`` takes for a log without parsing it is one the parse takes for
    a log too: every fixture and capture, from its start and from the middle."""
    certain = 0
    for place, head in _heads(fixture_starts=4, capture_starts=4):
        if reader.certainly_log(head):
            assert sniff_log(head), place
            certain += 1
    assert certain > 10


def test_certainty_needs_records_by_their_first_characters() -> None:
    """Only ASCII standard starts with a real time, whole plain json records and the lines of
    rich records opening with ``logger:lineno`` count: anything else (a 29 February, a line
    ending in CR, a wrapper's prefix, a rich record without dstack's logger, an escape, a line
    not ASCII) leaves the decision to the parse."""
    standard = REAL_STANDARD[0]
    plain_json = (
        '{"timestamp": "2026-10-01 00:00:00,000", "logger": "dstack._internal.server.app", '
        '"level": "INFO", "message": "The dstack server 0.20.3 is running at http://x"}'
    )
    assert reader.certainly_log(f"{standard}\nprose\n\n".encode())
    assert reader.certainly_log(f"{plain_json}\nprose\n".encode())
    assert not reader.certainly_log(f"{standard}\nprose\nprose\n".encode())  # under half
    rich = lines_of("v0.22.5-multi-replica-crash.rich80.log")[:3]  # a record of three lines
    for head in (f"{rich[0]}\nprose\n", f"{rich[0]}\n{rich[1]}\n{rich[2]}\nprose\nprose\n"):
        assert reader.certainly_log(head.encode()) and sniff_log(head.encode())
    assert not reader.certainly_log(f"{rich[0]}\nprose\n{rich[1]}\nprose\n".encode())
    journal_key = " " * 20 + '{"__REALTIME_TIMESTAMP": "1"}'  # an indented line may be an entry
    assert not reader.certainly_log(f"{rich[0]}\n{journal_key}\n".encode())
    leap_day = re.sub(r"\d{4}-\d\d-\d\d", "2024-02-29", standard, count=1)
    uncertain = [
        leap_day,
        " ".join(standard.split(" ")[:3]) + "\r",  # a CR where the logger ends
        "2026-10-01T00:00:00.000000000Z " + standard,  # docker's prefix
        "[10:30:00] INFO     Emitting event: User created.",  # a rich record without a logger
        "[24:00:00] INFO     dstack._internal.server.app:1 at no time of day",
        " " * 10 + " INFO     dstack._internal.server.app:1",  # nothing after the logger
        "\x1b[32m" + standard,
        standard + " é",
        plain_json.replace("http://x", 'say \\"x\\"'),  # an escape: parsed, not sliced
    ]
    for line in uncertain:
        assert not reader.certainly_log(f"{line}\n".encode()), line
    assert sniff_log(f"{leap_day}\n".encode())  # the parse decides
    assert sniff_log(f"{uncertain[1]}\n".encode())


@PROPERTY
@given(
    st.lists(
        st.sampled_from(
            [
                *REAL_STANDARD,
                *REAL_OTHER,
                *lines_of("startup.json.log"),
                *(f"2026-10-01T00:00:00Z {line}" for line in REAL_STANDARD[:5]),
                *lines_of("journald.json")[:5],
                "",
                "prose",
                "{",
                "  x",
                " " * 20 + "x",
                " " * 20 + '{"__REALTIME_TIMESTAMP": "1", "MESSAGE": "x"}',
            ]
        ),
        max_size=8,
    )
)
def test_certainty_holds_for_any_mix_of_lines(picked: list[str]) -> None:
    head = "".join(line + "\n" for line in picked).encode()
    assert not reader.certainly_log(head) or sniff_log(head)


@PROPERTY
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    parse(data)
    sniff_log(data)


_element = st.one_of(
    st.sampled_from(REAL_STANDARD).map(lambda line: ("standard", line.encode())),
    st.sampled_from(REAL_OTHER).map(lambda line: ("other", line.encode())),
    st.binary(max_size=80).map(lambda junk: ("junk", junk)),
    st.just(("junk", b"")),
)


@PROPERTY
@given(st.lists(_element, max_size=40))
def test_shuffled_real_lines_with_junk(elements: list[tuple[str, bytes]]) -> None:
    data = b"\n".join(chunk for _, chunk in elements)
    result = parse(data)
    by_line = {row["line"]: row for row in result.records.iter_rows(named=True)}
    line = 1
    for kind, chunk in elements:
        if kind == "standard":
            level, stamp, logger, message = _STD_LINE.match(chunk.decode()).groups()
            record = by_line[line]
            assert (record["format"], record["level"], record["logger"]) == (
                "standard",
                level,
                logger,
            )
            assert record["local_time"] == datetime.fromisoformat(stamp)
            assert record["message"].split("\n")[0] == message
        line += chunk.count(b"\n") + 1


_RECORDS = read_log(DATA / "v0.22.5-multi-replica-crash.standard.log").records


@PROPERTY
@given(
    width=st.integers(min_value=40, max_value=220),
    picks=st.lists(st.integers(min_value=0, max_value=_RECORDS.height - 1), min_size=1),
)
def test_rich_refold_at_any_width(width: int, picks: list[int]) -> None:
    records = _RECORDS[picks]
    rows = _rich_rows(records, [str(100 + i) for i in picks])
    result = parse(("\n".join(rich_render(rows, width)) + "\n").encode())
    assert result.rich_width == width and result.unparsed.height == 0
    assert result.records["logger"].to_list() == records["logger"].to_list()
    got = result.records["message"].to_list()
    assert [_squash(m) for m in got] == [_squash(m) for m in records["message"]]


@PROPERTY
@given(st.binary(max_size=400))
def test_line_splitting_matches_python(body: bytes) -> None:
    """The fast CSV-reader split (strict UTF-8 or with replacement) and the fallback agree
    with plain Python splitting; the strict one reads only what is UTF-8, and split_lines says
    the UTF-8 was bad exactly when it was."""
    text = body.decode("utf-8", errors="replace")
    expected = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
    assert split_text(body).to_list() == expected
    fast = split_with_csv_reader(body)
    strict = split_with_csv_reader(body, "utf8")
    if body and b"\x1f" not in body and not body.startswith((b"\xef\xbb\xbf", b"x", b"(\xb5/\xfd")):
        assert fast is not None and fast.to_list() == expected
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            assert strict is None
        else:
            assert strict is not None and strict.to_list() == expected
    else:
        assert fast is None and strict is None
    raw, invalid = log_lines.split_lines(body, False)
    assert raw.to_list() == (expected if body else [])
    assert invalid == (text.encode() != body)


# A busy server's lines that carry nothing for the audit (uvicorn's access log, as the server
# prints it through logging), and neighbours that must not be set aside with them.
_ACCESS = (
    'INFO {t} uvicorn.access 10.0.0.{i}:4100{i} - "POST /api/project/main/runs/list HTTP/1.1" 200'
)
_KEPT_NEIGHBOURS = (
    "INFO {t} uvicorn.access The admin token is 0a1b2c3d-planted",  # a secret, any logger
    "INFO {t} uvicorn.access run(abc123)web: now is RUNNING",  # a run line, any logger
    "INFO 2026-13-40T09:00:00.000 uvicorn.access no such time",  # not a record: unparsed
    "INFO 2024-02-29T09:00:00.000 uvicorn.access a leap day",  # a record the filter leaves
    "INFO 2026-11-02T09:59:60.000 uvicorn.access a leap second",  # a record (10:00:00)
    "INFO 2026-02-29T09:00:00.000 uvicorn.access no such day",  # not a record: unparsed
    "INFO \u0662\u0660\u0662\u0666-11-02T09:00:00.000 uvicorn.access Arabic-Indic digits",
    "INFO {t} uvicorn.access \x1b[31mcoloured\x1b[0m",  # cleaned in classification
    "INFO {t} \x1b[0m no logger once cleaned",  # a start only before cleaning
    "INFO {t} uvicorn.access GET /api/Service/list 200",  # a word: the full path, irrelevant
    "INFO {t} uvicorn.access\tGET /health 200",  # a tab ends the logger: no record's start
    "INFO {t} uvicorn.access\u00a0GET /health 200",  # so does a no-break space
    "INFO {t} uvicorn.access GET /health\u2003200",  # a start, an em space in its message
    "WARNING {t} dstack.web run(abc123)web: something new",  # dstack's: counted unrecognised
    "    continuation of the record above",
    "",
)


def _collected(
    data: bytes, chunk: int, monkeypatch, *, set_aside: bool, gathered: int = 1, width: int = 0
):
    with monkeypatch.context() as patch:
        patch.setattr(log_lines, "CHUNK_BYTES", chunk)
        patch.setattr(reader, "GATHERED_ROWS", gathered)
        if width:  # the lines a rich log's console width is measured on
            patch.setattr(reader, "WIDTH_SAMPLE_LINES", width)
        patch.setattr(quiet, "QUIET_SHARE", 1 << 30)  # every chunk, whatever its share
        stream = LogStream("x.log", matter_words=MATTER_WORDS if set_aside else ())
        collector = EventCollector("x.log", "server")
        aside_lines = 0
        blocks = [data[at : at + 97] for at in range(0, len(data), 97)]  # chunks end between
        for records, aside in stream.chunks(blocks):
            aside_lines += aside.height
            collector.add(records, aside)
    events, facts = collector.finish()
    return stream.result(), events, facts, aside_lines


# How the set-aside properties pad a real log: after every few lines, in chunks of a generated
# size (no record longer: none is cut), the kept lines of several chunks classified together
# or not.
_PADDED_LOG = {
    "every": st.integers(min_value=1, max_value=6),
    "chunk": st.integers(min_value=1_000, max_value=20_000),
    "gathered": st.sampled_from([1, 50, 20_000]),
}
_PADDED_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _neighbours(kinds: tuple[str, ...]):
    """Which of the lines that must stay go beside the padding, in turn."""
    return st.lists(st.integers(min_value=0, max_value=len(kinds) - 1), max_size=8)


def _padded(name: str, every: int, after, *, docker: bool = False) -> tuple[list[str], int]:
    """The seed's log `name` with `after(n, line)`'s lines after every `every`-th line (with
    `docker`: each line behind docker's timestamp, written at other times than the local ones),
    and how many times they were put in."""
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / name).read_text().splitlines()
    padded: list[str] = []
    for n, line in enumerate(real):
        padded.append(line)
        if n % every == 0:
            padded += after(n, line)
    if docker:
        padded = [
            f"2026-11-03T00:{n // 60 % 60:02d}:{n % 60:02d}.000000000Z {line}"
            for n, line in enumerate(padded)
        ]
    return padded, len(real) // every


def _assert_set_aside_changes_nothing(
    padded, chunk, monkeypatch, gathered, at_least, width: int = 0
) -> None:
    """At least `at_least` of the lines set aside, and every count, event (with its sequence
    number) and unparsed place as a full read of them gives."""
    data = ("\n".join(padded) + "\n").encode()
    full, full_events, full_facts, none_aside = _collected(
        data, chunk, monkeypatch, set_aside=False, width=width
    )
    read, events, facts, aside = _collected(
        data, chunk, monkeypatch, set_aside=True, gathered=gathered, width=width
    )
    assert none_aside == 0 and aside >= at_least
    assert facts == full_facts
    assert_frame_equal(events, full_events)
    assert_frame_equal(read.unparsed, full.unparsed)
    for name in ("lines_total", "lines_irrelevant", "record_count", "format", "damage"):
        assert getattr(read, name) == getattr(full, name), name


@needs_captures
@_PADDED_SETTINGS
@given(neighbours=_neighbours(_KEPT_NEIGHBOURS), **_PADDED_LOG)
def test_setting_irrelevant_lines_aside_changes_no_count_event_or_place(
    monkeypatch, every, neighbours, chunk, gathered
):
    """The real standard log with access lines after every few lines (and lines that must stay
    beside them), in generated chunk sizes: the lines set aside before classification (the
    kept lines of several chunks classified together, or not) leave every count, event (with
    its sequence number) and unparsed place as a full read gives."""

    def after(n: int, line: str) -> list[str]:
        t = line.split(" ")[1] if line.startswith("INFO ") else "2026-11-02T09:00:00.000"
        lines = [_ACCESS.format(t=t, i=i) for i in range(3)]
        if neighbours:
            lines.append(_KEPT_NEIGHBOURS[neighbours[n % len(neighbours)]].format(t=t))
        return lines

    padded, at_least = _padded("server-info.standard.log", every, after)
    _assert_set_aside_changes_nothing(padded, chunk, monkeypatch, gathered, at_least)


# The same in dstack's json layout (python-json-logger): uvicorn's access line JSON-escapes the
# quotes around its request, and the neighbours a json line may be.
_JSON_LINE = '{{"timestamp": "{t}", "logger": "{logger}", "level": "{level}", "message": "{m}"}}'
# (lines with "{t}" and "{i}" left in, put in by str.replace: the json braces stay as they are)
_JSON_ACCESS = _JSON_LINE.format(
    t="{t}", logger="uvicorn.access", level="INFO", m=r"10.0.0.{i}:4100{i} - \"GET /api/x\" 200"
)
_JSON_KEPT_NEIGHBOURS = (
    *(
        _JSON_LINE.format(t=t, logger=logger, level=level, m=m)
        for t, logger, level, m in (
            ("{t}", "uvicorn.access", "INFO", "The admin token is 0a1b2c3d-planted"),
            ("{t}", "uvicorn.access", "INFO", "run(abc123)web: now is RUNNING"),
            ("{t}", "uvicorn.access", "INFO", r"\u0072un(abc123)web: now is RUNNING"),  # escaped
            ("{t}", "", "INFO", "GET /health 200"),  # no logger: counted as dstack's own
            ("{t}", "dstack.web", "WARNING", "something new"),  # dstack's: unrecognised
            ("{t}", "uvicorn.access", "INFO", "GET /api/Service/list 200"),  # a word
            ("{t}", "uvicorn.access", "INFO", r"two\nlines"),  # an escaped line break
            ("{t}", "uvicorn.access", "INFO", r"bad \q escape"),  # no JSON: unparsed
            ("{t}", "uvicorn.access", "NOTICE", r"C:\\logs\/x \"y\""),  # set aside
            ("{t}", "uvicorn.access", "", "no level"),  # set aside, of level ""
            ("2026-13-40 09:00:00,000", "uvicorn.access", "INFO", "no such time"),
            ("2024-02-29 09:00:00,000", "uvicorn.access", "INFO", "a leap day"),
            ("2026-02-29 09:00:00,000", "uvicorn.access", "INFO", "no such day"),
            ("2026-11-02 09:00:00.000", "uvicorn.access", "INFO", "a dot for the comma"),
        )
    ),
    '{"timestamp": "{t}", "logger": "uvicorn.access", "level": "INFO", "message": "x", '
    '"exc_info": "Traceback (most recent call last):"}',
    "INFO 2026-11-02T09:00:00.000 uvicorn.access a standard line among them",
    "    continuation of the record above",
    "",
)


def test_what_the_json_set_aside_reasons_on_holds() -> None:
    """A json line is set aside by the words of its text as written: none of MATTER_WORDS
    holds a character whose escape (a quote, a backslash, a slash) the line may hold."""
    assert not any(set(word) & set('"\\/') for word in MATTER_WORDS)


@needs_captures
@_PADDED_SETTINGS
@given(neighbours=_neighbours(_JSON_KEPT_NEIGHBOURS), docker=st.booleans(), **_PADDED_LOG)
def test_setting_irrelevant_json_lines_aside_changes_no_count_event_or_place(
    monkeypatch, every, neighbours, chunk, gathered, docker
):
    """The real json log with access lines after every few lines (and lines that must stay
    beside them), in generated chunk sizes, with docker's timestamps or without: the json
    lines set aside leave every count (per level, the latest time), event and unparsed place
    as a full read gives."""

    def after(n: int, line: str) -> list[str]:
        t = json.loads(line)["timestamp"]
        lines = [_JSON_ACCESS.replace("{t}", t).replace("{i}", str(i)) for i in range(3)]
        if neighbours:
            lines.append(_JSON_KEPT_NEIGHBOURS[neighbours[n % len(neighbours)]].replace("{t}", t))
        return lines

    padded, at_least = _padded("server-info.json.log", every, after, docker=docker)
    _assert_set_aside_changes_nothing(padded, chunk, monkeypatch, gathered, at_least)


# The same in the rich layout (dstack's default): a record's time printed only when it changes,
# every line padded to the console's width (the seed's: 120), long messages folded onto lines
# indented to the message column.
_RICH_WIDTH = 120
_RICH_ACCESS = '           INFO     uvicorn.access:476 10.0.0.{i}:4100{i} - "GET /api/x" 200'
_RICH_KEPT_NEIGHBOURS = (
    "           INFO     uvicorn.access:476 GET /api/Service/list 200",  # a word
    "           INFO     uvicorn.access:476 run(abc123)web: now is RUNNING",  # a run line
    "[09:30:00] INFO     uvicorn.access:476 GET /health 200",  # a printed time: the clock's
    "[08:00:00] INFO     uvicorn.access:476 GET /health 200",  # back more than an hour
    "[09:29:59] INFO     uvicorn.access:476 GET /health 200",  # back a second: a note
    "[25:00:00] INFO     uvicorn.access:476 no such time",  # no record's start
    "           INFO     GET /health 200",  # no logger:lineno, so no logger: dstack's own
    "           WARNING  dstack.web:12 something new",  # dstack's: unrecognised
    "           CRITICAL uvicorn.error:3 another level",  # set aside, of its level
    "           INFO     uvicorn.access:476 \x1b[31mcoloured\x1b[0m",  # cleaned first
    "           INFO     uvicorn.access:476\tGET /health 200",  # a tab after the logger
    "                    continued text of the record above",
    "INFO 2026-11-02T09:00:00.000 uvicorn.access a standard line among them",
    '{"timestamp": "2026-11-02 09:00:00,000", "logger": "uvicorn.access", "level": "INFO", '
    '"message": "a json line among them"}',
    "",
)


@needs_captures
@_PADDED_SETTINGS
@given(
    neighbours=_neighbours(_RICH_KEPT_NEIGHBOURS),
    width=st.sampled_from([1, 7, 40]),
    wide=st.booleans(),
    docker=st.booleans(),
    **_PADDED_LOG,
)
def test_setting_irrelevant_rich_lines_aside_changes_no_count_event_or_place(
    monkeypatch, every, neighbours, chunk, gathered, width, wide, docker
):
    """The real rich log with access lines of no printed time after every few lines (inside a
    record's folded lines too) and lines that must stay beside them, in generated chunk sizes
    and console-width samples, with docker's timestamps or without: the rich lines set aside
    leave every count, level, latest time, clock note, event and unparsed place as a full read
    gives; none of the lines the console's width is measured on is set aside (`wide`: the
    access lines are wider than the rest, so the width measured with them is theirs)."""

    def after(n: int, line: str) -> list[str]:
        access = _RICH_WIDTH + 10 if wide else _RICH_WIDTH
        lines = [_RICH_ACCESS.format(i=i).ljust(access) for i in range(3)]
        if neighbours:
            neighbour = _RICH_KEPT_NEIGHBOURS[neighbours[n % len(neighbours)]]
            lines.append(neighbour.ljust(_RICH_WIDTH) if neighbour[:1] in " [" else neighbour)
        return lines

    padded, at_least = _padded("server-info.rich.log", every, after, docker=docker)
    # the lines past the width's sample, less the last
    at_least = min(at_least, sum(1 for n in range(width, len(padded) - 1) if "4100" in padded[n]))
    _assert_set_aside_changes_nothing(padded, chunk, monkeypatch, gathered, at_least, width)


@pytest.mark.parametrize("gathered", [1, 20_000])
def test_a_record_open_at_a_chunk_end_after_set_aside_lines_goes_on(monkeypatch, gathered):
    """A traceback that a chunk's end cuts, after access lines set aside in that chunk, is held
    for the next chunk whole: its lines are the record's, none unparsed (the held record is
    found by its row; line numbers have gaps where lines were set aside)."""
    t = "2026-11-02T09:00:00.000"
    access = [_ACCESS.format(t=t, i=i) for i in range(40)]
    failure = [f"ERROR {t} dstack._internal.server job(abc123)web-0-0: boom"] + [
        f'  File "x.py", line {n}, in f' for n in range(30)
    ]
    first = [f"INFO {t} dstack._internal.server run(abc123)web: now is RUNNING"]
    data = ("\n".join(first + access + failure + access[:5]) + "\n").encode()
    chunk = len("\n".join(first + access + failure[:5]))
    full = _collected(data, chunk, monkeypatch, set_aside=False)[0]
    read, _, _, aside = _collected(data, chunk, monkeypatch, set_aside=True, gathered=gathered)
    assert aside >= 40 and read.unparsed.height == full.unparsed.height == 0
    assert read.record_count == full.record_count == 47


def _stamp(when: datetime) -> str:
    return (
        f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:"
        f"{when.second:02d}.{when.microsecond // 1000:03d}"
    )


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.tuples(
            st.sampled_from(layouts.LEVELS.split("|")),
            st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
        ),
        min_size=1,
        max_size=30,
    ),
    docker=st.booleans(),
    spaces=st.booleans(),
)
@example(
    lines=[
        ("INFO", datetime(2026, 11, 2, 9, 0, 1)),
        ("DEBUG", datetime(999, 1, 1)),
        ("INFO", datetime(2024, 2, 29, 23, 59, 59)),
        ("INFO", datetime(2026, 11, 2, 9, 0, 0, 999000)),
        ("INFO", datetime(2026, 11, 2, 9, 0, 0, 1000)),
        ("WARNING", datetime(9999, 12, 31, 23, 59, 59)),
    ],
    docker=False,
    spaces=False,
)
@example(
    lines=[("ERROR", datetime(2026, 12, 31, 12)), ("ERROR", datetime(2026, 4, 30))],
    docker=True,
    spaces=True,
)
def test_set_aside_lines_are_counted_and_timed_as_if_each_were_parsed(
    lines, docker, spaces
) -> None:
    """The pre-filter never parses a set-aside line's time: per level, its count and latest
    time (the docker timestamp where written, else the local time) are those of parsing every
    line; a 29 February (left to the classification) and the line before it stay. The same
    when the lines are known to hold no whitespace but the space (the shorter proof)."""
    raw = [f"{level} {_stamp(when)} uvicorn.access GET /health 200" for level, when in lines]
    raw.append("INFO 2026-01-01T00:00:00.000 uvicorn.access the last line stays")
    if docker:  # written at other times than the local ones
        raw = [f"2026-01-01T00:00:{n % 60:02d}.000000000Z {line}" for n, line in enumerate(raw)]
    frame = unwrap(pl.Series("raw", raw), "docker" if docker else None, 1)
    kept, aside, layout = quiet.quiet_records(frame, MATTER_WORDS, spaces=spaces)
    assert frame["wrapper_time"].is_not_null().all() == docker
    assert layout == "standard" or aside.height == 0

    valid = [(when.month, when.day) != (2, 29) for _, when in lines] + [True]
    lone = [valid[n] and valid[n + 1] for n in range(len(lines))]
    assert aside.lines.to_list() == [n + 1 for n, alone in enumerate(lone) if alone]
    assert kept["line"].to_list() == [
        n + 1 for n in range(len(raw)) if n >= len(lone) or not lone[n]
    ]
    times = frame.select(
        pl.col("content").str.extract(r"^(\S+)", 1).alias("level"),
        pl.coalesce(
            "wrapper_time",
            pl.col("content")
            .str.extract(r"^\S+ (\S+)", 1)
            .str.to_datetime("%Y-%m-%dT%H:%M:%S%.3f", time_unit="us")
            .dt.replace_time_zone("UTC"),
        ).alias("time"),
    )
    expected: dict[str, tuple[int, datetime]] = {}
    for (level, time_), alone in zip(times.iter_rows(), lone, strict=False):
        if alone:
            count, latest = expected.get(level, (0, time_))
            expected[level] = (count + 1, max(latest, time_))
    assert {level: (count, latest) for level, count, latest in aside.levels.iter_rows()} == (
        expected
    )


def test_every_other_space_is_seen_in_the_bytes() -> None:
    """The shorter proof of a start is used only where a chunk's bytes hold none of
    OTHER_SPACES: every character the regex engine takes for whitespace (as ``\\S`` in the
    longer proof sees it), but the space and the line break, is encoded with one of them."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = pl.Series("c", [chr(c) for c in points])
    spaces = text.filter(text.str.contains(r"[^\S ]")).to_list()
    assert " " not in spaces and "\u3000" in spaces and len(spaces) > 20
    for space in spaces:
        if space != "\n":
            assert any(byte in space.encode() for byte in layouts.OTHER_SPACES), hex(ord(space))


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
@example(text="INFO 2026-11-02T09:00:00.000 uvicorn.access\tGET /health")
@example(text="caf\u00e9 \u2014 d\u00e9j\u00e0 vu")
@example(text="ideographic\u3000space")
def test_other_spaces_are_found_with_or_without_non_ascii_bytes(text) -> None:
    """``other_spaces_in`` (an ASCII chunk searched for the four ASCII spaces only) says what
    searching the bytes for every one of OTHER_SPACES says."""
    data = text.encode()
    assert layouts.other_spaces_in(data) == any(space in data for space in layouts.OTHER_SPACES)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_line_that_can_matter_holds_a_matter_word(data) -> None:
    """The prefilter's proof: whatever a pattern of what can matter matches (in the message or
    in the logger) holds one of MATTER_WORDS, so a line holding none of them cannot matter."""
    for pattern in (*MATTER_TEXT_PATTERNS, *MATTER_LOGGER_PATTERNS):
        text = data.draw(st.from_regex(pattern), label=pattern)
        assert re.search(pattern, text)
        assert any(word in text for word in MATTER_WORDS), (pattern, text)


@needs_captures
def test_a_busy_log_gives_the_same_source_whatever_its_chunks_and_batches(
    tmp_path, monkeypatch
) -> None:
    """The real standard log with access lines between its lines, read as the audit reads a
    file: in one batch, in 4 KiB chunks whose kept lines are classified together, and in
    4 KiB chunks each classified and handed to the event collector on its own, the events,
    every note on the input (the lines' account) and the limitations are the same, and most
    access lines never reach classification."""
    from analyzer.sources.logs import source

    seed_log = CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log"
    padded: list[str] = []
    for line in seed_log.read_text().splitlines():
        padded.append(line)
        t = line.split(" ")[1] if line.startswith("INFO ") else "2026-11-02T09:00:00.000"
        padded += [_ACCESS.format(t=t, i=i) for i in range(8)]
    log = tmp_path / "busy.log"
    log.write_text("\n".join(padded) + "\n")

    whole = source._load_file(log, "server")
    with monkeypatch.context() as patch:
        patch.setattr(log_lines, "CHUNK_BYTES", 4096)
        patch.setattr(log_lines, "BLOCK_BYTES", 1024)
        classified: list[int] = []
        classify = reader.classify_lines
        patch.setattr(
            reader,
            "classify_lines",
            lambda frame: classified.append(frame.height) or classify(frame),
        )
        batched = source._load_file(log, "server")  # the small chunks' kept lines together
        gathered, classified[:] = len(classified), []
        patch.setattr(source, "_BATCH_RECORDS", 1)
        patch.setattr(reader, "GATHERED_ROWS", 1)
        chunked = source._load_file(log, "server")  # each its own batch
    for read in (batched, chunked):
        assert_frame_equal(read.events, whole.events)
        assert read.inputs[0].notes == whole.inputs[0].notes
        assert read.limitations == whole.limitations
    assert whole.events.height > 0 and len(classified) >= 5
    assert gathered * 3 <= len(classified)  # kept lines of several chunks classified at once
    assert sum(classified) * 4 < len(padded)  # the lifecycle lines, few access lines


CAPTURE_LOGS = sorted(CAPTURES.glob("*/*/logs/*.log")) if CAPTURES.is_dir() else []


@needs_captures
@pytest.mark.parametrize("path", CAPTURE_LOGS, ids=lambda p: "/".join(p.parts[-4:]))
def test_recognising_with_the_matter_words_answers_as_sniff_log(path: Path) -> None:
    """The load's reading (its matter words set lone standard records aside) recognises what
    sniff_log recognises: whole, cut short, and of documents that are no log."""
    head = path.read_bytes()
    for piece in (head, head[:3000], head[:400], b"# notes\n" * 30 + head[:300]):
        found = reader.recognise_log(piece, str(path), MATTER_WORDS)
        assert (found is not None) == sniff_log(piece), piece[:80]
        if found is not None:
            assert piece.startswith(found.head)


def _loaded(path: Path, *, reuse: bool = True):
    """Recognised and loaded as the audit does; without `reuse`, its parse is not kept."""
    from analyzer.sources.base import LoadContext
    from analyzer.sources.logs import source

    source._sniff_file.cache_clear()
    assert source.SOURCE.sniff(path)
    if not reuse:
        source._PARSED.clear()
    return source.SOURCE.load(str(path), LoadContext("default"))


def _same_load(one, other) -> None:
    assert_frame_equal(one.events, other.events)
    assert one.inputs == other.inputs
    assert one.limitations == other.limitations
    assert one.secrets == other.secrets
    assert [(r.lines_total, r.record_count, r.damage) for r, _ in one.log_reads] == [
        (r.lines_total, r.record_count, r.damage) for r, _ in other.log_reads
    ]


@pytest.fixture
def no_kept_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """No log's parse kept from an earlier audit in this process (an audit whose logs were
    recognised here and loaded elsewhere leaves theirs, a few at most)."""
    from analyzer.sources.logs import source

    monkeypatch.setattr(source, "_PARSED", {})


@needs_captures
@pytest.mark.parametrize(
    "path", [p for p in CAPTURE_LOGS if p.stat().st_size][:4], ids=lambda p: p.name
)
@pytest.mark.usefixtures("no_kept_parses")
def test_a_log_recognised_whole_is_loaded_from_that_parse(path: Path) -> None:
    """A log no longer than its head is parsed once: the load takes the recognition's parse,
    and gives what parsing it again gives."""
    from analyzer.sources.logs import source

    source._sniff_file.cache_clear()
    assert source.SOURCE.sniff(path)
    assert len(source._PARSED) == 1
    reused = _loaded(path)
    assert not source._PARSED  # taken by the load
    _same_load(reused, _loaded(path, reuse=False))


@needs_captures
@pytest.mark.usefixtures("no_kept_parses")
def test_a_log_longer_than_its_head_is_read_again_whole(tmp_path: Path) -> None:
    """Only the head was parsed to recognise it: nothing of that parse is kept."""
    from analyzer.sources.logs import source

    text = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_bytes()
    path = tmp_path / "server.log"
    path.write_bytes(text * (log_lines.SNIFF_BYTES // len(text) + 2))
    source._sniff_file.cache_clear()
    assert source.SOURCE.sniff(path)
    assert not source._PARSED


@needs_captures
@pytest.mark.usefixtures("no_kept_parses")
def test_a_log_changed_after_it_was_recognised_is_parsed_again(tmp_path: Path) -> None:
    """Bytes that changed between the recognition and the load (same size and time) are the
    ones parsed and hashed: the kept parse is of other bytes."""
    import os

    from analyzer.sources.logs import source

    original = CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log"
    text = original.read_bytes()
    changed = text.replace(b"web", b"wEb")
    assert changed != text and len(changed) == len(text)
    path = tmp_path / "server.log"
    path.write_bytes(text)
    source._sniff_file.cache_clear()
    assert source.SOURCE.sniff(path)
    times = os.stat(path)
    path.write_bytes(changed)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    loaded = source.SOURCE.load(str(path), source.LoadContext("default"))
    assert not source._PARSED
    _same_load(loaded, _loaded(path, reuse=False))
    assert loaded.events["entity_name"].str.contains("wEb").any()


def test_an_event_line_that_is_not_ascii_keeps_its_actor_targets_and_message() -> None:
    """An event line's body, targets and actor are cut at the separators by their byte offsets
    only where every character is one byte: a message of 13 two-byte characters once made the
    actor ``user(123456)zsystem`` read as ``system`` and lost the event's target."""
    message = "Fleet is at capacity " + "\u00e9" * 13
    line = (
        "INFO 2026-11-02T09:00:00.000 dstack._internal.server.services.events Emitting event: "
        "Job status changed PROVISIONING -> TERMINATING. Termination reason: "
        f"FAILED_TO_START_DUE_TO_NO_CAPACITY ({message}). Event targets: job(abcdef)web-0-1. "
        "Actor: user(123456)zsystem"
    )
    read = read_log_bytes(f"{line}\n{line.replace('abcdef', 'fedcba')}".encode(), "x.log")
    events, facts = records_to_events(read.records, "x.log", "server")
    assert facts.relevant == 2 and facts.unrecognised == 0
    assert events.select("entity_id", "actor", "termination_message").rows() == [
        ("abcdef", "user zsystem", message),
        ("fedcba", "user zsystem", message),
    ]
