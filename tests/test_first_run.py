"""The first run is quiet (issue 37): files beside the evidence are skipped and said once, a
pg_dump gets the recipe that makes it auditable, and on a terminal each limitation is one line
(the whole text stays in the pipe, the reports and the JSON)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, one_line_error

from analyzer import open_sources
from analyzer.cli import main
from analyzer.render.screen import render_table

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "v0.22.5" / "seed"


@pytest.fixture(scope="module")
def sample():
    return open_sources(SAMPLE).report


def _problems(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(" ! ")]


def test_files_beside_the_evidence_are_said_once(sample):
    unrecognised = [i.path for i in sample.inputs if i.kind == "unrecognised"]
    assert len(unrecognised) == 5
    text = render_table(sample, width=100)
    (line,) = _problems(text)
    assert line.startswith(" ! not recognised, skipped (5): ")
    assert all(path in " ".join(text.split()) for path in unrecognised)


def test_a_pg_dump_says_how_to_audit_it(tmp_path):
    dump = CAPTURES / "postgres" / "seed.sql"
    error = one_line_error(CliRunner().invoke(main, ["audit", str(dump)]))
    assert "restore it (createdb dstack && psql -d dstack -f " + str(dump) in error
    assert "then audit postgresql://" in error
    folder = CliRunner().invoke(main, ["audit", str(CAPTURES / "postgres"), "--width", "200"])
    (sql,) = [line for line in _problems(folder.output) if "seed.sql" in line]
    assert "a pg_dump of a PostgreSQL database: restore it" in sql


def test_limitations_are_one_line_each_on_a_terminal_and_whole_in_a_pipe(sample):
    codes = [lim.code for lim in sample.limitations]
    for width in (60, 80, 120):
        text = render_table(sample, width=width, terminal=True)
        block = text[text.index("LIMITATIONS") : text.index("INPUTS")].splitlines()
        said = [line for line in block if line.startswith("- [")]
        assert [line.split()[1].strip("[]") for line in said] == codes
        assert len([line for line in block if line]) - len(said) <= 2  # the heading
        assert all(len(line) <= width for line in said)
    piped = " ".join(render_table(sample, width=80).split())
    assert all(" ".join(lim.message.split()) in piped for lim in sample.limitations)
