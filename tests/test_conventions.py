"""One set of conventions on every command (issue 24 §2): times, the common options, -o's
extension, progress, undecided audits under --fail-on-findings, help at 80 columns, server
names and the times' precision."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import click
import pytest
from click.testing import CliRunner
from conftest import CAPTURES, ROOT, read_terminal

from analyzer.cli import main
from analyzer.cli.options import IsoTime

SEED = CAPTURES / "v0.22.5" / "seed"
SEED_DB = str(SEED / "server.db")
ROLLING = str(CAPTURES / "v0.22.5" / "rolling-ok" / "server.db")


def run(*args: str, **kwargs) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), **kwargs)


# ---------------------------------------------------------------------------------------------
# Times: ISO 8601 with Z or an offset, through one parser


def test_every_time_option_uses_the_one_iso_parser():
    """A time option is an IsoTime; the only other dated option is --log-date, a day."""
    timed = {
        (name, param.name)
        for name, command in main.commands.items()
        for param in command.params
        if isinstance(param.type, IsoTime)
    }
    assert {("exposure", "as_of"), ("audit", "since"), ("report", "until")} <= timed
    others = {
        param.name
        for command in main.commands.values()
        for param in command.params
        if isinstance(param.type, click.DateTime)
    }
    assert others <= {"log_date"}


@pytest.mark.parametrize(
    "moment", ["2026-11-03T13:00:00Z", "2026-11-03T14:00:00+01:00", "2026-11-03 13:00:00"]
)
def test_exposure_as_of_takes_z_and_offsets(moment):
    result = run("exposure", ROLLING, "--as-of", moment, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["as_of"].startswith("2026-11-03T13:00:00")


def test_audit_since_takes_z_and_offsets():
    whole = json.loads(run("audit", SEED_DB, "--format", "json").output)
    assert whole["runs"]
    for moment in ("2030-01-01T00:00:00Z", "2030-01-01T01:00:00+01:00"):
        result = run("audit", SEED_DB, "--since", moment, "--format", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["runs"] == []


def test_a_time_that_is_not_iso_is_refused_naming_the_option():
    result = run("exposure", ROLLING, "--as-of", "yesterday")
    assert result.exit_code == 2
    assert "'--as-of'" in result.output and "2026-11-02T09:00:00Z" in result.output


# ---------------------------------------------------------------------------------------------
# exposure: the options every reading command has


def test_exposure_has_the_common_options():
    params = {p.name for p in main.commands["exposure"].params}
    assert {"quiet", "verbose", "no_color", "tz", "project", "log_tz", "log_date"} <= params


def test_exposure_project_and_tz():
    mine = run("exposure", ROLLING, "--project", "globex")
    assert mine.exit_code == 0 and "1 running service(s)" in mine.output
    other = run("exposure", ROLLING, "--project", "nobody")
    assert other.exit_code == 0 and "0 running service(s)" in other.output
    utc = run("exposure", ROLLING, "--as-of", "2026-11-03T13:00:00Z").output
    berlin = run("exposure", ROLLING, "--as-of", "2026-11-03T13:00:00Z", "--tz", "Europe/Berlin")
    assert "as of 2026-11-03 13:00:00" in utc and "+01:00" not in utc
    assert "as of 2026-11-03 14:00:00" in berlin.output and "+01:00" in berlin.output
    assert run("exposure", ROLLING, "--tz", "Mars/Olympus").exit_code == 2


def test_exposure_verbose_says_what_it_read():
    result = run("exposure", ROLLING, "-v")
    assert result.exit_code == 0 and f"read {ROLLING}" in result.stderr


@pytest.mark.parametrize("width", [60, 80])
def test_exposure_table_fits_the_width(width):
    result = run("exposure", ROLLING, env={"COLUMNS": str(width)})
    assert result.exit_code == 0
    wide = run("exposure", ROLLING, env={"COLUMNS": "1000"}).output
    for line in result.output.splitlines():
        assert len(line) <= width or " " not in line.strip(), line
    assert result.output.split() == wide.split()  # only the line breaks moved


# ---------------------------------------------------------------------------------------------
# -o FILE: an extension the command cannot write is refused


@pytest.mark.parametrize(
    ("args", "name", "offered"),
    [
        (["audit", SEED_DB], "x.html", ".txt, .md, .markdown, .json, .csv, .jsonl or .ndjson"),
        (["audit", SEED_DB], "x.xlsx", ".txt, .md, .markdown, .json, .csv, .jsonl or .ndjson"),
        (["timeline", "web", SEED_DB], "x.html", ".txt, .json, .jsonl, .ndjson or .csv"),
        (["exposure", SEED_DB], "x.csv", ".txt, .md, .markdown or .json"),
        (["plot", "web", SEED_DB], "x.html", ".png, .svg or .pdf"),
        (["report", SEED_DB], "x.csv", ".html, .htm, .md or .markdown"),
    ],
)
def test_an_extension_without_a_renderer_is_refused(args, name, offered, tmp_path):
    target = tmp_path / name
    result = run(*args, "-o", str(target))
    assert result.exit_code == 2
    assert result.output.count("\n") == 1, result.output
    assert offered in result.output and "Traceback" not in result.output
    assert ("dstack-audit report" in result.output) == name.endswith(".html")
    assert not target.exists()


def test_format_given_or_no_extension_writes_as_told(tmp_path):
    assert run("audit", SEED_DB, "-o", str(tmp_path / "x.csv"), "--format", "json").exit_code == 0
    assert json.loads((tmp_path / "x.csv").read_text())["schema_version"]
    assert run("audit", SEED_DB, "-o", str(tmp_path / "plain")).exit_code == 0
    assert "FINDINGS" in (tmp_path / "plain").read_text()


# ---------------------------------------------------------------------------------------------
# Progress says what it counts


def _screen(*args: str, columns: int = 100) -> str:
    """The CLI typed in a terminal `columns` wide (stdin, stdout and stderr on a
    pseudo-terminal of that size; no COLUMNS to hint at it), its escape sequences removed."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _terminal(*args, columns=columns))


