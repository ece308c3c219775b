"""State in time: one interval table of what each job was at every moment, built once per
audit, and `at(states, moments)`, the one answer to "what was true at T".

Each row is one aspect of one job (its `status`, whether dstack counted it `ready`, one
probe's result where a line dates it, its `deployment`, its `termination`) holding a value
from `since` until `until`, with the basis the row comes from (`database`: a database or its
table export; `api`; `log`), its provenance, and how well each end is known:

- `known`: the evidence dates it;
- `bounded`: the real moment is at or before it (a finished job's `last_processed_at`);
- `unknown`: nothing dates it (a final row's flag: dstack's `jobs.ready`, the probes' final
  `success_streak`); such a state speaks of T only at the end of the evidence;
- `open` (`until` only): nothing later replaced it; it holds at the end of the evidence.

Where two bases date the same transition, a known time outranks a bound and a bound an undated
flag; among equals the database's time outranks a log's (a log line is written after the
commit, on the server's clock, to the millisecond). The final verdict about a job is its state
at the end of the evidence.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

import polars as pl

from analyzer.dstack import ACTIVE_JOB_STATUSES, FINISHED_JOB_STATUSES, FINISHED_RUN_STATUSES
from analyzer.model import UTC_TIME
from analyzer.pipeline.placement import spans_at
from analyzer.vocabulary import HEALTH_PROOFS as HEALTH_PROOF_NAMES
from analyzer.vocabulary import HEALTH_STATES, HEALTHY_PROOFS, UNHEALTHY_PROOFS

Aspect = Literal["status", "ready", "probe", "deployment", "termination"]
ASPECTS: tuple[str, ...] = get_args(Aspect)
Basis = Literal["database", "api", "log"]
BASES: tuple[str, ...] = get_args(Basis)  # in rank order: the first outranks the rest
EndIs = Literal["known", "bounded", "unknown", "open"]
END_KINDS: tuple[str, ...] = get_args(EndIs)

KEY = ("server", "run_id", "job_id")
STATES_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "run_id": pl.String(),
    "job_id": pl.String(),
    "aspect": pl.Enum(ASPECTS),
    "probe": pl.String(),  # the probe (`probe` aspect only): a job's probes hold apart
    "value": pl.String(),
    "since": UTC_TIME,
    "since_is": pl.Enum(END_KINDS),
    "until": UTC_TIME,
    "until_is": pl.Enum(END_KINDS),
    "basis": pl.Enum(BASES),
    "provenance": pl.String(),
}
_TRANSITION = ("server", "run_id", "job_id", "aspect", "probe", "value", "at", "at_is", "basis")
_LOG_PLACE = r"^[^#;]*:\d+$"
_TABLE_PLACE = r"^(runs|jobs|events|probes|instances|fleets):[^#/]*$"


def basis_of(provenance: pl.Expr) -> pl.Expr:
    """The basis of a row from its provenance: `file:line` is a log's, `path#pointer` an API
    export's, `table:primary key` a database's (or its table export's)."""
    return (
        pl.when(provenance.str.contains(_TABLE_PLACE))
        .then(pl.lit("database"))
        .when(provenance.str.contains(_LOG_PLACE))
        .then(pl.lit("log"))
        .when(provenance.str.contains("#", literal=True))
        .then(pl.lit("api"))
        .otherwise(pl.lit("database"))
    )


def _transition(
    frame: pl.DataFrame,
    aspect: Aspect,
    value: pl.Expr,
    at: pl.Expr,
    at_is: pl.Expr | str,
    provenance: pl.Expr,
    probe: pl.Expr | None = None,
) -> pl.DataFrame:
    return frame.select(
        "server",
        "run_id",
        "job_id",
        pl.lit(aspect).alias("aspect"),
        (probe if probe is not None else pl.lit(None, pl.String)).alias("probe"),
        value.cast(pl.String).alias("value"),
        at.cast(UTC_TIME).alias("at"),
        (pl.lit(at_is) if isinstance(at_is, str) else at_is).alias("at_is"),
        basis_of(provenance).alias("basis"),
        provenance.alias("provenance"),
    ).filter(pl.col("value").is_not_null())


def _from_events(events: pl.DataFrame) -> list[pl.DataFrame]:
    """The dated transitions the events (the events table, API exports, log lines) hold."""
    jobs = events.filter(
        (pl.col("entity_type") == "job") & pl.col("time").is_not_null()
    ).with_columns(
        pl.col("entity_id").alias("job_id"),
        pl.col("provenance").list.first().fill_null("").alias("_place"),
    )
    kind, place = pl.col("kind"), pl.col("_place")
    status = jobs.filter(kind.is_in(["job_created", "job_status"]))
    terminating = jobs.filter((kind == "job_status") & (pl.col("new_status") == "terminating"))
    passed = kind == "probe_passed"
    return [
        _transition(
            status,
            "status",
            pl.coalesce("new_status", pl.when(kind == "job_created").then(pl.lit("submitted"))),
            pl.col("time"),
            "known",
            place,
        ),
        # dstack marks a replica ready once and never resets `jobs.ready`
        # (jobs_running.py, _maybe_register_replica)
        _transition(
            jobs.filter(kind.is_in(["job_ready", "job_registered"])),
            "ready",
            pl.lit("true"),
            pl.col("time"),
            "known",
            place,
        ),
        _transition(
            jobs.filter(kind == "job_updated"),
            "deployment",
            pl.col("deployment_num"),
            pl.col("time"),
            "known",
            place,
        ),
        _transition(
            terminating, "termination", pl.col("termination_reason"), pl.col("time"), "known", place
        ),
        # each result leaves the probe passing or failing: `_process_probe_async`
        # (scheduled_tasks/probes.py) resets the streak to 0 on a failure
        _transition(
            jobs.filter(kind.is_in(["probe_passed", "probe_failed"])),
            "probe",
            pl.when(passed).then(pl.lit("passing")).otherwise(pl.lit("failing")),
            pl.col("time"),
            "known",
            place,
            pl.col("probe"),
        ),
    ]


def _from_rows(subs: pl.DataFrame) -> list[pl.DataFrame]:
    """The transitions the job rows hold: their own times, and their final flags (undated)."""
    finished = pl.col("status").is_in(list(FINISHED_JOB_STATUSES))
    place = pl.col("provenance").str.split("; ").list.first().fill_null("")
    final_probes = pl.col("probe_rows").fill_null(0) > 0
    created = (
        pl.coalesce("created_deployment", "deployment_num")
        if "created_deployment" in subs.columns
        else pl.col("deployment_num")
    )
    return [
        _transition(subs, "status", pl.lit("submitted"), pl.col("submitted_at"), "known", place),
        _transition(subs, "status", pl.lit("running"), pl.col("running_at"), "known", place),
        _transition(
            subs.filter(finished),
            "status",
            pl.col("status"),
            pl.col("last_processed_at"),
            "bounded",
            place,
        ),
        _transition(
            subs.filter(pl.col("ready").is_not_null()),
            "ready",
            pl.col("ready").cast(pl.String).str.to_lowercase(),
            pl.when(~pl.col("ready")).then(pl.col("submitted_at")),
            pl.when(pl.col("ready")).then(pl.lit("unknown")).otherwise(pl.lit("known")),
            place,
        ),
        # a job is created in the run's deployment then (`created_deployment`, the last update
        # before it); its row's number is the final one, bumped in place since at a time only
        # a bump event dates (services/runs/replicas.py, the in-place update)
        _transition(subs, "deployment", created, pl.col("submitted_at"), "known", place),
        _transition(
            subs.filter(created != pl.col("deployment_num")),
            "deployment",
            pl.col("deployment_num"),
            pl.lit(None, UTC_TIME),
            "unknown",
            place,
        ),
        _transition(
            subs.filter(finished & pl.col("termination_reason").is_not_null()),
            "termination",
            pl.col("termination_reason"),
            pl.col("last_processed_at"),
            "bounded",
            place,
        ),
        # the final streaks: a probe's `success_streak` below its `ready_after` is failing
        # (services/probes.py, is_probe_ready); the rows do not say since when
        _transition(
            subs.filter(final_probes),
            "probe",
            pl.when(pl.col("probes_below_ready_after").fill_null(0) > 0)
            .then(pl.lit("failing"))
            .otherwise(pl.lit("passing")),
            pl.lit(None, UTC_TIME),
            "unknown",
            place,
            pl.lit("final streaks"),
        ),
    ]


def job_states(subs: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """The interval table (STATES_SCHEMA) of every job of `subs` (the jobs frame or
    timeline.submissions) from the rows and the events about them."""
    rows = [
        t.select(*_TRANSITION, "provenance")
        for t in (*_from_events(events), *_from_rows(subs))
        if not t.is_empty()
    ]
    empty = pl.DataFrame(schema={k: STATES_SCHEMA[k] for k in STATES_SCHEMA})
    if not rows:
        return empty
    transitions = (
        pl.concat(rows, how="vertical_relaxed")
        .join(subs.select(KEY), on=list(KEY), how="semi")
        .with_columns(
            pl.col("basis").cast(pl.Enum(BASES)),
            pl.col("at_is").cast(pl.Enum(END_KINDS)),
        )
    )
    # a dated readiness says the job was not ready before it: dstack marks it once
    # (jobs_running.py, _maybe_register_replica) and emits the event then
    readied = transitions.filter(
        (pl.col("aspect") == "ready") & (pl.col("value") == "true") & (pl.col("at_is") == "known")
    )
    not_yet = readied.join(
        subs.select(*KEY, pl.col("submitted_at").alias("_submitted")), on=list(KEY)
    ).select(
        *KEY,
        "aspect",
        "probe",
        pl.lit("false").alias("value"),
        pl.col("_submitted").alias("at"),
        "at_is",
        "basis",
        "provenance",
    )
    transitions = pl.concat([transitions, not_yet.filter(pl.col("at").is_not_null())])
    # one transition per (job, aspect, probe, value) across bases: a known time first, then
    # a bound, then none; among equals the database's before an API export's before a log's
    # (probe results repeat their values: each dated one stands)
    repeated = pl.col("aspect") == "probe"
    ranked = transitions.with_columns(
        pl.when(repeated).then(pl.col("at")).alias("_same"),
    ).sort([pl.col("at").is_null(), pl.col("at_is") != "known", "basis", "at"])
    chosen = ranked.unique(
        ["server", "job_id", "aspect", "probe", "value", "_same"], keep="first", maintain_order=True
    ).drop("_same")
    by = ["server", "job_id", "aspect", "probe"]
    return (
        # an undated transition comes last: what held before it ends at an unknown time
        chosen.sort([*by, "at"], nulls_last=True)
        .with_columns(
            pl.col("at").shift(-1).over(by).alias("until"),
            pl.col("at_is").shift(-1).over(by).alias("until_is"),
        )
        .select(
            "server",
            "run_id",
            "job_id",
            pl.col("aspect").cast(pl.Enum(ASPECTS)),
            "probe",
            "value",
            pl.col("at").alias("since"),
            pl.col("at_is").alias("since_is"),
            "until",
            pl.col("until_is").fill_null("open").cast(pl.Enum(END_KINDS)),
            "basis",
            "provenance",
        )
        .cast(STATES_SCHEMA)
    )


def at(
    states: pl.DataFrame, moments: pl.DataFrame, ends: dict[str, datetime] | None = None
) -> pl.DataFrame:
    """What was true at each moment: per row of `moments` (server, job_id, as_of, anything
    else) the states that held then, one row per (moment, aspect, probe); a moment no state
    of an aspect covers has no row for it (unknown then). A state whose start nothing dates
    (a final flag) holds only from the end of its server's evidence (`ends`), never earlier;
    one whose end nothing dates holds at no moment past its start; a bounded end is taken at
    its bound (`until_is` says so to a reader that needs the exact moment)."""
    end = pl.col("server").replace_strict(ends or {}, default=None, return_dtype=UTC_TIME)
    spans = states.drop("run_id" if "run_id" in moments.columns else []).with_columns(
        pl.when(pl.col("since_is") == "unknown")
        .then(end)
        .otherwise(pl.col("since"))
        .alias("since"),
        # an end nothing dates proves the state at no moment past its start
        pl.when(pl.col("until_is") == "unknown")
        .then(pl.col("since"))
        .otherwise(pl.col("until"))
        .alias("until"),
    )
    indexed = moments.with_row_index("_moment")
    held = spans_at(indexed, spans, ("server", "job_id"), "since", "until")
    return indexed.join(held, on="_moment").drop("_moment")


def serving_spans(
    subs: pl.DataFrame, events: pl.DataFrame, ends: dict[str, datetime] | None = None
) -> pl.DataFrame:
    """When each job served, from its states: (server, run_id, job_id, start, until; until null
    while it still serves at the end of the evidence), asked at every moment one of its states
    changed (`serving_at`). A job whose serving no state dates (an undated ready flag) has
    none here; its final verdict speaks for it. A replica that served for an hour and then
    failed a probe served for that hour."""
    schema = {"server": pl.String(), "run_id": pl.String(), "job_id": pl.String()}
    empty = pl.DataFrame(schema=schema | {"start": UTC_TIME, "until": UTC_TIME})
    states = job_states(subs, events)
    changes = (
        states.filter(pl.col("since").is_not_null())
        .select("server", "job_id", pl.col("since").alias("as_of"))
        .unique()
    )
    if changes.is_empty():
        return empty
    flags = serving_at(at(states, changes, ends), subs.select("server", "job_id", "probe_count"))
    job = ["server", "job_id"]
    return (
        flags.sort([*job, "as_of"])
        .with_columns(
            pl.col("as_of").shift(-1).over(job).alias("until"),
            (pl.col("serving").fill_null(False).rle_id().over(job)).alias("_run"),
        )
        .filter(pl.col("serving").fill_null(False))
        .group_by([*job, "_run"])
        .agg(pl.col("as_of").min().alias("start"), pl.col("until").last().alias("until"))
        .join(subs.select("server", "run_id", "job_id"), on=job)
        .select(empty.columns)
        .sort("server", "run_id", "start")
    )


def final(states: pl.DataFrame) -> pl.DataFrame:
    """The state at the end of the evidence: each aspect's (and probe's) open interval."""
    return states.filter(pl.col("until_is") == "open")


def serving_at(held: pl.DataFrame, probe_counts: pl.DataFrame) -> pl.DataFrame:
    """Per moment of `at(...)` (its columns but the states'), whether the job served then:
    RUNNING and ready, no probe failing (a replica serves only while every probe's
    success_streak >= ready_after: services/probes.py, is_probe_ready; without probes dstack
    counts it ready on its first RUNNING pass, jobs_running.py, _maybe_register_replica).
    `serving` is null where the evidence cannot say (no status or no readiness then)."""
    moment = [c for c in held.columns if c not in STATES_SCHEMA or c in ("server", "job_id")]
    aspect, value = pl.col("aspect"), pl.col("value")
    per_moment = (
        held.group_by(moment)
        .agg(
            value.filter(aspect == "status").first().alias("status_then"),
            value.filter(aspect == "ready").first().alias("ready_then"),
            ((aspect == "probe") & (value == "failing")).any().alias("probe_failing_then"),
        )
        .join(probe_counts, on=["server", "job_id"], how="left")
    )
    running = pl.col("status_then") == "running"
    ready = (pl.col("ready_then") == "true") | (
        (pl.col("probe_count") == 0) & pl.col("ready_then").is_null()
    )
    return per_moment.with_columns(
        pl.when(pl.col("status_then").is_null())
        .then(None)
        .when(~running | pl.col("probe_failing_then") | (pl.col("ready_then") == "false"))
        .then(False)
        .when(ready)
        .then(True)
        .alias("serving")
    ).drop("probe_count")


# Health and liveness at a moment, read from the job rows with their dated facts (the
# detector and exposure ask these of every job at once).


def final_health(subs: pl.DataFrame) -> pl.DataFrame:
    """The health ladder: each submission's final verdict (`health`: healthy, not_healthy,
    unknown) and its proof (`health_proof`, vocabulary.HEALTH_PROOFS), its state at the end of
    the evidence: at its stop, or at the end while it runs. The first proof that holds decides,
    a failing probe first (a replica serves only while every probe's success_streak >=
    ready_after, services/probes.py, is_probe_ready; jobs.ready is set once and never reset,
    jobs_running.py, _maybe_register_replica)."""
    # the logged probe results at the job's stop (at the end while it runs)
    at_stop = probe_state_at(
        subs.select(
            pl.coalesce(
                "terminating_at",
                pl.when(pl.col("status").is_in(list(FINISHED_JOB_STATUSES))).then(
                    pl.col("last_processed_at")
                ),
            ).alias("as_of"),
            "ready_at",
            "probe_ready_after",
            "probe_count",
            "probe_results",
        )
    )
    subs = subs.with_columns(
        at_stop["probe_passing_at"].alias("_probe_lines_ok"),
        at_stop["probe_failing_at"].alias("_probe_lines_failed"),
    )

    running_marker = (
        pl.col("graceful_termination_attempts").is_not_null()
        | pl.col("remove_at").is_not_null()
        | pl.col("graceful_stop_event").fill_null(False)
        | (pl.col("terminating_from") == "running")
    )
    probes_failing = pl.col("probes_below_ready_after").fill_null(0) > 0
    probes_ok = (pl.col("probe_rows").fill_null(0) > 0) & ~probes_failing
    ever_running = pl.col("has_provisioning_data").fill_null(True) & (
        pl.col("running_event_at").is_not_null()
        | pl.col("running_at").is_not_null()
        | running_marker
        | (pl.col("probe_rows").fill_null(0) > 0)
        | pl.col("ready").fill_null(False)
        | pl.col("ready_at").is_not_null()
    )
    proof = (
        pl.when(probes_failing)
        .then(pl.lit("probe_failing"))
        .when(pl.col("_probe_lines_failed"))
        .then(pl.lit("probe_failed_logged"))
        .when(pl.col("ready").fill_null(False) & probes_ok)
        .then(pl.lit("ready_flag_and_probes"))
        .when(pl.col("ready").fill_null(False))
        .then(pl.lit("ready_flag"))
        .when(pl.col("_probe_lines_ok") & pl.col("ready").is_null())
        .then(pl.lit("probe_lines"))
        .when((pl.col("ready_kind") == "job_ready") & probes_ok)
        .then(pl.lit("ready_event_and_probes"))
        .when(pl.col("ready_kind") == "job_ready")
        .then(pl.lit("ready_event"))
        .when((pl.col("ready_kind") == "job_registered") & probes_ok)
        .then(pl.lit("registered_event_and_probes"))
        .when(pl.col("ready_kind") == "job_registered")
        .then(pl.lit("registered_event"))
        # dstack sets jobs.ready (never reset) in the running pass the streaks pass
        # (_maybe_register_replica): a final streak of a job it never marked ready grew later
        .when(probes_ok & (pl.col("ready") == False))  # noqa: E712
        .then(pl.lit("not_ready"))
        .when(probes_ok)
        .then(pl.lit("probe_streaks"))
        .when(~ever_running)
        .then(pl.lit("never_running"))
        .when((pl.col("probe_count").fill_null(0) > 0) & (pl.col("probe_rows") == 0))
        .then(pl.lit("probes_never_ran"))
        .when((pl.col("ready") == False) & running_marker)  # noqa: E712
        .then(pl.lit("ready_flag_contradicts_running"))
        .when(pl.col("ready") == False)  # noqa: E712
        .then(pl.lit("not_ready"))
        .when(running_marker & (pl.col("probe_count") == 0))
        .then(pl.lit("running_no_probes"))
        .when((pl.col("status") == "running") & (pl.col("probe_count") == 0))
        .then(pl.lit("still_running_no_probes"))
        .otherwise(pl.lit(None, pl.String))
    )
    health = (
        pl.when(pl.col("health_proof").is_in(HEALTHY_PROOFS))
        .then(pl.lit("healthy"))
        .when(pl.col("health_proof").is_in(UNHEALTHY_PROOFS))
        .then(pl.lit("not_healthy"))
        .otherwise(pl.lit("unknown"))
    )
    return (
        subs.with_columns(
            proof.cast(pl.Enum(HEALTH_PROOF_NAMES)).cast(pl.String).alias("health_proof")
        )
        .with_columns(health.cast(pl.Enum(HEALTH_STATES)).cast(pl.String).alias("health"))
        .drop("_probe_lines_ok", "_probe_lines_failed")
    )


def alive_at(moment: pl.Expr | None = None) -> pl.Expr:
    """A job alive at the moment (`as_of` unless said): created by then and not yet stopped
    (TERMINATING or finished)."""
    moment = pl.col("as_of") if moment is None else moment
    return (pl.col("created_at") <= moment) & ~stopped_by(moment)


def running_services(
    runs: pl.DataFrame, submissions: pl.DataFrame, as_of: datetime
) -> pl.DataFrame:
    """(server, run_id, as_of) of every service running at `as_of`: submitted, not finished,
    with at least one job alive then."""
    ended = pl.col("status").is_in(FINISHED_RUN_STATUSES) & (pl.col("last_processed_at") <= as_of)
    alive = (
        submissions.with_columns(pl.lit(as_of).cast(pl.Datetime("us", "UTC")).alias("as_of"))
        .filter(alive_at())
        .select("server", "run_id")
    )
    return (
        runs.filter((pl.col("run_type") == "service") & (pl.col("submitted_at") <= as_of) & ~ended)
        .join(alive.unique(), on=["server", "run_id"], how="semi")
        .select("server", "run_id", pl.lit(as_of).cast(pl.Datetime("us", "UTC")).alias("as_of"))
    )


def stopped_by(moment: pl.Expr) -> pl.Expr:
    """The job had stopped (gone TERMINATING or finished) before the moment; false where
    either is unknown."""
    return (pl.col("stopped_at") < moment).fill_null(False)


def healthy_since() -> pl.Expr:
    """When the job began to serve, as the final verdict dates it: its readiness, else (a
    service without probes is ready on its first RUNNING pass) its RUNNING."""
    return pl.coalesce("ready_at", "running_event_at", "running_at")


def served_by(moment: pl.Expr) -> pl.Expr:
    """Healthy by the final verdict and serving since at or before the moment (a null moment:
    any time)."""
    return (
        (pl.col("health") == "healthy")
        & pl.col("healthy_since").is_not_null()
        & (moment.is_null() | (pl.col("healthy_since") <= moment))
    ).fill_null(False)


def served_from() -> pl.Expr:
    """What dates a job's serving: its readiness, or (none logged) its RUNNING."""
    return (
        pl.when(pl.col("ready_at").is_not_null())
        .then(pl.lit("readiness"))
        .otherwise(pl.lit("RUNNING"))
    )


READY_AT_RUNNING_SECONDS = 1.0


def readiness_line_only() -> pl.Expr:
    """Health proven by a readiness line alone, for a service that may have probes.

    The line is never retracted (reference 6.4), so it proves health at the kill only where
    the service has no probes: dstack then counts the replica ready in the same pass that made
    it RUNNING, and the log shows both at once."""
    lag = (pl.col("ready_at") - pl.col("running_event_at")).dt.total_microseconds()
    return (
        pl.col("health_proof").is_in(["ready_event", "registered_event"])
        & pl.when(pl.col("probe_count").is_not_null())
        .then(pl.col("probe_count") > 0)
        .otherwise((lag > READY_AT_RUNNING_SECONDS * 1e6).fill_null(True))
    ).fill_null(False)


def healthy_at(evidence_ends: dict[str, datetime]) -> pl.Expr:
    """Whether a submission alive at `as_of` was healthy then, from what the evidence dates at
    or before `as_of` only (never the final rows' verdict about a later moment).

    dstack marks a replica ready once (`jobs_running.py::_maybe_register_replica`: every probe
    `success_streak >= ready_after`, `services/probes.py::is_probe_ready`; without probes on its
    first RUNNING pass) and never resets `jobs.ready`. So: a ready/registered event dated at or
    before T proves it; a probe-less job RUNNING by T (and `ready` not 0) is ready; the final
    probe streaks and `ready` flag are undated, they speak of T only when T is at or after the
    end of the server's evidence (a streak left by a later crash says nothing of T). Dated
    probe results (DEBUG probe lines; `probe_state_at` adds them first) prove it either way:
    passing at T proves health, a probe failing at T its absence, whatever a readiness said."""
    as_of = pl.col("as_of")
    end = pl.col("server").replace_strict(
        evidence_ends, default=None, return_dtype=pl.Datetime("us", "UTC")
    )
    final_speaks = end.is_not_null() & (as_of >= end)
    running_by = pl.coalesce("running_event_at", "running_at") <= as_of
    dated_ready = (pl.col("ready_at") <= as_of).fill_null(False)
    probe_less = (
        (pl.col("probe_count") == 0)
        & pl.col("ready").is_null().or_(pl.col("ready"))
        & running_by
        & (pl.col("health") == "healthy")
    ).fill_null(False)
    failing = (pl.col("probes_below_ready_after").fill_null(0) > 0) & final_speaks
    final = (final_speaks & (pl.col("health") == "healthy") & running_by).fill_null(False)
    return (
        ~failing
        & ~pl.col("probe_failing_at")
        & (dated_ready | probe_less | final | pl.col("probe_passing_at"))
    )


def dated_after(as_of: pl.Expr) -> pl.Expr:
    """The evidence dates this job's readiness (or, without probes, its RUNNING) after T: it
    had not served by T."""
    ready_later = (pl.col("ready_at") > as_of).fill_null(False)
    running_later = (
        (pl.col("probe_count") == 0)
        & (pl.coalesce("running_event_at", "running_at") > as_of)
        & pl.col("ready_at").is_null()
    ).fill_null(False)
    return ready_later | running_later


PROBE_RESULT_KINDS = ("probe_passed", "probe_failed")
PROBE_RESULT = pl.Struct(
    {
        "probe": pl.String(),
        "time": UTC_TIME,
        "passed": pl.Boolean(),
        "streak": pl.Int64(),
        "failed_before": pl.Boolean(),
        "last_failed_at": UTC_TIME,
        "place": pl.String(),
    }
)


def probe_results(events: pl.DataFrame) -> pl.DataFrame:
    """Per job, its dated probe results (DEBUG probe lines), in time order, each with the
    streak it leaves: `_process_probe_async` (scheduled_tasks/probes.py) adds one to
    `success_streak` on a pass and resets it to 0 on a failure. A streak counted from a log
    that starts mid-streak is a lower bound (`failed_before` false)."""
    rows = events.filter(
        pl.col("kind").is_in(PROBE_RESULT_KINDS)
        & (pl.col("entity_type") == "job")
        & pl.col("time").is_not_null()
    )
    schema = {"server": pl.String(), "job_id": pl.String(), "probe_results": pl.List(PROBE_RESULT)}
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    passed = pl.col("kind") == "probe_passed"
    key = ["server", "entity_id", "probe"]
    failures = (~passed).cast(pl.Int64).cum_sum().over(key)
    return (
        rows.sort([*key, "time", "seq"])
        .with_columns(
            passed.alias("passed"),
            pl.when(passed)
            .then(pl.int_range(1, pl.len() + 1).over([*key, failures]))
            .otherwise(0)
            .alias("streak"),
            (failures > 0).alias("failed_before"),
            pl.when(~passed).then(pl.col("time")).forward_fill().over(key).alias("last_failed_at"),
            pl.col("provenance").list.first().alias("place"),
        )
        .group_by(["server", "entity_id"], maintain_order=True)
        .agg(pl.struct(list(PROBE_RESULT.to_schema())).sort_by("time").alias("probe_results"))
        .rename({"entity_id": "job_id"})
        .cast(schema)
    )


def probe_state_at(frame: pl.DataFrame) -> pl.DataFrame:
    """Each row's probes at its `as_of` (null: at the end), from its dated probe results
    (`probe_results`): the last result of each probe at or before T.

    dstack counts a replica ready while every probe's streak >= its `ready_after`
    (services/probes.py, is_probe_ready). So a probe failed at T if its last result failed
    (streak 0), or if `ready_after` is known and fewer passes than it followed a failure; it
    passed at T if its last result passed and the passes since the last failure reach
    `ready_after`, or none failed since a readiness dated at or before T (the streak was >=
    `ready_after` then and only grew). `probe_failing_at`: some probe failed at T;
    `probe_passing_at`: every probe seen passed and every declared probe was seen (or a
    dated readiness covers the unseen); `probe_line_at` / `probe_line`: the deciding line."""
    out = ("probe_passing_at", "probe_failing_at", "probe_line_at", "probe_line")
    if not frame["probe_results"].list.len().max():
        # no logged probe result (a database alone): no probe failed or passed by any T, and
        # the eight queries below would say so of empty frames
        return frame.drop(out, strict=False).with_columns(
            pl.lit(False).alias("probe_failing_at"),
            pl.lit(None, UTC_TIME).alias("probe_line_at"),
            pl.lit(None, pl.String).alias("probe_line"),
            pl.lit(False).alias("probe_passing_at"),
        )
    indexed = frame.drop(out, strict=False).with_row_index("_row")
    as_of = pl.col("as_of")
    ready_after = pl.col("probe_ready_after")
    ready_at = pl.col("ready_at")
    last = (
        indexed.select("_row", "as_of", "ready_at", "probe_ready_after", "probe_results")
        .explode("probe_results")
        .drop_nulls("probe_results")
        .unnest("probe_results")
        .filter(as_of.is_null() | (pl.col("time") <= as_of))
        .sort("time")
        .group_by("_row", "probe")
        .last()
    )
    passed, streak = pl.col("passed"), pl.col("streak")
    reaches = (ready_after.is_not_null() & (streak >= ready_after)).fill_null(False)
    unbroken = (
        (as_of.is_null() | (ready_at <= as_of))
        & (pl.col("last_failed_at").is_null() | (pl.col("last_failed_at") < ready_at))
    ).fill_null(False)
    below = ~passed | (
        ready_after.is_not_null() & pl.col("failed_before") & (streak < ready_after)
    ).fill_null(False)
    per_row = (
        last.with_columns(below.alias("_below"), (passed & (reaches | unbroken)).alias("_passing"))
        .sort("time")
        .group_by("_row")
        .agg(
            pl.col("_below").any().alias("probe_failing_at"),
            pl.col("_passing").all().alias("_all_passing"),
            pl.len().alias("_seen"),
            pl.when(pl.col("_below").any())
            .then(pl.col("time").filter(pl.col("_below")).last())
            .otherwise(pl.col("time").last())
            .alias("probe_line_at"),
            pl.when(pl.col("_below").any())
            .then(pl.col("place").filter(pl.col("_below")).last())
            .otherwise(pl.col("place").last())
            .alias("probe_line"),
        )
    )
    covered = (
        pl.col("probe_count").is_null()
        | (pl.col("_seen") >= pl.col("probe_count"))
        | (ready_at <= as_of).fill_null(False)
    )
    return (
        indexed.join(per_row, on="_row", how="left", maintain_order="left")
        .with_columns(
            pl.col("probe_failing_at").fill_null(False),
            (~pl.col("probe_failing_at").fill_null(False) & pl.col("_all_passing") & covered)
            .fill_null(False)
            .alias("probe_passing_at"),
        )
        .drop("_row", "_all_passing", "_seen")
    )


# A live server's run as its API answers it (`runs/list` with `job_submissions_limit` 1): the
# state now is each job's latest submission, so the same ladder reads it without a table.
def latest_submissions(run: dict) -> list[dict]:
    """(job spec, latest submission) of every job of an API run."""
    found = []
    for job in run.get("jobs") or []:
        subs = job.get("job_submissions") or []
        if subs:
            found.append({"spec": job.get("job_spec") or {}, "sub": subs[-1]})
    return found


def replicas_serving_now(run: dict) -> int:
    """Replicas of an API run serving now: the latest job RUNNING and every probe's streak at
    its `ready_after` (default 1; services/probes.py, is_probe_ready). Without probes RUNNING
    is ready on the first pass."""
    replicas = set()
    for job in latest_submissions(run):
        sub, spec = job["sub"], job["spec"]
        if sub.get("status") != "running" or spec.get("job_num", 0) != 0:
            continue
        wanted = [p.get("ready_after") or 1 for p in spec.get("probes") or []]
        streaks = [p.get("success_streak") or 0 for p in sub.get("probes") or []]
        if len(streaks) >= len(wanted) and all(
            s >= w for s, w in zip(streaks, wanted, strict=False)
        ):
            replicas.add(spec.get("replica_num", 0))
    return len(replicas)


def replicas_active_now(run: dict) -> int:
    """Replicas of an API run whose latest job is active (placed or not, not yet ending)."""
    return len(
        {
            job["spec"].get("replica_num", 0)
            for job in latest_submissions(run)
            if job["sub"].get("status") in ACTIVE_JOB_STATUSES
        }
    )
