"""The detection rules as data: each an id, a polars expression over a job's columns at its
run's failure, an outcome, a reason template and the dstack behaviour it encodes.

Inside a candidate run (a service failing with JOB_FAILED or RETRY_LIMIT_EXCEEDED) every job
that is not a culprit takes the id of the first rule of `RULES` that matches, as a column
(`judge_jobs`): ignored (the cascade did not touch it), not a victim (listed with the rule's
reason), undecided (the evidence cannot say; the run's verdict says why), or a victim of the
category the rule names, by the side of the deployment of the culprits that triggered the
cascade (reference 11). The rule id is in the JSON report, so a reader can count and filter by
rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

from analyzer.dstack import ENDED_JOB_STATUSES, USER_STOP_JOB_REASONS
from analyzer.pipeline.moments import OWN_FAILURE_AT
from analyzer.pipeline.timeline import UNHEALTHY_PROOFS
from analyzer.vocabulary import Category

Row = dict[str, Any]
Outcome = Literal["ignored", "not_victim", "undecided", "victim"]


def _slot() -> list[str]:
    return ["server", "run_id", "replica_num", "job_num"]


def is_culprit() -> pl.Expr:
    """A job whose own failure failed the run (reference 11.1 step 2): per replica slot only
    the latest submission counts (reference 6.7; pipeline_tasks/runs/active.py,
    `_analyze_active_run_replica`), among the rows created before the run went TERMINATING
    (`run_terminating_at`; later rows are the cascade's or a retry's, not the cause); when the
    user's stop came first (`failure_basis` culprit_before_stop), only a failure before the
    stop (`stop_at`) counts. Reads `_row`, the job's place in the frame (ties keep the first)."""
    created, cutoff = pl.col("created_at"), pl.col("run_terminating_at")
    eligible = (cutoff.is_null() | created.is_null() | (created <= cutoff)).fill_null(True)
    submission = pl.col("submission_num").fill_null(0)
    latest = eligible & (submission == submission.filter(eligible).max().over(_slot()))
    first = pl.col("_row") == pl.col("_row").filter(latest).min().over(_slot())
    before_stop = (pl.col("failure_basis") != "culprit_before_stop").fill_null(True) | (
        pl.col("stop_at") >= OWN_FAILURE_AT
    ).fill_null(False)
    return (latest & first & pl.col("own_failure") & before_stop).fill_null(False)


def doomed_by_failure() -> pl.Expr:
    """Stopped by the cascade, whatever label a later user stop gave it: dstack's terminating
    pass gave it TERMINATED_BY_USER (ABORTED_BY_USER) only because stop_runs() had overwritten
    the run's reason (services/runs/__init__.py; pipeline_tasks/runs/terminating.py,
    process_terminating_run); the failure had doomed it already, so it is the cascade's stop.
    Reads the run's `stopped_during_cascade` and `run_failed_at`."""
    stop = pl.coalesce("terminating_at", "stopped_at")
    doomed = (
        pl.col("stopped_during_cascade")
        & pl.col("run_failed_at").is_not_null()
        & pl.col("termination_reason").is_in(USER_STOP_JOB_REASONS)
        & pl.col("termination_reason_message").is_null()
        & pl.col("status").is_in(["terminated", "terminating", "aborted"])
        & (stop >= pl.col("run_failed_at"))
    ).fill_null(False)
    return pl.col("cascade_stop") | doomed


def is_active() -> pl.Expr:
    """Neither finished nor TERMINATING: the cascade has not reached it yet."""
    return ~pl.col("status").is_in(ENDED_JOB_STATUSES).fill_null(False)


