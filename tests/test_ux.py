"""Pleasant under pressure (issue 16): the library takes plain strings and ISO times, the terminal
table and the timeline fit 80 and 100 columns without splitting a word, -o infers the format,
colour only on a terminal, progress bars only on a pseudo-terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, ROOT, read_terminal

from analyzer import AuditInputError, open_sources
from analyzer.cli import main
from analyzer.contract import SCHEMA_VERSION
from analyzer.render.screen import middle_ellipsis, render_table
from analyzer.render.text import timeline_text
from analyzer.render.timeline_view import merged_events

SEED = CAPTURES / "v0.22.5" / "seed"
SEED_DB = str(SEED / "server.db")
CAPTURE_DBS = sorted(str(p) for p in (CAPTURES / "v0.22.5").glob("*/server.db"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(*args: str, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


@pytest.fixture(scope="module")
def seed():
    return open_sources(SEED)


@pytest.fixture(scope="module")
def fleet():
    return open_sources(CAPTURE_DBS)


# ---------------------------------------------------------------------------------------------
# Library


def test_open_sources_takes_one_plain_string(seed):
    one = open_sources(SEED_DB)
    assert [i.path for i in one.report.inputs] == [SEED_DB]
    assert one.report.summary.findings == 1
    assert seed.report.summary.findings == 1  # a Path, a folder


@pytest.mark.parametrize(
    "since",
    [
        "2026-11-02T09:09:00Z",
        "2026-11-02T11:09:00+02:00",
        "2026-11-02 09:09:00",
        "2026-11-02 09:09:00.000Z",  # the tool's own table format
        "2026-11-02 09:09:00.000 UTC",  # the HTML report's
        datetime(2026, 11, 2, 9, 9, tzinfo=UTC),
    ],
)
def test_times_accept_iso_8601_in_every_spelling(since):
    audit = open_sources(SEED_DB, since=since)
    assert audit.since == datetime(2026, 11, 2, 9, 9, tzinfo=UTC)
    assert audit.runs.height == 1
    assert open_sources(SEED_DB, since="2026-11-03").runs.height == 0  # a date is its midnight


def test_a_bad_time_is_a_clear_error():
    with pytest.raises(AuditInputError, match=r"since: 'yesterday' is not an ISO 8601 time"):
        open_sources(SEED_DB, since="yesterday")


@pytest.mark.parametrize("selector", ["web", "acme/web", "6e42c918", "6E42C918-3C60"])
def test_run_selectors_everywhere(selector):
    audit = open_sources(SEED_DB, run=selector)
    assert audit.runs["run_name"].to_list() == ["web"]
    from analyzer import plot_run

    figure = plot_run(audit, selector)
    assert figure.axes


def test_unknown_and_ambiguous_run_selectors(fleet):
    from analyzer import plot_run

    with pytest.raises(AuditInputError, match="no run with this name"):
        plot_run(fleet, "nope")
    with pytest.raises(AuditInputError, match=r"runs match"):
        plot_run(fleet, "web")


def test_changed_fields_is_a_list(seed):
    deps = seed.deployments.sort("deployment_num")
    assert deps.schema["changed_fields"].base_type().__name__ == "List"
    assert deps["changed_fields"].to_list()[1] == ["configuration.commands"]


# ---------------------------------------------------------------------------------------------
# Terminal table


def _words(text: str) -> set[str]:
    """The words of `text`, without the commas and colons a narrow layout adds after them."""
    return {word.rstrip(",:") for word in text.split()} | set(text.split())


def _check_fits(narrow: str, wide: str, width: int, *, unbreakable_ok: bool = False) -> None:
    """No line wider than `width` (with `unbreakable_ok`: except a line holding one word, such
    as a provenance path longer than the screen), and no word split across lines."""
    lines = narrow.splitlines()
    wider = [line for line in lines if len(line) > width]
    if unbreakable_ok:
        wider = [line for line in wider if len(line.split()) > 1]
    assert not wider, wider
    known = _words(wide)
    split = [
        w
        for w in _words(narrow)
        if w not in known and w.rstrip(",:") not in known and "…" not in w and w.strip("─")
    ]
    assert not split, split


@pytest.mark.parametrize("width", [80, 100])
def test_table_fits_the_width_without_splitting_words(seed, fleet, width):
    for audit in (seed, fleet):
        for options in ({}, {"all_runs": True, "full_inputs": True}):
            narrow = render_table(audit.report, width=width, terminal=True, **options)
            wide = render_table(audit.report, width=2000, terminal=True, **options)
            _check_fits(narrow, wide, width)


def test_table_leads_with_findings_and_lists_only_incident_runs(fleet):
    text = render_table(fleet.report, width=100)
    assert text.index("FINDINGS") < text.index("RUNS") < text.index("INPUTS")
    runs = text[text.index("RUNS") : text.index("INPUTS")]
    assert "no_incident" in runs.splitlines()[0]  # counted...
    assert not any(line.startswith("no_incident") for line in runs.splitlines())  # ...not listed
    every = render_table(fleet.report, width=100, all_runs=True)
    listed = [line for line in every.splitlines() if line.startswith("no_incident")]
    assert len(listed) == fleet.report.summary.by_verdict["no_incident"]


def test_verdict_filter(fleet):
    text = render_table(fleet.report, width=100, verdicts=["same_deployment_collateral"])
    findings = text[text.index("FINDINGS") : text.index("RUNS")]
    assert "same_deployment_collateral" in findings
    assert "collateral_termination (" not in findings
    result = run("audit", *CAPTURE_DBS, "--verdict", "no_incident")
    assert result.exit_code == 0, result.output
    assert "FINDINGS: none" in result.output


def test_inputs_summarised_by_kind_with_problems_called_out(seed):
    text = render_table(seed.report, width=100)
    inputs = text[text.index("INPUTS") :]
    assert re.search(r"INPUTS: 35 \(.*12 table-export", inputs)
    assert "not recognised, skipped (5): " in inputs and "truth.json" in inputs
    assert seed.report.inputs[0].sha256[:16] not in inputs
    full = render_table(seed.report, width=100, full_inputs=True)
    assert all((i.sha256 or "-")[:16] in full for i in seed.report.inputs)


def test_middle_ellipsis_keeps_the_file_name():
    path = "tests/data/captures/v0.22.5/seed/logs/server-info.standard.log"
    short = middle_ellipsis(path, 30)
    assert len(short) == 30 and short.endswith("server-info.standard.log"[-19:])
    assert "…" in short and middle_ellipsis("short", 30) == "short"


def test_colour_only_on_a_terminal():
    plain = render_table(open_sources(SEED_DB).report, width=100)
    coloured = render_table(open_sources(SEED_DB).report, width=100, colour=True)
    assert not ANSI.search(plain) and ANSI.search(coloured)
    assert ANSI.sub("", coloured).split() == plain.split()
    piped = run("audit", SEED_DB)
    assert not ANSI.search(piped.output)


# ---------------------------------------------------------------------------------------------
# Conventions


def test_output_format_follows_the_extension(tmp_path):
    out = tmp_path / "x.json"
    assert run("audit", SEED_DB, "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["schema_version"] == SCHEMA_VERSION
    md = tmp_path / "x.md"
    assert run("audit", SEED_DB, "-o", str(md)).exit_code == 0
    assert md.read_text().startswith("#")
    table = tmp_path / "x.json"
    assert run("audit", SEED_DB, "-o", str(table), "--format", "table").exit_code == 0
    assert table.read_text().startswith("dstack-audit ")
    dash = run("audit", SEED_DB, "-o", "-", "--format", "json")
    assert json.loads(dash.output)["schema_version"] == SCHEMA_VERSION


def test_version_flags():
    for flag in ("-V", "--version"):
        result = run(flag)
        assert result.exit_code == 0 and result.output.startswith("dstack-audit, version ")


def test_iso_times_on_the_command_line():
    for since in ("2026-11-02T09:00:00Z", "2026-11-02T10:00:00+01:00", "2026-11-02 09:00:00.000Z"):
        result = run("audit", SEED_DB, "--since", since, "--format", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["summary"]["runs"] == 1
    bad = run("audit", SEED_DB, "--since", "noon")
    assert bad.exit_code == 2 and "is not an ISO 8601 time" in bad.output


def test_tz_on_the_table_and_the_timeline():
    table = run("audit", SEED_DB, "--tz", "Europe/Berlin")
    assert "killed 2026-11-02 10:09:20.483+01:00" in table.output
    story = run("timeline", "web", SEED_DB, "--tz", "Europe/Berlin")
    assert "2026-11-02 10:08:50.796+01:00" in story.output
    bad = run("audit", SEED_DB, "--tz", "Mars/Olympus")
    assert bad.exit_code == 2 and "unknown time zone" in bad.output


def test_every_command_documents_its_exit_codes():
    for name in main.commands:
        result = run(name, "--help")
        assert result.exit_code == 0
        assert "Exit status" in result.output, name
    top = run("--help").output
    for kind in ("SQLite", "PostgreSQL", "table exports", "API exports", "server logs", "dataset"):
        assert kind in top, kind


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _on_a_pty(*args: str, env: dict | None = None) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal; everything it wrote."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm", **(env or {})},
    )
    os.close(follower)
    screen = read_terminal(leader, process)
    process.wait(timeout=60)
    os.close(leader)
    return screen.decode("utf-8", "replace")


def test_progress_on_a_terminal_and_not_when_piped():
    shown = _on_a_pty("audit", SEED_DB, "-o", os.devnull)
    assert "reading" in shown and "auditing runs" in shown
    quiet = _on_a_pty("audit", SEED_DB, "-q", "-o", os.devnull)
    assert "reading" not in quiet
    piped = _cli("audit", SEED_DB, "-o", os.devnull)
    assert piped.returncode == 0 and piped.stderr == ""


def test_colour_on_a_terminal_unless_no_color():
    assert ANSI.search(_on_a_pty("audit", SEED_DB, "-q"))
    assert not ANSI.search(_on_a_pty("audit", SEED_DB, "-q", env={"NO_COLOR": "1"}))
    assert not ANSI.search(_on_a_pty("audit", SEED_DB, "-q", "--no-color"))


def test_verbose_says_what_is_read_and_how_long():
    result = _cli("audit", SEED_DB, "-v", "-o", os.devnull)
    assert result.returncode == 0
    assert f"read {SEED_DB}" in result.stderr and "(sqlite, 24 records)" in result.stderr
    assert re.search(r"auditing runs: \d+\.\d\ds", result.stderr)


# ---------------------------------------------------------------------------------------------
# Timeline


def _timeline(audit, width: int, **options) -> str:
    return timeline_text(audit.story(audit.runs["run_id"][0]), width=width, **options)


@pytest.mark.parametrize("width", [80, 100])
def test_timeline_fits_without_splitting_words(seed, width):
    _check_fits(_timeline(seed, width), _timeline(seed, 5000), width)
    _check_fits(
        _timeline(seed, width, sources=True),
        _timeline(seed, 5000, sources=True),
        width,
        unbreakable_ok=True,
    )


def test_timeline_one_line_per_event_across_sources(seed):
    text = _timeline(seed, 100)
    events: list[str] = []
    for line in text[text.index("EVENTS") :].splitlines()[1:]:
        if line.startswith("  2026"):
            events.append(line)
        else:  # a continuation of the event above
            events[-1] += " " + line.strip()
    stamps = [line.split()[1] for line in events]
    assert stamps == sorted(stamps)
    killed = [
        line
        for line in events
        if "RUNNING -> TERMINATING. Termination reason: TERMINATED_BY" in line
    ]
    assert len(killed) == 1 and "[victim]" in killed[0]
    assert "[sources:" in killed[0] and "server-info.rich.log" not in text
    assert "server-info.rich.log" in _timeline(seed, 100, sources=True)
    assert any("[culprit]" in line for line in events)


def test_rich_whole_seconds_join_the_precise_sighting():
    """The rich log writes 09:00:46 where the json log writes 09:00:46.939: one event."""
    logs = SEED / "logs"
    audit = open_sources([SEED_DB, logs / "server-info.rich.log", logs / "server-info.json.log"])
    rows = audit.events.filter(audit.events["kind"] == "job_provisioned")
    assert sorted(t.microsecond for t in rows["time"]) == [0, 939000]  # two sightings
    items = merged_events(audit.events)
    provisioned = [i for i in items if i["kind"] == "job_provisioned"]
    assert len(provisioned) == 1 and provisioned[0]["time"].microsecond == 939000
    sources = " ".join(provisioned[0]["provenance"])
    assert "server-info.rich.log" in sources and "server-info.json.log" in sources
    times = [i["time"] for i in items]
    assert times == sorted(times)
    alone = merged_events(open_sources([SEED_DB, logs / "server-info.rich.log"]).events)
    assert [i["time"].microsecond for i in alone if i["kind"] == "job_provisioned"] == [0]


def test_timeline_exports(tmp_path):
    for fmt in ("json", "jsonl", "csv", "timesketch"):
        result = run("timeline", "acme/web", str(SEED), "--format", fmt)
        assert result.exit_code == 0, result.output
        if fmt == "json":
            doc = json.loads(result.output)
            assert doc["run"]["run_name"] == "web" and doc["events"]
        elif fmt == "csv":
            rows = list(csv.DictReader(io.StringIO(result.output)))
            assert rows and {"time", "message", "role", "provenance"} <= set(rows[0])
        else:
            lines = [json.loads(line) for line in result.output.splitlines()]
            assert lines and all(line["run_id"].startswith("6e42c918") for line in lines)
            if fmt == "timesketch":
                first = lines[0]
                assert {"message", "datetime", "timestamp_desc"} <= set(first)
                assert first["datetime"].startswith("2026-11-02T09:00:41")
                assert any("[victim]" in line["message"] for line in lines)
    out = tmp_path / "web.jsonl"
    assert run("timeline", "web", SEED_DB, "-o", str(out)).exit_code == 0
    assert all(json.loads(line) for line in out.read_text().splitlines())


def test_dash_is_stdout_for_pictures_and_reports():
    from analyzer.cli.visual import register

    register(main)
    picture = CliRunner().invoke(main, ["plot", "acme/web", SEED_DB, "-o", "-"])
    assert picture.exit_code == 0 and picture.stdout_bytes.startswith(b"\x89PNG")
    page = CliRunner().invoke(main, ["report", SEED_DB, "-o", "-", "--max-plots", "0"])
    assert page.exit_code == 0 and page.output.startswith("<!DOCTYPE html>")
    assert "pictures are drawn for the worst 0 runs" in page.output
    markdown = CliRunner().invoke(main, ["report", SEED_DB, "-o", "-", "--format", "markdown"])
    assert markdown.exit_code == 2 and "needs a file" in markdown.output
