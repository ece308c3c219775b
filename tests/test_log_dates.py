"""A rich log's dates beside its database (issue 22 §1): a rich log writes times of day only, so
its dates come from the database line by line where its lines pair with what the database
recorded, and from its own day rollovers where nothing pairs. A database's time is never
replaced by one a log implies: the same log beside its database gives the database's findings,
its lines as extra provenance."""

from __future__ import annotations

import itertools
import re
from datetime import date, timedelta
from pathlib import Path

import polars as pl
import pytest
from conftest import CAPTURES, capture_id, truth_files

from analyzer import open_sources
from analyzer.synth import synthesize

EVENT_ERA = [p for p in truth_files() if p.parent.parent.name in ("v0.20", "v0.22.5")]
DAY = timedelta(days=1)


def _without_log(value, log: Path):
    """A report's dump with the log's places taken out of every provenance (`a; log:12`)."""
    if isinstance(value, dict):
        return {key: _without_log(item, log) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_log(item, log) for item in value]
    if isinstance(value, str) and f"{log}:" in value:
        return "; ".join(part for part in value.split("; ") if not part.startswith(f"{log}:"))
    return value


def _assert_database_findings(db: Path, log: Path) -> None:
    """db + log is db alone, apart from the inputs, the log's own notes and its places."""
    alone = open_sources([db]).report
    both = open_sources([db, log]).report
    skip = {"inputs", "limitations", "generated_by"}
    assert _without_log(both.model_dump(mode="json", exclude=skip), log) == alone.model_dump(
        mode="json", exclude=skip
    )
    assert {(lim.code, lim.message) for lim in alone.limitations} <= {
        (lim.code, lim.message) for lim in both.limitations
    }
    assert {lim.source for lim in both.limitations if lim not in alone.limitations} == {str(log)}
    places = [item.source for f in both.findings for item in f.evidence]
    assert not both.findings or any(f"{log}:" in place for place in places)


def _rollovers(log: Path) -> int:
    """Day changes the rich log itself shows: a printed time earlier than the one before."""
    times = re.findall(r"^\[(\d\d:\d\d:\d\d)\]", log.read_text(), flags=re.M)
    return sum(later < earlier for earlier, later in itertools.pairwise(times))


@pytest.fixture(scope="module")
def quiet_fleet(tmp_path_factory) -> Path:
    """A small synthetic fleet over four weeks: quiet days make its rich log's rollovers miss
    days (a line a day later at a later time of day shows no step back)."""
    out = tmp_path_factory.mktemp("quiet")
    synthesize(out, 30, seed=1, log_formats=("rich", "standard"))
    return out


def test_the_quiet_fleets_rich_log_spans_more_days_than_its_rollovers_show(quiet_fleet):
    log = quiet_fleet / "logs" / "server.rich.log"
    events = open_sources([quiet_fleet / "server.db"]).events
    days = events["time"].dt.date().n_unique()
    assert 1 <= _rollovers(log) < days - 1


def test_a_multi_day_rich_log_beside_its_database_gives_the_database_findings(quiet_fleet):
    log = quiet_fleet / "logs" / "server.rich.log"
    _assert_database_findings(quiet_fleet / "server.db", log)
    (aligned,) = [
        lim
        for lim in open_sources([quiet_fleet / "server.db", log]).report.limitations
        if lim.code == "log_time_aligned"
    ]
    assert "UTC+00:00" in aligned.message and "dates anchored line by line" in aligned.message
    assert "day rollovers were" in aligned.message


def test_each_line_is_dated_by_its_own_match_with_the_database(quiet_fleet):
    """Every status line the events table also holds becomes that one event, at the
    database's time (to the microsecond), however many days the rollovers missed."""
    db, log = quiet_fleet / "server.db", quiet_fleet / "logs" / "server.rich.log"
    both = open_sources([db, log]).events
    recorded = open_sources([db]).events.select("entity_id", "message", "time")
    status = both.filter(pl.col("kind").is_in(["job_status", "run_status"]))
    assert status.filter(pl.col("time_basis") != "db_utc").height == 0
    in_log = status.filter(
        pl.col("provenance").list.eval(pl.element().str.starts_with(f"{log}:")).list.any()
    )
    assert in_log.height > 100
    assert in_log.join(recorded, on=["entity_id", "message", "time"], how="anti").height == 0


