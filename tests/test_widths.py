"""No figure, id or time is ever cut (issue 37): every capture's findings table at 60, 80 and
120 columns, in a pipe and on a pseudo-terminal, holds every figure of its JSON report whole on
one line; a culprit's long cloud error is one line in the table and whole in the JSON."""

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
from pathlib import Path

import pytest
from conftest import CAPTURES, ROOT, execute, read_terminal

from analyzer.api import open_sources
from analyzer.contract import Report
from analyzer.render.format import cost_text, fmt_time, outage_text, replica_time_text
from analyzer.render.report_json import json_pieces
from analyzer.render.screen import render_table

WIDTHS = (60, 80, 120)
FOLDERS = sorted(p for p in CAPTURES.glob("*/*") if p.is_dir())
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A cloud's no-capacity error as a provider returns it, many lines long (dstack stores the text
# it is given in jobs.termination_reason_message: free text, reference section 3)
CLOUD_ERROR = (
    "no capacity: 3 of 3 offers refused (InsufficientInstanceCapacity, aws/eu-west-1)\n"
    + "\n".join(
        f"  offer {n}: g5.xlarge in eu-west-1{zone}: An error occurred "
        "(InsufficientInstanceCapacity) when calling the RunInstances operation: We currently "
        "do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
        for n, zone in enumerate("abc", 1)
    )
)


def figures(report_json: str) -> list[str]:
    """Every figure, id and time the findings table shows, as the JSON report gives them."""
    report = Report.model_validate_json(report_json)
    summary = report.summary
    found = [outage_text(summary), replica_time_text(summary), cost_text(summary)]
    found = [*found, fmt_time(report.end_of_evidence)] if report.findings else []
    for finding in report.findings:
        killed = max(v.terminated_at for v in finding.victims if v.terminated_at)
        found += [fmt_time(killed), finding.run_id[:8], finding.category, finding.confidence]
        found += [outage_text(finding.impact), replica_time_text(finding.impact)]
        found += [cost_text(finding.impact)]
        found += [f"{v.job_name} (dep {v.deployment_num})" for v in finding.victims]
        found += [f"{c.job_name} (dep {c.deployment_num})" for c in finding.culprits]
        found += [c.termination_reason for c in finding.culprits if c.termination_reason]
    return found


def assert_whole(text: str, wanted: list[str], width: int) -> None:
    """Each figure on one line of `text`; no line wider than `width` unless it holds one word
    (a whole path, after its bullet)."""
    lines = text.splitlines()
    cut = [figure for figure in wanted if not any(figure in line for line in lines)]
    assert not cut, (cut, text)
    wider = [line for line in lines if len(line) > width and len(line.lstrip(" !-").split()) > 1]
    assert not wider, wider


@pytest.fixture(scope="module")
def long_error(tmp_path_factory) -> Path:
    """The seed incident with its culprit's message a cloud's many-line error."""
    db = tmp_path_factory.mktemp("cloud") / "server.db"
    db.write_bytes((CAPTURES / "v0.22.5" / "seed" / "server.db").read_bytes())
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = ? "
        "WHERE termination_reason = 'FAILED_TO_START_DUE_TO_NO_CAPACITY'",
        params=(CLOUD_ERROR,),
    )
    return db


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: "/".join(p.parts[-2:]))
def test_every_capture_keeps_every_figure_whole(folder):
    report = open_sources([str(folder)]).report
    wanted = figures("".join(json_pieces(report)))
    for width in WIDTHS:
        for terminal in (False, True):
            assert_whole(render_table(report, width=width, terminal=terminal), wanted, width)


def test_a_long_cloud_error_is_one_line_in_the_table_and_whole_in_the_json(long_error):
    report = open_sources([str(long_error)]).report
    document = json.loads("".join(json_pieces(report)))
    (culprit,) = document["findings"][0]["culprits"]
    assert culprit["termination_reason_message"] == CLOUD_ERROR
    for width in WIDTHS:
        text = render_table(report, width=width)
        assert "offer 1" not in text and "InsufficientInstanceCapacity, aws/eu-west-1) …" in (
            " ".join(text.split())
        )
        assert_whole(text, figures("".join(json_pieces(report))), width)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    return {**env, "TERM": "xterm", **extra}


def _piped(args: list[str], width: int) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "analyzer", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        env=_env(COLUMNS=str(width)),
        check=True,
        timeout=120,
    )
    return result.stdout.decode()


def _on_terminal(args: list[str], width: int) -> str:
    """What the command shows on a pseudo-terminal `width` columns wide (no COLUMNS set: the
    width is the terminal's own)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", *args],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=_env(),
    )
    os.close(follower)
    screen = read_terminal(leader, process)
    assert process.wait(timeout=120) == 0
    os.close(leader)
    return ANSI.sub("", screen.decode()).replace("\r\n", "\n")


def test_the_command_keeps_every_figure_whole_in_a_pipe_and_on_a_terminal(long_error):
    sources = [str(p / "server.db") for p in FOLDERS if (p / "server.db").exists()]
    args = ["audit", "-q", *sources, str(long_error)]
    wanted = figures(_piped([*args, "--format", "json"], 100))
    assert len(wanted) > 40  # every capture's findings, and the long error's
    for width in WIDTHS:
        piped = _piped(args, width)
        assert_whole(piped, wanted, width)
        for line in piped.splitlines():  # a pipe gets every path whole
            assert "…" not in line or line.rstrip().endswith(") …"), line
        assert_whole(_on_terminal(args, width), wanted, width)
    assert _piped([*args, "--width", "60"], 200) == _piped(args, 60)