def with_triggering(jobs: pl.DataFrame) -> pl.DataFrame:
    """Per job, the culprits of its run whose failure came before the cascade stopped it (a job
    stopped before a culprit was created, or that went TERMINATING before it, was not stopped
    because of it; one the cascade has not reached yet is hit by all of them), as three lists
    of job ids by the side of the culprit's deployment: `newer_culprits`, `same_culprits`,
    `older_culprits`, and their count `triggering`."""
    culprits = jobs.filter(pl.col("culprit")).select(
        "server",
        "run_id",
        pl.col("job_id").alias("_c_id"),
        pl.col("created_at").alias("_c_created"),
        pl.col("terminating_at").alias("_c_terminating"),
        pl.col("deployment_num").alias("_c_dep"),
        pl.col("_culprit_order"),
    )
    stop = pl.coalesce("stopped_at", "last_processed_at")
    created, terminating = pl.col("_c_created"), pl.col("_c_terminating")
    triggering = is_active() | (
        (created.is_null() | stop.is_null() | (stop >= created)).fill_null(True)
        & (
            pl.col("terminating_at").is_null()
            | terminating.is_null()
            | (pl.col("terminating_at") >= terminating)
        ).fill_null(True)
    )
    dep, c_dep = pl.col("deployment_num"), pl.col("_c_dep")
    ids = pl.col("_c_id")
    per_job = (
        jobs.select(
            "_row",
            "server",
            "run_id",
            "status",
            "stopped_at",
            "last_processed_at",
            "terminating_at",
            "deployment_num",
        )
        .join(culprits, on=["server", "run_id"])
        .sort("_row", "_culprit_order")
        .filter(triggering)
        .group_by("_row")
        .agg(
            pl.len().alias("triggering"),
            ids.filter(c_dep > dep).alias("newer_culprits"),
            ids.filter(c_dep == dep).alias("same_culprits"),
            ids.filter(c_dep < dep).alias("older_culprits"),
        )
    )
    return jobs.join(per_job, on="_row", how="left", maintain_order="left").with_columns(
        pl.col("triggering").fill_null(0),
        *(pl.col(c).fill_null([]) for c in SIDES),
    )


SIDES = ("newer_culprits", "same_culprits", "older_culprits")


def _any(column: str) -> pl.Expr:
    return pl.col(column).list.len() > 0


@dataclass(frozen=True)
class Rule:
    """What a job of a candidate run is (a victim of a category, or ignored, not a victim, or
    undecided, with the reason), when its columns (`when`, over the job at the run's failure)
    match first in `RULES`, and the dstack behaviour behind it."""

    id: str
    when: pl.Expr
    outcome: Outcome
    reason: str  # a template over the job's columns and `reason_fields`
    dstack: str  # the behaviour the rule encodes, with its source (dstack file or reference)
    culprits: str | None = None  # a victim rule: the column naming the culprits behind it


_stopped = pl.col("cascade_stop")
_active = is_active()
_in_flight = pl.col("in_flight")

