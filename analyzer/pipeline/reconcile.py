"""Logs and databases told together: one clock, one identity, one event seen once.

- Time: log times are local without a zone (standard/json) or time-of-day only (rich). With a
  database in the audit, the offset (and, for rich, the date) is inferred by aligning log lines
  with what the database recorded at the same instant (events.recorded_at, or the final status
  of runs and jobs at last_processed_at). Otherwise --log-tz / --log-date apply, or the times
  stay as written and a limitation says so. Ordering inside one log never depends on a date.
- Identity: logs show 6-hex id prefixes; with a database they become full ids (prefix and name
  must both match).
- One event, two provenances: a log line and the events-table row of the same event merge.
- Runs the database does not hold (log-only audits) get runs and jobs rows derived from their
  events, so the same detector runs on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl

from analyzer.catalogue import EVENT_COLUMNS
from analyzer.dstack import (
    ENDED_JOB_STATUSES,
    FINISHED_JOB_STATUSES,
    FINISHED_RUN_STATUSES,
    IN_PLACE_CHANGES,
    REPLICA_COUNT_CHANGES,
)
from analyzer.errors import AuditInputError
from analyzer.model import (
    EVENTS_SCHEMA,
    JOBS_SCHEMA,
    RUNS_SCHEMA,
    UTC_TIME,
    conform,
)
from analyzer.pipeline.evidence import Evidence
from analyzer.sources.attach import attach_job_runs as attach_runs
from analyzer.sources.base import Limitation
from analyzer.sources.clock import majority_shift, quarter_hour

MATCH_TOLERANCE_US = 2_000_000  # log ms (or rich s) precision against the DB's microseconds
UNALIGNED = ("log_local_unaligned", "time_of_day_only")
DAY_US = 24 * 3600 * 1_000_000


@dataclass
class TimeOptions:
    log_tz: str | None = None  # IANA zone or +HH:MM of the server's local time
    log_date: date | None = None  # the date of a rich log's first line


def _msg_key(expr: pl.Expr) -> pl.Expr:
    return expr.fill_null("").str.replace_all(r"\s+", "")


def _anchors(evidence: Evidence, db_events: pl.DataFrame) -> pl.DataFrame:
    """Moments the database recorded, with what a log line at the same instant would say."""
    from_events = db_events.select(
        "server",
        "entity_type",
        "entity_name",
        "entity_id",
        "time",
        _msg_key(pl.col("message")).alias("key"),
    )

    def finals(frame: pl.DataFrame, kind: str, statuses: tuple[str, ...]) -> pl.DataFrame:
        """A finished run or job: its final status was written at last_processed_at."""
        return frame.filter(pl.col("status").is_in(list(statuses))).select(
            "server",
            pl.lit(kind).alias("entity_type"),
            pl.col(f"{kind}_name").alias("entity_name"),
            pl.col(f"{kind}_id").alias("entity_id"),
            pl.col("last_processed_at").alias("time"),
            pl.format("status:{}", pl.col("status")).alias("key"),
        )

    final_jobs = finals(evidence.jobs, "job", FINISHED_JOB_STATUSES)
    final_runs = finals(evidence.runs, "run", FINISHED_RUN_STATUSES)
    return pl.concat([from_events, final_jobs, final_runs], how="vertical_relaxed").drop_nulls(
        ["time", "entity_id"]
    )


def _log_keys(log_events: pl.DataFrame) -> pl.DataFrame:
    """Each log line keyed by its text, and a finished status once more by the status alone
    (as `_anchors` keys the database's final rows)."""
    placed = ("server", "source", "seq", "entity_type", "entity_name", "entity_id", "time")
    finished = pl.col("new_status").is_in([*FINISHED_JOB_STATUSES, *FINISHED_RUN_STATUSES])
    return pl.concat(
        [
            log_events.select(*placed, _msg_key(pl.col("message")).alias("key")),
            log_events.filter(finished).select(
                *placed, pl.format("status:{}", pl.col("new_status")).alias("key")
            ),
        ]
    )


def _pairs(log_events: pl.DataFrame, anchors: pl.DataFrame) -> pl.DataFrame:
    """Each log line (`voter`: its seq) with each database moment it may be: the same entity
    (id prefix and name) saying the same thing; `diff` is the database's time minus the log's."""
    return (
        _log_keys(log_events)
        .join(anchors, on=["server", "entity_type", "entity_name", "key"], suffix="_db")
        .filter(
            pl.col("entity_id_db").str.replace_all("-", "").str.starts_with(pl.col("entity_id"))
        )
        .select(
            "source",
            pl.col("seq").alias("voter"),
            (pl.col("time_db") - pl.col("time")).dt.total_microseconds().alias("diff"),
        )
    )


def _zone_part(diff: pl.Expr | int) -> pl.Expr | int:
    """A rich log's difference (an expression or a number) without its whole days, in
    [-12 h, 12 h): the days are anchored line by line (`_line_shifts`), the zone is the log's."""
    half = DAY_US // 2
    return (diff + half) % DAY_US - half


def infer_offsets(log_events: pl.DataFrame, pairs: pl.DataFrame, rich: pl.Series) -> pl.DataFrame:
    """Per log source: the shift (a whole number of quarter hours; for rich, the zone only)
    that most of its lines agree on with the database (`pairs`, from `_pairs`), and how many
    agree."""
    pairs = pairs.with_columns(
        pl.when(pl.col("source").is_in(rich.implode()))
        .then(_zone_part(pl.col("diff")))
        .otherwise(pl.col("diff"))
        .alias("diff")
    )
    totals = log_events.group_by("source").agg(pl.col("seq").n_unique().alias("lines"))
    shifts = majority_shift(
        pairs, "source", early_us=MATCH_TOLERANCE_US, late_us=MATCH_TOLERANCE_US
    )
    return shifts.join(totals, on="source", how="left", maintain_order="left")


def _line_shifts(log_events: pl.DataFrame, pairs: pl.DataFrame, rich: pl.Series) -> pl.DataFrame:
    """Each log line's shift, line by line: a line that pairs with exactly one database moment
    at one of the log's offsets takes that moment's shift (for rich, its zone and its day);
    every other line the shift of the nearest such line. So a rich log's quiet days (a line a
    day later at a later time of day shows no rollover) and a clock that changed its offset
    (daylight saving) cannot move a line away from the database's moment. An offset is the
    log's when two lines or more agree on it, or no other has more: one pair at a whole
    quarter hour is more likely two different moments. Returns `source`, `seq`, `_shift`,
    `_zone` (the shift less whole days, for rich), `_day` and `_anchored`."""
    is_rich = pl.col("source").is_in(rich.implode())
    zone = pl.when(is_rich).then(_zone_part(pl.col("_shift"))).otherwise(pl.col("_shift"))
    votes = (
        pairs.with_columns(quarter_hour(pl.col("diff")).alias("_shift"))
        .filter((pl.col("diff") - pl.col("_shift")).abs() <= MATCH_TOLERANCE_US)
        .with_columns(zone.alias("_zone"))
    )
    zones = (
        votes.group_by("source", "_zone")
        .agg(pl.col("voter").n_unique().alias("_agree"))
        .filter(
            (pl.col("_agree") >= 2) | (pl.col("_agree") == pl.col("_agree").max().over("source"))
        )
        .select("source", "_zone")
    )
    own = (
        votes.join(zones, on=["source", "_zone"])
        .group_by("source", "voter")
        .agg(pl.col("_shift").unique())
        .filter(pl.col("_shift").list.len() == 1)
        .select("source", pl.col("voter").alias("seq"), pl.col("_shift").list.first())
    )
    lines = (
        log_events.filter(pl.col("source").is_in(own["source"].unique().implode()))
        .select("source", "seq", "time")
        .unique(["source", "seq"], keep="first")
        .join(own, on=["source", "seq"], how="left")
        .sort("time")
    )
    return (
        lines.select("source", "seq", "time", pl.col("_shift").is_not_null().alias("_anchored"))
        .join_asof(
            lines.filter(pl.col("_shift").is_not_null()).select("source", "time", "_shift"),
            on="time",
            by="source",
            strategy="nearest",
            check_sortedness=False,
        )
        .with_columns(zone.alias("_zone"))
        .select(
            "source",
            "seq",
            "_shift",
            "_zone",
            ((pl.col("_shift") - pl.col("_zone")) // DAY_US).alias("_day"),
            "_anchored",
        )
    )


def _shift_label(shift_us: int, basis: str) -> str:
    minutes = (
        round(-shift_us / 60_000_000) % (24 * 60)
        if basis == "time_of_day_only"
        else round(-shift_us / 60_000_000)
    )
    if basis == "time_of_day_only":
        minutes = minutes if minutes <= 12 * 60 else minutes - 24 * 60
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


CLOCK_JUMP_US = 10 * 60 * 1_000_000  # a local clock going back further than this jumped


def _clock_jumps(evidence: Evidence) -> pl.DataFrame:
    """Local log clocks that go back (a daylight-saving fall-back repeats an hour): later lines
    are shifted forward by the jump so times follow the line order again; the written time is
    kept in `_raw_time`, and `_after_jump` marks lines past a jump (for zone conversion)."""
    events = evidence.events.with_columns(pl.col("time").alias("_raw_time"))
    local = pl.col("time_basis") == "log_local_unaligned"
    if not events.select(local.any()).item():  # no local clock (a database): nothing jumps
        return events.with_columns(pl.lit(False).alias("_after_jump"))
    # the shifts worked out in line order on the columns they need, then put beside the events
    ordered = (
        events.select("source", "seq", "time", "time_basis")
        .with_row_index("_i")
        .sort("source", "seq")
    )
    back = (pl.col("time").shift(1).over("source") - pl.col("time")).dt.total_microseconds()
    jump = pl.when(local & (back > CLOCK_JUMP_US)).then(quarter_hour(back)).otherwise(0)
    ordered = ordered.with_columns(jump.alias("_jump")).with_columns(
        pl.col("_jump").cum_sum().over("source").alias("_shift_us")
    )
    jumps = ordered.filter(pl.col("_jump") > 0)
    for source, count, total in (
        jumps.group_by("source").agg(pl.len(), pl.col("_jump").sum()).iter_rows()
    ):
        evidence.limitations.append(
            Limitation(
                "log_clock_went_back",
                f"the log's local clock went back {count} time(s) (by {total / 3.6e9:.2f} h in "
                "all; daylight saving?): later lines are kept in line order",
                source,
            )
        )
    shifted = ordered.select(
        "_i",
        (pl.col("time") + pl.duration(microseconds=pl.col("_shift_us"))).alias("time"),
        (pl.col("_shift_us") > 0).alias("_after_jump"),
    ).sort("_i")
    # one chunk again: the events of several sources come in several, and columns chunked
    # unlike the others would be realigned by every later query over them
    return events.with_columns(shifted["time"], shifted["_after_jump"]).rechunk()


def align_times(evidence: Evidence, options: TimeOptions) -> None:
    evidence.events = _clock_jumps(evidence)
    events = evidence.events
    log_mask = pl.col("time_basis").is_in(list(UNALIGNED))
    log_events = events.filter(log_mask)
    if log_events.height == 0:
        return
    db_events = events.filter(pl.col("time_basis") == "db_utc")
    anchors = _anchors(evidence, db_events)
    rich = log_events.filter(pl.col("time_basis") == "time_of_day_only")["source"].unique()
    # without a database moment (a log-only audit) no log line is keyed to be matched
    pairs = _pairs(log_events, anchors) if anchors.height else pl.DataFrame()
    offsets = infer_offsets(log_events, pairs, rich) if pairs.height else pl.DataFrame()
    if offsets.height == 0:
        evidence.events = _apply_options(events, options, evidence)
        return
    lines = _line_shifts(log_events, pairs, rich)
    for row in offsets.iter_rows(named=True):
        basis = "time_of_day_only" if row["source"] in rich else ""
        evidence.limitations.append(
            Limitation(
                "log_time_aligned",
                f"log times aligned with the database: of {row['lines']} lifecycle lines, "
                f"{row['matched']} match a moment the database recorded and {row['agree']} of "
                f"those agree on local time = {_shift_label(row['shift'], basis)}"
                + _line_by_line(lines.filter(pl.col("source") == row["source"]), row, basis),
                row["source"],
            )
        )
    adjusted = (
        events.join(
            offsets.select("source", pl.col("shift").alias("_source_shift")),
            on="source",
            how="left",
            maintain_order="left",
        )
        .join(
            lines.select("source", "seq", "_shift"),
            on=["source", "seq"],
            how="left",
            maintain_order="left",
        )
        .with_columns(pl.coalesce("_shift", "_source_shift").alias("_shift"))
        .with_columns(
            pl.when(log_mask & pl.col("_shift").is_not_null())
            .then(pl.col("time") + pl.duration(microseconds=pl.col("_shift")))
            .otherwise(pl.col("time"))
            .alias("time"),
            pl.when(log_mask & pl.col("_shift").is_not_null())
            .then(pl.lit("log_local_offset_inferred"))
            .otherwise(pl.col("time_basis"))
            .alias("time_basis"),
        )
        .drop("_shift", "_source_shift")
    )
    evidence.events = _apply_options(adjusted, options, evidence)


def _line_by_line(lines: pl.DataFrame, majority: dict, basis: str) -> str:
    """What the line-by-line alignment found beyond the majority offset, for its note: other
    offsets the log's clock took (daylight saving?), and for rich how its dates were found."""
    if lines.height == 0:
        return ""
    others = (
        lines.filter(
            pl.col("_anchored")
            & (pl.col("_zone") != (_zone_part(majority["shift"]) if basis else majority["shift"]))
        )
        .group_by("_zone")
        .len()
        .sort("len", "_zone", descending=[True, False])
    )
    note = ", ".join(
        f"{count} on {_shift_label(zone, basis)}" for zone, count in others.iter_rows()
    )
    if note:
        note = f", {note} (the log's clock changed its offset: daylight saving?)"
    if basis != "time_of_day_only":
        return note
    anchored = int(lines["_anchored"].sum())
    missed = int(lines["_day"].max() - lines["_day"].min())
    return (
        f"{note}; dates anchored line by line: {anchored} of {lines.height} lines by their own "
        "match, the others from the nearest matched line"
        + (f" (its own day rollovers were {missed} day(s) off)" if missed else "")
    )


def _to_utc(local: pl.Expr, zone: str, *, after_jump: pl.Expr | None = None) -> pl.Expr:
    """Naive local times in `zone` (an IANA name or a fixed offset like +02:00) -> UTC."""
    fixed = re.fullmatch(r"([+-])(\d{2}):?(\d{2})", zone.strip())
    if fixed:
        sign = 1 if fixed.group(1) == "+" else -1
        minutes = sign * (int(fixed.group(2)) * 60 + int(fixed.group(3)))
        return (local - pl.duration(minutes=minutes)).dt.replace_time_zone("UTC")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise AuditInputError(
            "--log-tz", f"unknown time zone {zone!r}", "use an IANA name or an offset like +02:00"
        ) from None
    # A repeated hour is the first pass before the clock went back, the second after it.
    ambiguous = (
        pl.when(after_jump).then(pl.lit("latest")).otherwise(pl.lit("earliest"))
        if after_jump is not None
        else "earliest"
    )
    return (
        local.dt.replace_time_zone(zone, ambiguous=ambiguous, non_existent="null")
        .dt.convert_time_zone("UTC")
        .cast(UTC_TIME)
    )


def _apply_options(events: pl.DataFrame, options: TimeOptions, evidence: Evidence) -> pl.DataFrame:
    if options.log_date is not None:
        rich = pl.col("time_basis") == "time_of_day_only"
        shift_days = (options.log_date - date(1970, 1, 1)).days
        events = events.with_columns(
            pl.when(rich)
            .then(pl.col("time") + pl.duration(days=shift_days))
            .otherwise(pl.col("time"))
            .alias("time"),
            pl.when(rich)
            .then(pl.col("_raw_time") + pl.duration(days=shift_days))
            .otherwise(pl.col("_raw_time"))
            .alias("_raw_time"),
            pl.when(rich)
            .then(pl.lit("log_local_unaligned"))
            .otherwise(pl.col("time_basis"))
            .alias("time_basis"),
        )
    unaligned = pl.col("time_basis") == "log_local_unaligned"
    if options.log_tz:
        written = pl.col("_raw_time").dt.replace_time_zone(None)
        events = events.with_columns(
            pl.when(unaligned)
            .then(_to_utc(written, options.log_tz, after_jump=pl.col("_after_jump")))
            .otherwise(pl.col("time"))
            .alias("time"),
            pl.when(unaligned)
            .then(pl.lit("log_local_offset_given"))
            .otherwise(pl.col("time_basis"))
            .alias("time_basis"),
        )
    # each source once, in the events' order (a hash set's order changed from run to run)
    for source in events.filter(unaligned)["source"].unique(maintain_order=True).to_list():
        evidence.limitations.append(
            Limitation(
                "log_time_zone_unknown",
                "log times are the server's local time without a zone and no database event "
                "could align them: shown as written (taken as UTC); give --log-tz to convert",
                source,
            )
        )
    for source in (
        events.filter(pl.col("time_basis") == "time_of_day_only")["source"]
        .unique(maintain_order=True)
        .to_list()
    ):
        evidence.limitations.append(
            Limitation(
                "log_time_of_day_only",
                "rich log: times of day only, no date and no zone (nothing to align them with); "
                "events are ordered as the log wrote them; give --log-date (and --log-tz) to "
                "date them",
                source,
            )
        )
    return events.with_columns(
        pl.when(pl.col("time_basis") == "log_local_unaligned")
        .then(pl.lit("log_local_assumed_utc"))
        .otherwise(pl.col("time_basis"))
        .alias("time_basis")
    )


def attach_job_runs(evidence: Evidence) -> None:
    """Job events that name no run (API pages, logs) get it from the job's row of any source
    of the same server (analyzer.sources.attach)."""
    evidence.events = attach_runs(evidence.events, jobs=evidence.jobs)


def resolve_ids(evidence: Evidence) -> None:
    """6-hex log prefixes -> full ids where the database holds exactly one match."""
    events = evidence.events
    short = pl.col("entity_id").str.len_chars() == 6
    if events.filter(short).height == 0 or (
        evidence.jobs.height == 0 and evidence.runs.height == 0
    ):
        return
    jobs = evidence.jobs.select(
        "server",
        pl.lit("job").alias("entity_type"),
        pl.col("job_id").str.slice(0, 6).alias("entity_id"),
        pl.col("job_name").alias("entity_name"),
        pl.col("job_id").alias("_full"),
        pl.col("run_id").alias("_run"),
    )
    runs = evidence.runs.select(
        "server",
        pl.lit("run").alias("entity_type"),
        pl.col("run_id").str.slice(0, 6).alias("entity_id"),
        pl.col("run_name").alias("entity_name"),
        pl.col("run_id").alias("_full"),
        pl.col("run_id").alias("_run"),
    )
    # Jobs dstack deleted (superseded no-capacity submissions, 0.20.29+) are known only from
    # the events table: their full ids resolve the log's prefixes too, so each event is one.
    deleted_jobs = events.filter(
        (pl.col("time_basis") == "db_utc") & (pl.col("entity_type") == "job") & ~short
    ).select(
        "server",
        "entity_type",
        pl.col("entity_id").str.replace_all("-", "").str.slice(0, 6).alias("_prefix"),
        "entity_name",
        pl.col("entity_id").alias("_full"),
        pl.col("run_id").alias("_run"),
    )
    known = (
        pl.concat(
            [
                jobs.rename({"entity_id": "_prefix"}),
                runs.rename({"entity_id": "_prefix"}),
                deleted_jobs,
            ],
            how="vertical_relaxed",
        )
        .unique(["server", "entity_type", "_full"], keep="first", maintain_order=True)
        .filter(pl.len().over(["server", "entity_type", "_prefix", "entity_name"]) == 1)
        .rename({"_prefix": "entity_id"})
    )
    run_prefixes = runs.select(
        "server", pl.col("entity_id").alias("run_id"), pl.col("_full").alias("_run_by_prefix")
    ).filter(pl.len().over(["server", "run_id"]) == 1)
    evidence.events = (
        events.join(
            known,
            on=["server", "entity_type", "entity_id", "entity_name"],
            how="left",
            maintain_order="left",
        )
        .join(run_prefixes, on=["server", "run_id"], how="left", maintain_order="left")
        .with_columns(
            pl.coalesce("_full", "entity_id").alias("entity_id"),
            pl.coalesce("_run", "_run_by_prefix", "run_id").alias("run_id"),
        )
        .drop("_full", "_run", "_run_by_prefix")
    )


def merge_duplicates(evidence: Evidence) -> None:
    """A log line and a database row of the same event become one event, two provenances."""
    events = evidence.events.with_row_index("_row")
    db = events.filter(pl.col("time_basis") == "db_utc")
    logs = events.filter(pl.col("time_basis") != "db_utc")
    if db.height == 0 or logs.height == 0:
        return
    key = ["server", "entity_type", "entity_id", "_key"]
    pairs = (
        logs.select("_row", "source", "time", *key[:3], _msg_key(pl.col("message")).alias("_key"))
        .join(
            db.select(
                pl.col("_row").alias("_db_row"),
                pl.col("time").alias("_db_time"),
                *key[:3],
                _msg_key(pl.col("message")).alias("_key"),
            ),
            on=key,
        )
        .with_columns(
            (pl.col("_db_time") - pl.col("time")).dt.total_microseconds().abs().alias("_gap")
        )
        .filter(pl.col("_gap") <= MATCH_TOLERANCE_US)
        .sort("_gap")
        .unique("_row", keep="first", maintain_order=True)
        .unique(["_db_row", "source"], keep="first", maintain_order=True)
    )
    extra = (
        pairs.join(logs.select("_row", pl.col("provenance").alias("_log_prov")), on="_row")
        .group_by("_db_row")
        .agg(pl.col("_log_prov").list.explode(keep_nulls=False, empty_as_null=False))
    )
    merged_db = (
        db.join(extra, left_on="_row", right_on="_db_row", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("_log_prov").is_not_null())
            .then(pl.concat_list("provenance", "_log_prov"))
            .otherwise(pl.col("provenance"))
            .alias("provenance")
        )
        .drop("_log_prov")
    )
    remaining = logs.join(pairs.select("_row"), on="_row", how="anti")
    _say_unmatched(evidence, db, logs, remaining.filter(pl.col("origin") == "event_line"))
    evidence.events = (
        pl.concat([merged_db, remaining], how="vertical_relaxed")
        .drop("_row")
        .sort(["server", "time", "seq"], nulls_last=True)
    )


def _say_unmatched(
    evidence: Evidence, db: pl.DataFrame, logs: pl.DataFrame, unmatched: pl.DataFrame
) -> None:
    """Log event lines the same server's events table does not hold, with the reason that is
    true: older than every event the table kept (its TTL, 30 days by default, deleted them),
    or inside the span it kept (a rolled-back transaction, or another state of the server)."""
    spans = db.group_by("server").agg(
        pl.col("time").min().alias("_first"), pl.col("time").max().alias("_last")
    )
    log_spans = logs.group_by("source").agg(
        pl.col("time").min().alias("_log_first"), pl.col("time").max().alias("_log_last")
    )
    counted = (
        unmatched.join(spans, on="server")
        .join(log_spans, on="source")
        .filter(
            (pl.col("_log_last") >= pl.col("_first")) & (pl.col("_log_first") <= pl.col("_last"))
        )
        .group_by("source")
        .agg(
            (pl.col("time") < pl.col("_first")).sum().alias("older"),
            (pl.col("time") >= pl.col("_first")).sum().alias("within"),
        )
        .sort("source")
    )
    for source, older, within in counted.iter_rows():
        if older:
            evidence.limitations.append(
                Limitation(
                    "log_events_past_events_ttl",
                    f"{older} log line(s) describe events older than any the events table "
                    "holds (deleted past the events TTL, 30 days by default); they are kept "
                    "as log-only evidence",
                    source,
                )
            )
        if within:
            evidence.limitations.append(
                Limitation(
                    "log_events_missing_from_database",
                    f"{within} log line(s) describe events the events table does not hold "
                    "although it holds events of that time (the writing transaction rolled "
                    "back, or the database is another state of the server); they are kept as "
                    "log-only evidence",
                    source,
                )
            )


# the events' columns the runs and jobs are derived from (the others are not sorted with them):
# who and when, and every field the catalogue parses out of a message
_DERIVED_FROM = (
    "server",
    "seq",
    "time",
    "entity_type",
    "entity_id",
    "entity_name",
    "run_id",
    *EVENT_COLUMNS,
    "actor",
    "message",
    "provenance",
)


def derive_from_events(evidence: Evidence) -> None:
    """Runs and jobs rows for runs known only from events (log-only audits, or a run row
    left out as damaged)."""
    events = evidence.events.select(_DERIVED_FROM).filter(pl.col("run_id").is_not_null())
    if evidence.runs.height:  # a log-only audit knows no run: every event is an orphan's
        known_runs = evidence.runs.select("server", "run_id")
        events = events.join(known_runs, on=["server", "run_id"], how="anti")
    if events.height == 0:
        return
    orphan = events.sort(["server", "time", "seq"], nulls_last=True).with_row_index("_order")
    evidence.runs = pl.concat(
        [evidence.runs, conform(_derive_runs(orphan), RUNS_SCHEMA).collect()], how="vertical"
    )
    # a job the tables hold keeps its row (its run's row may be missing: damaged, left out)
    derived = conform(_derive_jobs(orphan), JOBS_SCHEMA).join(
        evidence.jobs.lazy().select("server", "job_id"), on=["server", "job_id"], how="anti"
    )
    evidence.jobs = pl.concat([evidence.jobs, derived.collect()], how="vertical")


def _derive_runs(events: pl.DataFrame) -> pl.DataFrame:
    run = pl.col("entity_type") == "run"
    status = run & (pl.col("kind") == "run_status")
    return (
        events.group_by(["server", "run_id"])
        .agg(
            pl.col("entity_name").filter(run).first().alias("run_name"),
            pl.col("entity_name")
            .filter(~run)
            .first()
            .str.replace(r"-\d+-\d+$", "")
            .alias("_job_run"),
            pl.when(
                pl.col("message").str.contains(r"^(?:Service ?|service is registered as )").any()
                | pl.col("kind")
                .is_in(["job_ready", "job_registered", "run_updated", "run_scaling"])
                .any()
            )
            .then(pl.lit("service"))
            # BaseJobConfigurator names a job f"{run_name}-{job_num}-{replica_num}" and only
            # TaskJobConfigurator makes more than one job (node) per replica: job_num > 0 is a task
            .when(
                pl.col("entity_name")
                .filter(pl.col("entity_type") == "job")
                .str.contains(r"-[1-9]\d*-\d+$")
                .any()
            )
            .then(pl.lit("task"))
            .alias("run_type"),
            pl.col("new_status")
            .filter(status | (run & (pl.col("kind") == "run_submitted")))
            .last()
            .alias("status"),
            pl.col("termination_reason")
            .filter(status)
            .drop_nulls()
            .first()
            .alias("termination_reason"),
            pl.col("deployment_num")
            .filter(run & (pl.col("kind") == "run_updated"))
            .max()
            .alias("_dep"),
            (run & (pl.col("kind") == "run_scaling") & (pl.col("changed_fields") == "UP"))
            .sum()
            .alias("_ups"),
            pl.col("time").min().alias("submitted_at"),
            pl.col("time").max().alias("last_processed_at"),
            pl.col("actor")
            .filter(run & (pl.col("kind") == "run_submitted"))
            .first()
            .str.replace("^user ", "")
            .alias("user"),
            pl.col("provenance").first().list.first().alias("provenance"),
            (pl.col("kind") == "run_updated").any().alias("_has_updates"),
        )
        .with_columns(
            pl.coalesce("run_name", "_job_run").alias("run_name"),
            pl.lit(False).alias("deleted"),
            pl.coalesce("_dep", pl.when(~pl.col("_has_updates")).then(pl.col("_ups")), pl.lit(0))
            .cast(pl.Int64)
            .alias("deployment_num"),
        )
    )


def _derive_jobs(events: pl.DataFrame) -> pl.DataFrame:
    """Jobs from their events. Deployment: the run's last 'Run updated' before the job was
    created, raised by bumps ('Job updated', or an update of in-place fields only while the job
    was active); without 'Run updated' lines (0.19), each 'scaling UP' of a running run is
    counted as a suspected new deployment."""
    jobs = events.filter(pl.col("entity_type") == "job")
    if jobs.height == 0:
        return pl.DataFrame()
    status = pl.col("kind") == "job_status"
    terminating = status & (pl.col("new_status").is_in(ENDED_JOB_STATUSES))
    per_job = jobs.group_by(["server", "run_id", "entity_id"]).agg(
        pl.col("entity_name").first().alias("job_name"),
        pl.col("_order").min().alias("_first"),
        pl.col("_order").max().alias("_last"),
        pl.col("time").min().alias("submitted_at"),
        pl.col("time").max().alias("last_processed_at"),
        pl.col("new_status").filter(status).last().alias("status"),
        pl.col("termination_reason")
        .filter(terminating)
        .drop_nulls()
        .first()
        .alias("termination_reason"),
        pl.col("termination_message")
        .filter(terminating)
        .drop_nulls()
        .first()
        .alias("termination_reason_message"),
        pl.col("termination_message")
        .filter(pl.col("kind") == "job_exit_status")
        .first()
        .cast(pl.Int64, strict=False)
        .alias("exit_status"),
        (
            pl.col("new_status").is_in(["provisioning", "pulling", "running"]).any()
            | pl.col("old_status").is_in(["provisioning", "pulling", "running"]).any()
            | (pl.col("kind") == "job_provisioned").any()
        ).alias("has_provisioning_data"),
        pl.when((pl.col("kind") == "graceful_stop").any())
        .then(pl.lit(1, pl.Int64))
        .alias("graceful_termination_attempts"),
        pl.col("deployment_num").filter(pl.col("kind") == "job_updated").max().alias("_bumped"),
        pl.col("_order")
        .filter(pl.col("new_status").is_in(ENDED_JOB_STATUSES))
        .min()
        .alias("_ended"),
        pl.col("provenance").first().list.first().alias("provenance"),
    )
    runs = events.filter(pl.col("entity_type") == "run")
    updates = runs.filter(pl.col("kind") == "run_updated").select(
        "server",
        "run_id",
        pl.col("_order").alias("_u_order"),
        pl.col("deployment_num").alias("_u_dep"),
        pl.col("changed_fields"),
    )
    # Suspected deployments from 'scaling UP' lines, only for runs without 'Run updated' lines.
    ups = (
        runs.filter((pl.col("kind") == "run_scaling") & (pl.col("changed_fields") == "UP"))
        .join(updates.select("server", "run_id").unique(), on=["server", "run_id"], how="anti")
        .select("server", "run_id", pl.col("_order").alias("_s_order"))
        .sort("_s_order")
        .with_columns(pl.int_range(1, pl.len() + 1).over(["server", "run_id"]).alias("_s_dep"))
    )
    per_job = per_job.sort("_first")
    per_job = per_job.join_asof(
        updates.select("server", "run_id", "_u_order", "_u_dep").sort("_u_order"),
        left_on="_first",
        right_on="_u_order",
        by=["server", "run_id"],
        strategy="backward",
        check_sortedness=False,
    ).join_asof(
        ups.sort("_s_order"),
        left_on="_first",
        right_on="_s_order",
        by=["server", "run_id"],
        strategy="backward",
        check_sortedness=False,
    )
    # In-place updates bump every job active at that moment whose spec is the run's current
    # one (no event on the pipeline path). A job created before a rolling update runs an older
    # spec from then on: dstack bumps a job only when the JobSpec rebuilt from the new run spec
    # equals its own (reference 6.2), so a later in-place update leaves it at its deployment,
    # provably (the log says which fields each update changed).
    in_place = updates.filter(_changed_only(IN_PLACE_CHANGES))
    # a rolling update for sure: it changed a field neither applied in place nor a replica
    # count or the groups (a `groups` change may or may not roll a group out)
    rolling = ~_changed_only(IN_PLACE_CHANGES | REPLICA_COUNT_CHANGES)
    stale = (
        per_job.select("server", "run_id", "entity_id", "_first")
        .join(
            updates.filter(rolling.fill_null(False)).select(
                "server", "run_id", pl.col("_u_order").alias("_r_order")
            ),
            on=["server", "run_id"],
        )
        .filter(pl.col("_r_order") > pl.col("_first"))
        .group_by(["server", "entity_id"])
        .agg(pl.col("_r_order").min().alias("_stale_from"))
    )
    per_job = per_job.join(stale, on=["server", "entity_id"], how="left", maintain_order="left")
    on_current_spec = pl.col("_stale_from").is_null() | (pl.col("_u_order") < pl.col("_stale_from"))
    bumps = (
        per_job.select("server", "run_id", "entity_id", "_first", "_ended", "_stale_from")
        .join(
            in_place.select("server", "run_id", "_u_order", pl.col("_u_dep").alias("_b_dep")),
            on=["server", "run_id"],
        )
        .filter(
            (pl.col("_u_order") > pl.col("_first"))
            & (pl.col("_ended").is_null() | (pl.col("_ended") > pl.col("_u_order")))
            & on_current_spec
        )
        .group_by(["server", "entity_id"])
        .agg(pl.col("_b_dep").max().alias("_in_place"))
    )
    # Reference 11.2 step 6: an update of only `replicas` / `groups` may bump some replicas in
    # place and redeploy others (per group); pipeline builds log no bump, so a job active at
    # such an update has a deployment the log cannot prove.
    ambiguous = (
        per_job.select("server", "run_id", "entity_id", "_first", "_ended", "_stale_from")
        .join(
            updates.filter(_changed_only(REPLICA_COUNT_CHANGES)).select(
                "server", "run_id", "_u_order"
            ),
            on=["server", "run_id"],
        )
        .filter(
            (pl.col("_u_order") > pl.col("_first"))
            & (pl.col("_ended").is_null() | (pl.col("_ended") > pl.col("_u_order")))
            & on_current_spec
        )
        .select("server", "entity_id", pl.lit(True).alias("_ambiguous"))
        .unique()
    )
    per_job = per_job.join(
        bumps, on=["server", "entity_id"], how="left", maintain_order="left"
    ).join(ambiguous, on=["server", "entity_id"], how="left", maintain_order="left")
    return per_job.with_columns(
        pl.col("entity_id").alias("job_id"),
        pl.col("job_name").str.extract(r"-(\d+)-\d+$", 1).cast(pl.Int64).alias("job_num"),
        pl.col("job_name").str.extract(r"-(\d+)$", 1).cast(pl.Int64).alias("replica_num"),
        (pl.col("_first").rank("ordinal").over(["server", "run_id", "job_name"]) - 1)
        .cast(pl.Int64)
        .alias("submission_num"),
        pl.max_horizontal(pl.coalesce("_u_dep", "_s_dep", pl.lit(0)), "_bumped", "_in_place")
        .cast(pl.Int64)
        .alias("deployment_num"),
        pl.when(pl.col("_ambiguous").fill_null(False) & pl.col("_bumped").is_null())
        .then(pl.lit("ambiguous_update"))
        .when(
            pl.col("_u_dep").is_not_null()
            | pl.col("_bumped").is_not_null()
            | pl.col("_in_place").is_not_null()
        )
        .then(pl.lit("events"))
        .when(pl.col("_s_dep").is_not_null())
        .then(pl.lit("scaling_lines"))
        .otherwise(pl.lit("events"))
        .alias("deployment_basis"),
    )


def _changed_only(fields: frozenset[str]) -> pl.Expr:
    """Whether an update changed only `fields` (`changed_fields`: the comma-separated names
    dstack's "Run updated" line lists); null without the list."""
    return (
        pl.col("changed_fields")
        .str.split(",")
        .list.eval(pl.element().str.strip_chars().is_in(list(fields)))
        .list.all()
    )


def reconcile(evidence: Evidence, options: TimeOptions | None = None) -> Evidence:
    options = options or TimeOptions()
    if "time_basis" not in evidence.events.columns or evidence.events.height == 0:
        return evidence
    align_times(evidence, options)
    resolve_ids(evidence)
    attach_job_runs(evidence)
    merge_duplicates(evidence)
    evidence.events = conform(evidence.events, EVENTS_SCHEMA).collect()
    derive_from_events(evidence)
    return evidence
