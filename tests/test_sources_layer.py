"""The sources layer's shared parts: the registry, the load context, the one clock aligner and
the one job-to-run attacher, on hand-built frames and the real seed capture."""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from conftest import CAPTURES

import analyzer.sources as registry
from analyzer.sources import claimed, load_path, sniff
from analyzer.sources.attach import attach_job_runs
from analyzer.sources.base import LoadContext, ReadOptions
from analyzer.sources.clock import QUARTER_HOUR_US, majority_shift

SEED = CAPTURES / "v0.22.5" / "seed"
HOUR_US = 3_600_000_000


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        ("-", "log"),
        ("postgresql://u:p@db:5432/dstack", "postgresql"),
        ("postgresql+asyncpg://db/dstack", "postgresql"),
        ("https://dstack.example.com", "dstack-api-collection"),
        ("dstack:main", "dstack-api-collection"),
        ("s3://bucket/audit", "dataset"),
        ("gs://bucket/audit", "dataset"),
    ],
)
def test_what_is_not_a_path_is_claimed_by_one_source(given, kind):
    assert claimed(given).kind == kind


def test_a_path_is_not_claimed_but_sniffed_by_content():
    assert claimed(str(SEED / "server.db")) is None
    assert sniff(SEED / "server.db").kind == "sqlite"
    assert sniff(SEED / "tables").kind == "table-export"
    assert sniff(SEED / "logs" / "server-info.standard.log").kind == "log"


def test_read_options_travel_in_the_context_not_a_global():
    assert not hasattr(registry, "READ_OPTIONS")
    (whole,) = load_path(SEED / "server.db", LoadContext("s"))
    (none,) = load_path(
        SEED / "server.db", LoadContext("s", ReadOptions(project="no-such-project"))
    )
    assert whole.runs.height > 0
    assert none.runs.height == 0


def _pairs(diffs: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {"source": ["log"] * len(diffs), "voter": list(range(len(diffs))), "diff": diffs},
        schema={"source": pl.String, "voter": pl.Int64, "diff": pl.Int64},
    )


def test_majority_shift_is_the_quarter_hour_most_pairs_agree_on():
    diffs = [HOUR_US + 400_000, HOUR_US - 1_500_000, HOUR_US, 0, 7 * QUARTER_HOUR_US // 2]
    (row,) = majority_shift(
        _pairs(diffs), "source", early_us=2_000_000, late_us=2_000_000
    ).iter_rows(named=True)
    # the half-way pair (7.5 min from any quarter hour) votes for nothing
    assert row == {"source": "log", "shift": HOUR_US, "agree": 3, "matched": 4}


def test_majority_shift_tolerance_is_one_sided_when_asked():
    late = [HOUR_US + 2_500_000] * 2 + [-2_500_000]
    assert majority_shift(_pairs(late), "source", early_us=2_000_000, late_us=3_000_000)[
        "shift"
    ].to_list() == [HOUR_US]


def test_majority_shift_tie_goes_to_the_shift_voted_for_first():
    shifts = majority_shift(_pairs([0, HOUR_US]), "source", early_us=1, late_us=1)
    assert shifts["shift"].to_list() == [0]
    assert shifts["agree"].to_list() == [1]


T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _events(rows: list[tuple[str, str, str | None, datetime]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "server": ["s"] * len(rows),
            "entity_type": [r[0] for r in rows],
            "entity_id": [r[1] for r in rows],
            "entity_name": [r[1] for r in rows],
            "run_id": [r[2] for r in rows],
            "time": [r[3] for r in rows],
        }
    )


def test_a_job_event_takes_its_run_from_the_job_row_then_from_the_run_alive_by_name():
    events = _events(
        [
            ("run", "web", "r1", T0),
            ("job", "web-0-0", None, T0 + timedelta(minutes=1)),  # its row exists
            ("job", "web-1-0", None, T0 + timedelta(minutes=2)),  # row deleted; r1 alive
            ("job", "api-0-0", None, T0 + timedelta(minutes=3)),  # two runs named api alive
            ("job", "gone-0-0", None, T0 + timedelta(minutes=4)),  # no run of that name
        ]
    )
    jobs = pl.DataFrame({"server": ["s"], "job_id": ["web-0-0"], "run_id": ["r1"]})
    runs = pl.DataFrame(
        {
            "run_id": ["r1", "a1", "a2"],
            "run_name": ["web", "api", "api"],
            "submitted_at": [T0, T0, T0],
            "last_processed_at": [T0 + timedelta(hours=1)] * 3,
        }
    )
    attached = attach_job_runs(events, jobs=jobs, runs=runs)
    assert attached["entity_id"].to_list() == events["entity_id"].to_list()  # order kept
    assert attached["run_id"].to_list() == ["r1", "r1", "r1", None, None]


def test_a_job_event_of_a_run_no_longer_alive_is_not_guessed():
    events = _events([("job", "web-0-0", None, T0 + timedelta(hours=2))])
    runs = pl.DataFrame(
        {
            "run_id": ["r1"],
            "run_name": ["web"],
            "submitted_at": [T0],
            "last_processed_at": [T0 + timedelta(hours=1)],
        }
    )
    assert attach_job_runs(events, runs=runs)["run_id"].to_list() == [None]


_OPENED: list[str] = []


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and _OPENED and isinstance(args[0], str) and args[0].startswith(_OPENED[0]):
        _OPENED.append(args[0])


sys.addaudithook(_count_opens)


def test_each_file_is_recognised_from_one_read_of_its_head(tmp_path):
    """Every source is asked about every file (and the API export's folder walk asks again):
    they all look at one head, read once per version of the file; a file that changes is
    read again."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    for part in ("server.db", "logs/server-info.standard.log", "api/runs_list/acme/page-001.json"):
        shutil.copy(SEED / part, folder / Path(part).name)
    _OPENED.append(str(folder))
    try:
        kinds = {path.name: sniff(path).kind for path in sorted(folder.iterdir())}
        assert sniff(folder) is None or sniff(folder).kind  # the folder walk asks each file again
        kinds_again = {path.name: sniff(path).kind for path in sorted(folder.iterdir())}
        opened = _OPENED[1:]
        log = folder / "server-info.standard.log"
        log.write_bytes(log.read_bytes() + b"\n")
        del _OPENED[1:]
        assert sniff(log).kind == "log"
        reopened = _OPENED[1:]
    finally:
        _OPENED.clear()
    assert (
        kinds
        == kinds_again
        == {
            "page-001.json": "api-export",
            "server-info.standard.log": "log",
            "server.db": "sqlite",
        }
    )
    assert sorted(opened) == sorted(str(path) for path in folder.iterdir())
    assert reopened == [str(log)]
