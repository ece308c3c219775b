"""The detection rules as named predicates, each with the dstack behaviour it encodes.

Inside a candidate run (a service failing with JOB_FAILED or RETRY_LIMIT_EXCEEDED) every job
that is not a culprit is walked through `VICTIM_RULES` in order; the first rule that applies
decides what the job is: ignored (the cascade did not touch it), not a victim (listed with the
rule's reason), or undecided (the evidence cannot say; the run's verdict says why). A job no
rule stops is a victim, and `CATEGORIES` sorts it by comparing its deployment with the
deployments of the culprits that triggered the cascade (reference 11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import polars as pl

from analyzer.model import (
    FINISHED_JOB_STATUSES,
    NORMAL_JOB_REASONS,
    RETRY_STOP_MESSAGES,
    SERVER_STOP_JOB_REASONS,
)
from analyzer.pipeline.timeline import UNHEALTHY_PROOFS
from analyzer.vocabulary import Category

Row = dict[str, Any]
Outcome = Literal["ignored", "not_victim", "undecided"]


def own_failure() -> pl.Expr:
    """A job that failed by itself (reference 5.4 fail class, or a server stop with a message
    that is not a retry step); cascade kills (TERMINATED_BY_SERVER, no message) are not.

    dstack's run pass counts every latest submission that is neither DONE nor SCALED_DOWN as a
    failure of its replica (reference 6.7; background/pipeline_tasks/runs/active.py,
    `_analyze_active_run_replica`); the retry steps of services/runs/replicas.py stop siblings
    with "Replica is to be retried" / "Run is to be resubmitted", which are no failures."""
    reason = pl.col("termination_reason")
    message = pl.col("termination_reason_message")
    retry_step = pl.any_horizontal([message.str.starts_with(m) for m in RETRY_STOP_MESSAGES])
    return (
        pl.when(reason.is_in(NORMAL_JOB_REASONS))
        .then(False)
        .when(reason.is_in(SERVER_STOP_JOB_REASONS))
        .then(message.is_not_null() & ~retry_step)
        .when(reason.is_not_null())
        .then(True)
        .otherwise((pl.col("status") == "failed").fill_null(False))
    )


def cascade_stop() -> pl.Expr:
    """Stopped by the run's termination cascade: dstack's terminating-run pass gives every job
    neither finished nor TERMINATING the reason `RunTerminationReason.to_job_termination_reason()`
    (JOB_FAILED, RETRY_LIMIT_EXCEEDED -> TERMINATED_BY_SERVER) and leaves the message NULL
    (reference 6.8; core/models/runs.py, pipeline_tasks/runs/terminating.py)."""
    return (
        (pl.col("termination_reason") == "terminated_by_server")
        & pl.col("termination_reason_message").is_null()
        & pl.col("status").is_in(["terminated", "terminating"])
    ).fill_null(False)


def find_culprits(jobs: list[Row], run_terminating_at: datetime | None) -> list[Row]:
    """The jobs whose own failure failed the run (reference 11.1 step 2): per replica slot only
    the latest submission counts (reference 6.7; pipeline_tasks/runs/active.py,
    `_analyze_active_run_replica`), among the rows created before the run went TERMINATING
    (later rows are the cascade's or a retry's, not the cause)."""
    latest: dict[tuple[Any, Any], Row] = {}
    for job in jobs:
        created = job["created_at"]
        if run_terminating_at is not None and created is not None and created > run_terminating_at:
            continue
        slot = (job["replica_num"], job["job_num"])
        if slot not in latest or (job["submission_num"] or 0) > (
            latest[slot]["submission_num"] or 0
        ):
            latest[slot] = job
    return [j for j in latest.values() if j["own_failure"]]


def job_label(job: Row) -> str:
    return f"{job['job_name']} (job {job['job_id']}, deployment {job['deployment_num']})"


@dataclass(frozen=True)
class Hit:
    """A job of a candidate run that is not a culprit, with what the rules read about it."""

    job: Row
    in_flight: bool  # the run is still TERMINATING: a copy taken mid-cascade
    triggering: tuple[Row, ...]  # the culprits whose failure came before this job's stop

    @property
    def active(self) -> bool:
        return is_active(self.job)

    @property
    def stopped_by_cascade(self) -> bool:
        return self.job["cascade_stop"]

    def culprits(self, compare: Callable[[int, int], bool]) -> list[Row]:
        """The triggering culprits whose deployment compares so with this job's."""
        dep = self.job["deployment_num"]
        return [
            c
            for c in self.triggering
            if c["deployment_num"] is not None
            and dep is not None
            and compare(c["deployment_num"], dep)
        ]


def is_active(job: Row) -> bool:
    """Neither finished nor TERMINATING: the cascade has not reached it yet."""
    return job["status"] not in FINISHED_JOB_STATUSES and job["status"] != "terminating"