def _terminal(*args: str, columns: int = 100) -> str:
    """What the CLI typed in a terminal `columns` wide sends it, escape sequences and all."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm"}
    env.pop("COLUMNS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
        env=env,
    )
    os.close(follower)
    screen = read_terminal(leader, process)
    process.wait(timeout=60)
    os.close(leader)
    return screen.decode("utf-8", "replace")


@pytest.mark.parametrize("split", [[], ["--partitions", "2"]])
def test_the_table_on_a_terminal_keeps_its_own_styles(split):
    """The table's colours reach the terminal whole, in one process as in partitions: the
    final pass keeps the renderer's own SGR sequences, never a bare `[1m` whose escape it
    removed (the partitions' pass once did)."""
    screen = _terminal("audit", SEED_DB, *split)
    assert "\x1b[1mFINDINGS" in screen
    assert not re.search(r"(?<!\x1b)\[[0-9;]*m", screen), screen[:2000]


def test_reading_a_folder_counts_its_files():
    files = sum(
        1
        for p in SEED.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(SEED).parts)
    )
    assert files > 1
    screen = _screen("audit", str(SEED), "-o", os.devnull)
    counts = re.findall(r"reading\b.*? (\d+)/(\d+) files", screen)
    assert counts and {int(total) for _, total in counts} == {files}, screen
    assert "/?" not in screen and "0/1 " not in screen
    alone = _screen("audit", SEED_DB, "-o", os.devnull)
    assert re.search(r"reading\b.*? [01]/1 file\b", alone), alone


# ---------------------------------------------------------------------------------------------
# --fail-on-findings: an audit that decided nothing is no all-clear

WARNING_LOG = str(
    CAPTURES / "v0.22.5" / "user-stop-mid-rollout" / "logs" / "server-warning.standard.log"
)
(PS_JSON,) = (SEED / "cli").glob("*/ps-a.json")  # health cannot be decided from it alone


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([WARNING_LOG], "FINDINGS: none, but no run evidence in the inputs"),
        ([SEED_DB, "--project", "nobody"], "FINDINGS: none, but no run evidence in the inputs"),
        ([str(PS_JSON)], "FINDINGS: none, but 1 run could not be decided (inconclusive)"),
    ],
    ids=["warning-log-alone", "project-matching-no-run", "inconclusive-run"],
)
def test_nothing_decided_fails_the_gate_unless_allowed(args, said):
    table = run("audit", *args)
    assert table.exit_code == 0 and said in table.output, table.output
    gate = run("audit", *args, "--fail-on-findings", "--format", "json")
    assert gate.exit_code == 1
    assert "no findings, but" in gate.stderr and "--allow-undecided" in gate.stderr
    assert json.loads(gate.stdout)["findings"] == []
    allowed = run("audit", *args, "--fail-on-findings", "--allow-undecided", "-o", os.devnull)
    assert allowed.exit_code == 0, allowed.output
    markdown = run("audit", *args, "--format", "markdown").output
    assert "None, but" in markdown