def test_a_rich_log_alone_takes_its_days_from_its_rollovers(quiet_fleet):
    """Alone (dated with --log-date), each line is its true date (the standard log's, the same
    records in UTC) less the days its rollovers missed so far: none before the first quiet day,
    never fewer as the log goes on."""
    logs = quiet_fleet / "logs"
    true = open_sources([logs / "server.standard.log"], log_tz="UTC").events
    first = true["time"].min().date()
    alone = open_sources([logs / "server.rich.log"], log_date=first, log_tz="UTC").events
    lost = (
        alone.select("seq", pl.col("time").alias("alone"))
        .join(true.select("seq", pl.col("time").dt.truncate("1s")), on="seq")
        .sort("seq")
        .with_columns(
            ((pl.col("time") - pl.col("alone")) / DAY).alias("missed"),
            (pl.col("time").diff() > DAY).fill_null(False).cum_sum().alias("quiet_days"),
        )
    )
    assert lost.height == alone.height == true.height
    assert (lost["missed"] == lost["missed"].round()).all()
    assert lost["missed"].diff().drop_nulls().min() >= 0
    assert lost.filter(pl.col("quiet_days") == 0)["missed"].max() == 0
    assert lost["missed"].max() >= 1


@pytest.mark.parametrize("truth_path", EVENT_ERA, ids=capture_id)
def test_a_captures_rich_log_beside_its_database_gives_the_database_findings(truth_path):
    capture = truth_path.parent
    _assert_database_findings(capture / "server.db", capture / "logs" / "server-info.rich.log")


def test_a_captures_rich_log_from_a_server_started_the_evening_before(tmp_path):
    """The seed capture's log after the start-up lines dstack wrote at 23:58 the day before:
    its lines roll over to the next day. Beside the database, its days are the database's;
    alone, --log-date (the start's day) and the rollover give the same day."""
    seed = CAPTURES / "v0.22.5" / "seed"
    original = (seed / "logs" / "server-info.rich.log").read_text()
    width = len(original.splitlines()[0])
    start = [
        "[23:58:00] INFO     Configured the main project in ~/.dstack/config.yml",
        "           INFO     The dstack server 0.22.5 is running at http://0.0.0.0:3000",
    ]
    log = tmp_path / "server.log"
    log.write_text("".join(line.ljust(width) + "\n" for line in start) + original)
    assert _rollovers(log) == 1
    _assert_database_findings(seed / "server.db", log)
    alone = open_sources([seed / "server.db"]).report
    dated = open_sources([log], log_date=date(2026, 11, 1), log_tz="UTC").report
    assert dated.findings[0].victims[0].terminated_at == alone.findings[0].victims[
        0
    ].terminated_at.replace(microsecond=0)


@pytest.fixture(scope="module")
def berlin_fleet(tmp_path_factory) -> Path:
    """A fleet whose logs are written in Europe/Berlin: the clocks go back an hour on
    2026-10-25 and no line of the logs steps back far enough to show it."""
    out = tmp_path_factory.mktemp("berlin")
    synthesize(out, 60, seed=2, log_tz="Europe/Berlin", log_formats=("rich", "standard"))
    return out


@pytest.mark.parametrize("fmt", ["rich", "standard"])
def test_a_log_across_a_daylight_saving_change_beside_its_database(berlin_fleet, fmt):
    log = berlin_fleet / "logs" / f"server.{fmt}.log"
    _assert_database_findings(berlin_fleet / "server.db", log)
    report = open_sources([berlin_fleet / "server.db", log]).report
    (aligned,) = [lim for lim in report.limitations if lim.code == "log_time_aligned"]
    assert "= UTC+02:00" in aligned.message and "on UTC+01:00" in aligned.message
    stops = [v.terminated_at for f in report.findings for v in f.victims if v.terminated_at]
    assert any(stop.date() > date(2026, 10, 25) for stop in stops)