def triggering_culprits(job: Row, culprits: list[Row]) -> tuple[Row, ...]:
    """The culprits that failed before the cascade stopped this job: a job stopped before a
    culprit was created, or that went TERMINATING before it, was not stopped because of it.
    A job the cascade has not reached yet (mid-cascade) is hit by all of them."""
    stop = job["stopped_at"] or job["last_processed_at"]
    active = is_active(job)
    return tuple(
        c
        for c in culprits
        if active
        or (
            (c["created_at"] is None or stop is None or stop >= c["created_at"])
            and (
                job["terminating_at"] is None
                or c["terminating_at"] is None
                or job["terminating_at"] >= c["terminating_at"]
            )
        )
    )


def _newer(c: int, v: int) -> bool:
    return c > v


def _same(c: int, v: int) -> bool:
    return c == v


def _older(c: int, v: int) -> bool:
    return c < v


@dataclass(frozen=True)
class Rule:
    """One reason a job of a candidate run is no victim, and the dstack behaviour behind it."""

    name: str
    applies: Callable[[Hit], bool]
    outcome: Outcome
    reason: Callable[[Hit], str]
    dstack: str  # the behaviour the rule encodes, with its source (dstack file or reference)


def _not_healthy_reason(hit: Hit) -> str:
    proof = UNHEALTHY_PROOFS.get(hit.job["health_proof"], hit.job["health_proof"])
    return f"not healthy {'at the end of the evidence' if hit.active else 'when stopped'}: {proof}"


def _health_undecided_reason(hit: Hit) -> str:
    proof = hit.job["health_proof"]
    return (
        f"{job_label(hit.job)} was {'hit' if hit.active else 'stopped'} by the cascade but its "
        "health cannot be decided" + (f" ({proof})" if proof else "")
    )