def test_decided_audits_keep_their_exit_codes():
    assert run("audit", ROLLING, "--fail-on-findings", "-o", os.devnull).exit_code == 0
    assert run("audit", SEED_DB, "--fail-on-findings", "-o", os.devnull).exit_code == 1
    assert "FINDINGS: none\n" in run("audit", ROLLING).output


def test_the_exit_codes_are_documented_in_help():
    top = run("--help").output
    assert "130 interrupted" in top and "runs not decided" in top
    audit = run("audit", "--help").output
    assert "--allow-undecided" in audit and "or runs not decided" in " ".join(audit.split())


# ---------------------------------------------------------------------------------------------
# Help at 80 columns; the timeline fits the terminal


def test_every_command_summary_fits_80_columns_whole():
    result = run("--help", env={"COLUMNS": "80"})
    listing = result.output[result.output.index("Commands:") :].splitlines()[1:]
    summaries = dict(line.split(None, 1) for line in listing if line.strip())
    assert set(summaries) == set(main.commands)
    for name, summary in summaries.items():
        assert summary.endswith(".") and not summary.endswith("..."), (name, summary)
    assert all(len(line) <= 80 for line in listing)


@pytest.mark.parametrize("command", ["", *sorted(main.commands)])
def test_every_help_fits_80_columns(command):
    result = run(*command.split(), "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert [line for line in result.output.splitlines() if len(line) > 80] == []


def test_timeline_fits_the_terminal_it_is_typed_in():
    columns = 72
    wide = run("timeline", "web", SEED_DB, "--width", "200").output
    assert max(len(line) for line in wide.splitlines()) > columns  # narrowing is needed
    screen = _screen("timeline", "web", SEED_DB, "-q", "--no-color", columns=columns)
    lines = screen.replace("\r", "").splitlines()
    assert len(lines) > 10 and "EVENTS" in screen
    too_wide = [line for line in lines if len(line) > columns and " " in line.strip()]
    assert too_wide == []
    assert screen.split() == wide.split()  # nothing lost, only the line breaks moved


# ---------------------------------------------------------------------------------------------
# Server names are the sources given; times carry the evidence's precision


def _servers(*sources: str) -> set[str]:
    result = run("audit", *sources, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    named = {v["server"] for v in report["runs"]} | {f["server"] for f in report["findings"]}
    assert {g["key"] for g in report["summary"]["by_server"]} <= named
    return named


def test_a_server_is_named_by_the_source_given():
    crash = CAPTURES / "v0.22.5" / "multi-replica-crash"
    assert _servers(str(SEED), str(crash)) == {"seed", "multi-replica-crash"}
    assert _servers(str(SEED / "tables"), str(crash / "tables")) == {
        "seed/tables",
        "multi-replica-crash/tables",
    }
    assert _servers(SEED_DB, str(crash / "server.db")) == {
        "seed/server.db",
        "multi-replica-crash/server.db",
    }


def test_servers_inside_one_given_folder_are_named_by_their_database():
    names = _servers(str(CAPTURES / "v0.22.5"))
    assert len(names) == len(list((CAPTURES / "v0.22.5").glob("*/server.db")))
    assert all(name.endswith("/server.db") and name.count("/") == 1 for name in names)


def test_times_carry_the_precision_of_the_evidence():
    """`dstack event` text is to the second, the database to the microsecond."""
    seconds = run("timeline", "web", str(SEED / "cli")).output
    events = seconds[seconds.index("EVENTS") :]
    assert "2026-11-02 09:00:41Z  run web: Run submitted" in events
    assert not re.search(r"\d\d:\d\d:\d\d\.000(Z|\b)", events)
    precise = run("timeline", "web", SEED_DB).output
    assert re.search(r"2026-11-02 09:09:29\.439Z", precise)
    exposure = run("exposure", ROLLING, "--as-of", "2026-11-03T13:00:00Z").output
    assert "as of 2026-11-03 13:00:00Z:" in exposure
    berlin = run("exposure", ROLLING, "--as-of", "2026-11-03T13:00:00Z", "--tz", "Europe/Berlin")
    assert "as of 2026-11-03 14:00:00+01:00:" in berlin.output
