"""One set of output formats (issue 37): `audit` writes the findings and the victims as CSV and
JSON Lines (by --format or -o's extension), each row checked against the JSON report of the
same audit; every command takes its formats from one registry."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import CAPTURES, execute

from analyzer.cli import main
from analyzer.render.formats import FORMATS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "samples" / "fleet" / "server.db"), str(CAPTURES / "v0.22.5" / "seed")]


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(run("audit", "-q", *SOURCES, "--format", "json"))


def _findings(report: dict) -> list[dict]:
    return report["findings"]


def _victims(report: dict) -> list[tuple[dict, dict]]:
    return [(f, v) for f in report["findings"] for v in f["victims"]]


def _same_time(text: str | None, value: str | None) -> bool:
    if not text or not value:
        return not text and not value
    from datetime import datetime

    return datetime.fromisoformat(text) == datetime.fromisoformat(value)


def _check_findings(rows: list[dict], report: dict, *, text: bool) -> None:
    findings = _findings(report)
    assert len(rows) == len(findings) > 10
    for rank, (row, finding) in enumerate(zip(rows, findings, strict=True), 1):
        impact = finding["impact"]
        number = float if text else (lambda value: value)
        assert int(row["rank"]) == rank
        for key in ("server", "run_id", "project", "run_name", "category", "confidence"):
            assert row[key] == finding[key], key
        assert int(row["victims"]) == len(finding["victims"])
        assert _same_time(row["outage_start"], impact["outage_start"])
        for key in ("outage_seconds", "healthy_replica_seconds_lost", "lost_cost"):
            if impact[key] is None:
                assert row[key] in ("", None), key
            else:
                assert number(row[key]) == pytest.approx(impact[key]), key
        for key in (
            "outage_is_lower_bound",
            "healthy_replica_seconds_lost_is_lower_bound",
            "lost_cost_is_lower_bound",
        ):
            assert row[key] == (str(impact[key]) if text else impact[key]), key
        unknown = len(impact["per_victim"]) - impact["cost_known_for"]
        assert int(row["cost_unknown_victims"]) == unknown


def _check_victims(rows: list[dict], report: dict, *, text: bool) -> None:
    victims = _victims(report)
    assert len(rows) == len(victims) == report["summary"]["victims"]
    for row, (finding, victim) in zip(rows, victims, strict=True):
        assert (row["run_id"], row["project"], row["run_name"]) == (
            finding["run_id"],
            finding["project"],
            finding["run_name"],
        )
        assert (row["job_id"], row["job_name"]) == (victim["job_id"], victim["job_name"])
        assert _same_time(row["terminated_at"], victim["terminated_at"])
        cost = next(c for c in finding["impact"]["per_victim"] if c["job_id"] == victim["job_id"])
        if cost["lost_cost"] is not None:
            lost = float(row["lost_cost"]) if text else row["lost_cost"]
            assert lost == pytest.approx(cost["lost_cost"])


def test_csv_of_the_findings_and_the_victims_match_the_json_report(report, tmp_path):
    fleet = tmp_path / "fleet.csv"
    run("audit", "-q", *SOURCES, "-o", str(fleet))  # the extension decides
    _check_findings(list(csv.DictReader(io.StringIO(fleet.read_text()))), report, text=True)
    victims = run("audit", "-q", *SOURCES, "--format", "csv", "--rows", "victims")
    _check_victims(list(csv.DictReader(io.StringIO(victims))), report, text=True)


def test_json_lines_of_the_findings_and_the_victims_match_the_json_report(report, tmp_path):
    lines = run("audit", "-q", *SOURCES, "--format", "jsonl")
    _check_findings([json.loads(line) for line in lines.splitlines()], report, text=False)
    target = tmp_path / "victims.ndjson"
    run("audit", "-q", *SOURCES, "--rows", "victims", "-o", str(target))
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    _check_victims(rows, report, text=False)


def test_every_command_takes_its_formats_from_the_registry():
    """Each --format choice is a registered format and says what it writes in --help."""
    seen = set()
    for name, command in main.commands.items():
        option = next((p for p in command.params if p.name == "fmt"), None)
        if option is None:
            continue
        assert isinstance(option.type, click.Choice), name
        for choice in option.type.choices:
            assert choice in FORMATS, (name, choice)
            assert f"{choice}" in option.help and FORMATS[choice].holds in option.help
            seen.add(choice)
    assert {"csv", "jsonl", "json", "markdown", "table", "html", "png"} <= seen


def test_a_run_name_never_becomes_a_formula(copy_db):
    """A run name is the user's text: in the findings' and the victims' CSV a name starting a
    spreadsheet formula is prefixed with `'` (analyzer.render.safe), as in the timeline's."""
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE runs SET run_name = ?", params=('=HYPERLINK("http://x","web")',))
    for rows in ("findings", "victims"):
        text = run("audit", "-q", str(db), "--format", "csv", "--rows", rows)
        (row,) = csv.DictReader(io.StringIO(text))
        assert row["run_name"] == '\'=HYPERLINK("http://x","web")', row