VICTIM_RULES: tuple[Rule, ...] = (
    Rule(
        "snapshot_before_cascade",
        lambda h: not h.stopped_by_cascade and h.active and not h.in_flight,
        "undecided",
        lambda h: (
            f"{job_label(h.job)} was still {h.job['status']} at the end of the evidence: "
            "snapshot taken before the cascade reached it"
        ),
        "a failed run stops every active job before it is FAILED (reference 6.8; "
        "pipeline_tasks/runs/terminating.py, process_terminating_run): an active job in a "
        "run that is no longer TERMINATING means the copy and the cascade disagree",
    ),
    Rule(
        "not_stopped_by_cascade",
        lambda h: not h.stopped_by_cascade and not (h.active and h.in_flight),
        "ignored",
        lambda h: "",
        "only TERMINATED_BY_SERVER without a message is the cascade's stop "
        "(RunTerminationReason.to_job_termination_reason, core/models/runs.py; reference 6.8); "
        "SCALED_DOWN, user stops and retry steps are the job's own story (reference 11.4)",
    ),
    Rule(
        "never_served_mid_cascade",
        lambda h: not h.stopped_by_cascade and h.job["status"] != "running",
        "not_victim",
        lambda h: (
            f"still {h.job['status']} when the evidence ends (never served); the run's "
            "terminating pass stops it next"
        ),
        "mid-cascade, dstack 0.22.5's run pipeline locks every job neither finished nor "
        "TERMINATING (pipeline_tasks/runs/__init__.py, JOB_STATUSES_EXCLUDED_FOR_LOCKING) and "
        "stops it; one still SUBMITTED, PROVISIONING or PULLING never served (reference 11.4, "
        "old replica not serving yet)",
    ),
    Rule(
        "stopped_before_culprit",
        lambda h: not h.triggering,
        "not_victim",
        lambda h: "stopped before any culprit failed",
        "the run goes TERMINATING only after a replica's failure (reference 6.7; "
        "background/pipeline_tasks/runs/active.py, _get_active_run_transition): a job stopped "
        "before every culprit was created or failed was not stopped because of them",
    ),
    Rule(
        "never_provisioned",
        lambda h: not h.job["has_provisioning_data"],
        "not_victim",
        lambda h: "never got an instance (no provisioning data)",
        "a job without job_provisioning_data never ran on an instance (reference 11.1 step 3)",
    ),
    Rule(
        "probe_failing_at_failure",
        lambda h: h.job["probe_failed_then"],
        "not_victim",
        lambda h: (
            "its probe was failing when the run failed: the last result logged before the "
            f"failure, at {h.job['probe_line_at'].isoformat()} ({h.job['probe_line']}), left "
            "its streak below ready_after"
        ),
        "a replica serves only while every probe's success_streak >= ready_after "
        "(services/probes.py, is_probe_ready); a failed probe resets the streak to 0 "
        "(scheduled_tasks/probes.py, _process_probe_async), and the DEBUG probe lines date "
        "each result (moments.probe_state_at)",
    ),
    Rule(
        "not_healthy",
        lambda h: h.job["health"] == "not_healthy",
        "not_victim",
        _not_healthy_reason,
        "a replica serves only while RUNNING and ready: jobs.ready and every probe's "
        "success_streak >= ready_after (reference 6.4, 11.1 step 4; the health ladder in "
        "pipeline/timeline.py)",
    ),
    Rule(
        "not_serving_at_failure",
        lambda h: h.job["served_later"],
        "not_victim",
        lambda h: (
            "not yet serving when the run failed: the evidence dates its "
            + ("readiness" if h.job["ready_at"] is not None else "RUNNING")
            + " after the failure"
        ),
        "the cascade began when the run failed (its TERMINATING transition): a replica dstack "
        "marked ready only later (jobs_running.py, _maybe_register_replica) had never served "
        "when the failure doomed it (moments.dated_after)",
    ),
    Rule(
        "health_not_dated",
        lambda h: h.job["health"] == "healthy" and not h.job["healthy_then"],
        "undecided",
        lambda h: (
            f"{job_label(h.job)} was stopped by the cascade; its health proof "
            f"({h.job['health_proof']}) is not dated at or before the run's failure"
        ),
        "health at the failure, not at the end: a probe streak or ready flag read from the "
        "final rows proves health at T only where the evidence dates it at or before T "
        "(services/probes.py, is_probe_ready; jobs_running.py, _maybe_register_replica; "
        "moments.healthy_at, the same test as `exposure --as-of`)",
    ),
    Rule(
        "health_undecided",
        lambda h: h.job["health"] != "healthy",
        "undecided",
        _health_undecided_reason,
        "no proof of serving and none of failing at the stop (reference 11.1 step 4, 11.3: a "
        "log alone cannot show probes at the kill)",
    ),
    Rule(
        "deployment_unknown",
        lambda h: h.job["deployment_num"] is None,
        "undecided",
        lambda h: f"{job_label(h.job)}: deployment number unknown",
        "the category compares jobs.deployment_num of victim and culprit (reference 6.1, 11)",
    ),
    Rule(
        "newer_and_older_culprits",
        lambda h: bool(h.culprits(_newer)) and bool(h.culprits(_same) or h.culprits(_older)),
        "undecided",
        lambda h: (
            f"{job_label(h.job)}: replicas of a newer and of its own or an older "
            "deployment failed before the cascade; either may have failed the run"
        ),
        "the run's failure is deployment-blind (reference 6.7, 11.1 step 6): any failed replica "
        "fails the run, so two candidates of different sides leave the trigger open",
    ),
    Rule(
        "culprit_deployment_unknown",
        lambda h: not (h.culprits(_newer) or h.culprits(_same) or h.culprits(_older)),
        "undecided",
        lambda h: f"{job_label(h.job)}: the failing replica's deployment is unknown",
        "the category compares the culprit's jobs.deployment_num with the victim's (reference 11)",
    ),
)


@dataclass(frozen=True)
class CategoryRule:
    """A victim category: the side the triggering culprits' deployment is on."""

    name: Category
    culprit_side: Callable[[int, int], bool]  # (culprit deployment, victim deployment)
    dstack: str


# In order: a run's verdict is its first category with victims.
CATEGORIES: tuple[CategoryRule, ...] = (
    CategoryRule(
        "collateral_termination",
        _newer,
        "a replica of a newer deployment failed and the run's cascade stopped a healthy older "
        "one (dstack issue #4186; reference 11.1, 11.2)",
    ),
    CategoryRule(
        "same_deployment_collateral",
        _same,
        "culprit and victim share one deployment: a failed scale-up after an in-place "
        "`replicas` change or a sibling crash (dstack #2660; reference 11.4)",
    ),
    CategoryRule(
        "newer_deployment_collateral",
        _older,
        "an older replica failed on its own during a rollout and the deployment-blind cascade "
        "(reference 6.7, 6.8) stopped a healthy replica of the newer deployment (reference 11.4)",
    ),
)
CATEGORY_ORDER = tuple(c.name for c in CATEGORIES)


def first_rule(hit: Hit) -> Rule | None:
    """The first rule that says this job is no victim; None for a victim."""
    return next((rule for rule in VICTIM_RULES if rule.applies(hit)), None)


def categorise(hit: Hit) -> tuple[Category, list[Row]]:
    """A victim's category and the culprits that put it there (the rules ruled out the rest)."""
    for category in CATEGORIES:
        culprits = hit.culprits(category.culprit_side)
        if culprits:
            return category.name, culprits
    raise ValueError(f"{job_label(hit.job)}: no category (the rules should have stopped it)")