RULES: tuple[Rule, ...] = (
    Rule(
        "snapshot_before_cascade",
        ~_stopped & _active & ~_in_flight,
        "undecided",
        "{label} was still {status} at the end of the evidence: snapshot taken before the "
        "cascade reached it",
        "a failed run stops every active job before it is FAILED (reference 6.8; "
        "pipeline_tasks/runs/terminating.py, process_terminating_run): an active job in a "
        "run that is no longer TERMINATING means the copy and the cascade disagree",
    ),
    Rule(
        "not_stopped_by_cascade",
        ~_stopped & ~(_active & _in_flight),
        "ignored",
        "",
        "only TERMINATED_BY_SERVER without a message is the cascade's stop "
        "(RunTerminationReason.to_job_termination_reason, core/models/runs.py; reference 6.8); "
        "SCALED_DOWN, user stops and retry steps are the job's own story (reference 11.4)",
    ),
    Rule(
        "never_served_mid_cascade",
        ~_stopped & (pl.col("status") != "running").fill_null(True),
        "not_victim",
        "still {status} when the evidence ends (never served); the run's terminating pass "
        "stops it next",
        "mid-cascade, dstack 0.22.5's run pipeline locks every job neither finished nor "
        "TERMINATING (pipeline_tasks/runs/__init__.py, JOB_STATUSES_EXCLUDED_FOR_LOCKING) and "
        "stops it; one still SUBMITTED, PROVISIONING or PULLING never served (reference 11.4, "
        "old replica not serving yet)",
    ),
    Rule(
        "stopped_before_culprit",
        pl.col("triggering") == 0,
        "not_victim",
        "stopped before any culprit failed",
        "the run goes TERMINATING only after a replica's failure (reference 6.7; "
        "background/pipeline_tasks/runs/active.py, _get_active_run_transition): a job stopped "
        "before every culprit was created or failed was not stopped because of them",
    ),
    Rule(
        "never_provisioned",
        ~pl.col("has_provisioning_data").fill_null(False),
        "not_victim",
        "never got an instance (no provisioning data)",
        "a job without job_provisioning_data never ran on an instance (reference 11.1 step 3)",
    ),
    Rule(
        "probe_failing_at_failure",
        pl.col("probe_failed_then").fill_null(False),
        "not_victim",
        "its probe was failing when the run failed: the last result logged before the "
        "failure, at {probe_line_time} ({probe_line}), left its streak below ready_after",
        "a replica serves only while every probe's success_streak >= ready_after "
        "(services/probes.py, is_probe_ready); a failed probe resets the streak to 0 "
        "(scheduled_tasks/probes.py, _process_probe_async), and the DEBUG probe lines date "
        "each result (states.probe_state_at)",
    ),
    Rule(
        "not_healthy",
        (pl.col("health") == "not_healthy").fill_null(False),
        "not_victim",
        "not healthy {when_said}: {unhealthy_proof}",
        "a replica serves only while RUNNING and ready: jobs.ready and every probe's "
        "success_streak >= ready_after (reference 6.4, 11.1 step 4; the health ladder in "
        "pipeline/timeline.py)",
    ),
    Rule(
        "not_serving_at_failure",
        pl.col("served_later").fill_null(False),
        "not_victim",
        "not yet serving when the run failed: the evidence dates its {served_from} after the "
        "failure",
        "the cascade began when the run failed (its TERMINATING transition): a replica dstack "
        "marked ready only later (jobs_running.py, _maybe_register_replica) had never served "
        "when the failure doomed it (states.dated_after)",
    ),
    Rule(
        "health_not_dated",
        (pl.col("health") == "healthy").fill_null(False) & ~pl.col("healthy_then").fill_null(False),
        "undecided",
        "{label} was stopped by the cascade; its health proof ({health_proof}) is not dated at "
        "or before the run's failure",
        "health at the failure, not at the end: a probe streak or ready flag read from the "
        "final rows proves health at T only where the evidence dates it at or before T "
        "(services/probes.py, is_probe_ready; jobs_running.py, _maybe_register_replica; "
        "states.healthy_at, the same test as `exposure --as-of`)",
    ),
    Rule(
        "health_undecided",
        (pl.col("health") != "healthy").fill_null(True),
        "undecided",
        "{label} was {hit_or_stopped} by the cascade but its health cannot be decided{proof_note}",
        "no proof of serving and none of failing at the stop (reference 11.1 step 4, 11.3: a "
        "log alone cannot show probes at the kill)",
    ),
    Rule(
        "deployment_unknown",
        pl.col("deployment_num").is_null(),
        "undecided",
        "{label}: deployment number unknown",
        "the category compares jobs.deployment_num of victim and culprit (reference 6.1, 11)",
    ),
    Rule(
        "newer_and_older_culprits",
        _any("newer_culprits") & (_any("same_culprits") | _any("older_culprits")),
        "undecided",
        "{label}: replicas of a newer and of its own or an older deployment failed before the "
        "cascade; either may have failed the run",
        "the run's failure is deployment-blind (reference 6.7, 11.1 step 6): any failed replica "
        "fails the run, so two candidates of different sides leave the trigger open",
    ),
    Rule(
        "culprit_deployment_unknown",
        ~(_any("newer_culprits") | _any("same_culprits") | _any("older_culprits")),
        "undecided",
        "{label}: the failing replica's deployment is unknown",
        "the category compares the culprit's jobs.deployment_num with the victim's (reference 11)",
    ),
    # The victim categories, in order: a run's verdict is its first category with victims.
    Rule(
        "collateral_termination",
        _any("newer_culprits"),
        "victim",
        "",
        "a replica of a newer deployment failed and the run's cascade stopped a healthy older "
        "one (dstack issue #4186; reference 11.1, 11.2)",
        "newer_culprits",
    ),
    Rule(
        "same_deployment_collateral",
        _any("same_culprits"),
        "victim",
        "",
        "culprit and victim share one deployment: a failed scale-up after an in-place "
        "`replicas` change or a sibling crash (dstack #2660; reference 11.4)",
        "same_culprits",
    ),
    Rule(
        "newer_deployment_collateral",
        _any("older_culprits"),
        "victim",
        "",
        "an older replica failed on its own during a rollout and the deployment-blind cascade "
        "(reference 6.7, 6.8) stopped a healthy replica of the newer deployment (reference 11.4)",
        "older_culprits",
    ),
)
RULES_BY_ID = {rule.id: rule for rule in RULES}
VICTIM_RULES = tuple(rule for rule in RULES if rule.outcome != "victim")
CATEGORIES = tuple(rule for rule in RULES if rule.outcome == "victim")
CATEGORY_ORDER: tuple[Category, ...] = tuple(rule.id for rule in CATEGORIES)  # type: ignore[misc]


def first_rule() -> pl.Expr:
    """The id of the first rule whose columns match (null for a culprit)."""
    return (
        pl.when(pl.col("culprit"))
        .then(pl.lit(None, pl.String))
        .otherwise(pl.coalesce(*(pl.when(r.when).then(pl.lit(r.id)) for r in RULES)))
    )


def judge_jobs(jobs: pl.DataFrame) -> pl.DataFrame:
    """The jobs of the candidate runs, each with the run's columns the rules read
    (`run_terminating_at`, `failure_basis`, `stop_at`, `stopped_during_cascade`,
    `run_failed_at`, `in_flight`), judged in columns: `culprit`, the cascade's stop as the
    rules read it (`cascade_stop`), the triggering culprits by side, and `rule`, the id of the
    first rule that matches."""
    indexed = jobs.with_row_index("_row").with_columns(
        pl.col("_row").min().over(_slot()).alias("_culprit_order")
    )
    indexed = indexed.with_columns(
        is_culprit().alias("culprit"), doomed_by_failure().alias("cascade_stop")
    )
    return with_triggering(indexed).with_columns(first_rule().alias("rule")).drop("_row")


def reason_fields(job: Row) -> dict[str, str]:
    """The words a reason template may name beside the job's own columns."""
    active = job["status"] not in ENDED_JOB_STATUSES
    proof = job["health_proof"]
    probe_at = job.get("probe_line_at")
    return {
        "label": job_label(job),
        "when_said": "at the end of the evidence" if active else "when stopped",
        "unhealthy_proof": UNHEALTHY_PROOFS.get(proof, proof),
        "hit_or_stopped": "hit" if active else "stopped",
        "proof_note": f" ({proof})" if proof else "",
        "probe_line_time": probe_at.isoformat() if probe_at is not None else "",
    }


def reason(rule: Rule, job: Row) -> str:
    """The rule's reason for this job, in words."""
    return rule.reason.format(**(job | reason_fields(job))) if rule.reason else ""


def job_label(job: Row) -> str:
    return f"{job['job_name']} (job {job['job_id']}, deployment {job['deployment_num']})"
