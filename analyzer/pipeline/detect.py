"""The rules (reference section 11) and a verdict for every run.

A candidate run is a service that failed (or is failing) with JOB_FAILED or
RETRY_LIMIT_EXCEEDED. Inside it, the culprits are the latest submissions whose own failure
failed the run, and the victims are healthy replicas the run's termination cascade stopped
(TERMINATED_BY_SERVER without a message) or, in a copy taken mid-cascade, is about to stop.
Comparing their deployments sorts each victim into `collateral_termination` (culprit newer),
`same_deployment_collateral` or `newer_deployment_collateral` (culprit older); everything
else that the cascade stopped is listed with the reason it is not a victim.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import polars as pl

from analyzer.contract import (
    Culprit,
    EarlierFailure,
    EvidenceItem,
    Finding,
    LimitationRecord,
    OtherJob,
    RunVerdict,
    Victim,
)
from analyzer.dstack import (
    ACTIVE_RUN_STATUSES,
    FINISHED_RUN_STATUSES,
    IN_PLACE_CHANGES,
    cascade_stop,
    own_failure,
)
from analyzer.model import python_values
from analyzer.pipeline.chain import (
    EVIDENCE_COLUMNS,
    culprit_evidence,
    expected_stop_reason,
    from_event,
    known,
    quoted_columns,
    quoted_events,
    victim_evidence,
)
from analyzer.pipeline.moments import (
    deleted_failures,
    next_runs,
    run_failures,
    stopped_during_cascade,
)
from analyzer.pipeline.rules import CATEGORY_ORDER, RULES_BY_ID, judge_jobs, reason
from analyzer.pipeline.states import (
    dated_after,
    healthy_at,
    probe_state_at,
    readiness_line_only,
    served_from,
)
from analyzer.pipeline.timeline import HEALTH_PROOFS
from analyzer.vocabulary import Category, Confidence, Verdict

Row = dict[str, Any]
# The columns of the submissions frame (timeline.submissions) and of the events the rules and
# the evidence chain read: iterating rows is the cost, so only these are turned into rows.
JOB_COLUMNS = (
    "server",
    "run_id",
    "job_id",
    "job_name",
    "replica_num",
    "job_num",
    "submission_num",
    "deployment_num",
    "status",
    "termination_reason",
    "termination_reason_message",
    "exit_status",
    "last_processed_at",
    "has_provisioning_data",
    "probe_count",
    "spec_fingerprint",
    "deployment_basis",
    "provenance",
    "created_at",
    "created_deployment",
    "terminating_at",
    "stopped_at",
    "finished_at",
    "ready_at",
    "running_event_at",
    "healthy_since",
    "health",
    "health_proof",
    "event_reason",
    "event_message",
    "as_of",
)
RUN_EVENT_COLUMNS = (
    "server",
    "run_id",
    "time",
    "kind",
    "old_status",
    "new_status",
    "deployment_num",
    "changed_fields",
    "actor",
)
# a job's quoted events are read by kind and status only (chain.culprit_evidence,
# chain.victim_evidence), beside their evidence items' columns
JOB_EVENT_COLUMNS = ("server", "run_id", "entity_id", "kind", "new_status")
# The columns the rules read in the frame (rules.judge_jobs) and no judgement reads from a job's
# row: not turned into rows (a time is the dearest value to turn into a Python object).
RULES_ONLY_COLUMNS = (
    "ready_at",
    "running_event_at",
    "as_of",
    "health",
    "has_provisioning_data",
    "probe_count",
    "probe_failed_then",
    "healthy_then",
    "served_later",
    "triggering",
    "failure_basis",
    "stop_at",
    "stopped_during_cascade",
    "run_failed_at",
    "in_flight",
    "run_terminating_at",
)
# The event kinds the rules and the evidence chain read.
DETECTION_KINDS = (
    "run_status",
    "run_updated",
    "job_created",
    "job_status",
    "job_ready",
    "job_registered",
)


def _failed_at(job: Row) -> datetime | None:
    return job["terminating_at"] or job["finished_at"] or job["last_processed_at"]


@dataclass
class RunJudgement:
    verdict: Verdict
    why: str
    findings: list[Finding] = field(default_factory=list)


@dataclass
class _Context:
    run: Row
    jobs: list[Row]
    events: list[Row]  # the run's own quoted events (its updates and status changes)
    # every candidate run's jobs' quoted events, by (server, run_id, job_id)
    job_events: dict[tuple[str, str, str], list[Row]]
    dateless: bool  # only times of day are known (a rich log alone): report no datetimes
    # own failures of submissions whose rows dstack deleted, from their events (moments)
    deleted: list[Row] = field(default_factory=list)
    # _earlier_failures per culprit id, worked out once: the evidence chain and the culprit's
    # record both list them
    earlier_failures: dict[str, list[Row]] = field(default_factory=dict)
    # run_event's index: (kind, field) -> the first event of that kind by the field's value
    first_events: dict[tuple[str, str], dict[Any, Row]] = field(default_factory=dict)

    @cached_property
    def events_by_kind(self) -> dict[str, list[Row]]:
        """The events of each kind, in order: a judgement asks for one kind many times."""
        by_kind: dict[str, list[Row]] = defaultdict(list)
        for event in self.events:
            by_kind[event["kind"]].append(event)
        return by_kind

    @cached_property
    def own_failures(self) -> list[Row]:
        """The submissions that failed by themselves: the only ones a culprit's earlier
        failures are looked for among (a run holds many more jobs than failures)."""
        return [job for job in self.jobs if job["own_failure"]]

    def when(self, value: datetime | None) -> datetime | None:
        return None if self.dateless else value

    def events_of(self, job: Row) -> list[Row]:
        """The job's quoted events, in order."""
        return self.job_events.get((self.run["server"], self.run["run_id"], job["job_id"]), [])

    def run_event(self, kind: str, **match: Any) -> Row | None:
        """The first event of `kind` whose one field `match` names has that value."""
        [(name, value)] = match.items()
        first = self.first_events.get((kind, name))
        if first is None:
            first = self.first_events[(kind, name)] = {}
            for event in self.events_by_kind.get(kind, ()):
                first.setdefault(event[name], event)
        return first.get(value)


def _culprit_created_in_its_deployment(ctx: _Context, culprit: Row) -> tuple[bool, str]:
    """Reference 11.1.5: the culprit was created by the redeploy, not bumped in place."""
    dep = culprit["deployment_num"]
    if culprit["created_deployment"] is not None:
        if culprit["created_deployment"] == dep:
            return True, f"created after the update to deployment {dep} (events)"
        return False, f"created in deployment {culprit['created_deployment']}, bumped to {dep}"
    older = [j for j in ctx.jobs if j["deployment_num"] is not None and j["deployment_num"] < dep]
    if older and all(culprit["created_at"] > j["created_at"] for j in older):
        return True, "created after every job of the older deployments (table times)"
    fingerprints = {j["spec_fingerprint"] for j in older if j["spec_fingerprint"] is not None}
    if fingerprints and culprit["spec_fingerprint"] not in (None, *fingerprints):
        return True, "its job spec differs from the older deployment's in a rolling field"
    return False, "could not prove the culprit was created by the redeploy (no events)"


def _judge_candidate(ctx: _Context) -> RunJudgement:
    run = ctx.run
    run_reason = run["failure_reason"] or run["termination_reason"]
    terminating = ctx.run_event("run_status", new_status="terminating")

    culprits = sorted((j for j in ctx.jobs if j["culprit"]), key=lambda j: j["_culprit_order"])
    if not culprits and run["failure_basis"] == "culprit_before_stop":
        return RunJudgement(
            "no_incident",
            f"run ended with {run['termination_reason']}: the user's stop came before any "
            "job of the run failed by itself",
        )
    if not culprits:
        return RunJudgement(
            "inconclusive",
            f"the run {'is failing' if run['status'] == 'terminating' else 'failed'} with "
            f"{run_reason} but no job that failed by itself is in the evidence "
            "(rows deleted, or events past their TTL)",
        )

    victims: dict[Category, list[tuple[Row, list[Row]]]] = defaultdict(list)
    also: list[OtherJob] = []
    undecided: list[str] = []
    by_id = {c["job_id"]: c for c in culprits}
    # A copy taken mid-cascade (the run still TERMINATING): the jobs the cascade has not
    # reached yet are doomed, victims not yet stopped (rules.RULES say which are not).
    in_flight = run["status"] == "terminating"
    for job in ctx.jobs:
        if job["culprit"]:
            continue
        rule = RULES_BY_ID[job["rule"]]
        if rule.outcome == "victim":
            victims[rule.id].append((job, [by_id[i] for i in job[rule.culprits]]))
        elif rule.outcome == "not_victim":
            also.append(_other(job, reason(rule, job)))
        elif rule.outcome == "undecided":
            undecided.append(reason(rule, job))

    victim_categories = {
        v["job_id"]: category for category, entries in victims.items() for v, _ in entries
    }
    # Victims whose deployment the evidence proves and those it cannot (a log alone after a
    # replicas/groups-only update) are reported apart, each finding at its own confidence.
    findings = [
        _finding(ctx, category, part, also, terminating, victim_categories)
        for category in CATEGORY_ORDER
        for part in _split_by_provable(victims.get(category, []))
    ]
    if findings:
        category = next(c for c in CATEGORY_ORDER if c in victims)
        counts = ", ".join(f"{len(victims[c])} {c}" for c in CATEGORY_ORDER if c in victims)
        pending = sum(not v.stopped for f in findings for v in f.victims)
        why = (
            f"healthy replicas stopped by the run's {run_reason} cascade: {counts}"
            if not pending
            else f"healthy replicas hit by the run's {run_reason} cascade: {counts} "
            f"({pending} not yet stopped when the evidence ends: the run is still TERMINATING)"
        )
        if undecided:
            why += "; also undecided: " + "; ".join(undecided)
            for finding in findings:
                finding.notes.extend(undecided)
        never_ran = [e["deployment_num"] for e in _accepted_during_cascade(ctx, terminating)]
        if never_ran:
            why += (
                "; an update accepted during the cascade never ran (deployment "
                + ", ".join(str(d) for d in never_ran)
                + ", see the notes)"
            )
        if run["stopped_during_cascade"]:
            why += (
                f"; then the user stopped the run during the cascade "
                f"({run['stop_reason'] or 'its final status TERMINATED'})"
            )
        return RunJudgement(category, why, findings)
    if undecided:
        return RunJudgement("inconclusive", "; ".join(undecided))
    failed = ", ".join(f"{c['job_name']} ({c['termination_reason']})" for c in culprits)
    outcome = "is failing" if in_flight else "failed"
    stopped = "was or will be stopped" if in_flight else "was stopped"
    why = f"the run {outcome} ({run_reason}: {failed}) but no healthy replica {stopped} by it"
    if also:
        why += f"; {'hit' if in_flight else 'stopped'} but not victims: " + "; ".join(
            f"{o.job_name}: {o.why_not_victim}" for o in also
        )
    return RunJudgement("no_healthy_victim", why)


def _accepted_during_cascade(ctx: _Context, terminating: Row | None) -> list[Row]:
    """The updates dstack accepted after the run had failed, that no job ever ran: it updates a
    run in place while the run is not finished (services/runs/__init__.py, apply_plan; a
    TERMINATING run is not finished), and its terminating pass goes on and ends the run at
    that deployment (pipeline_tasks/runs/terminating.py, process_terminating_run)."""
    if terminating is None or terminating["time"] is None:
        return []
    deployments = [j["deployment_num"] for j in ctx.jobs if j["deployment_num"] is not None]
    return [
        e
        for e in ctx.events_by_kind.get("run_updated", ())
        if e["time"] is not None
        and e["time"] > terminating["time"]
        and e["deployment_num"] is not None
        and not any(d >= e["deployment_num"] for d in deployments)
    ]


def _never_ran(ctx: _Context, update: Row, terminating: Row) -> str:
    run = ctx.run
    who = (update["actor"] or "an unknown actor").removeprefix("user ")
    again = (
        f"it was applied again as a new run of the same name ({run['next_run_id']}) "
        f"submitted at {_at(ctx, run['next_submitted_at'])}"
        if run.get("next_run_id")
        else "no later run of the same name is in the evidence"
    )
    return (
        f"deployment {update['deployment_num']} ({who} changed "
        f"{update['changed_fields'] or 'fields not named'}) was accepted at "
        f"{_at(ctx, update['time'])}, after the run had failed at {_at(ctx, terminating['time'])}: "
        "dstack updates a run in place until it is finished (services/runs/__init__.py, "
        "apply_plan) and its terminating pass went on; no job ever ran that deployment and the "
        f"run ended {run['status']} at it; {again}"
    )


def _spec_deployment(ctx: _Context, dep: int, victims_dep: int) -> int:
    """The deployment whose update set the job spec that deployment `dep` runs: an update of
    only fields applied in place leaves the JobSpec as it was (services/runs/spec.py; a job is
    bumped, not redeployed: reference 6.2), so a replica created after it runs the spec of the
    last update before it that changed a rolling field, which is the change that broke it.
    `dep` itself when no such update is newer than the victims' deployment, or the events do
    not say what an update changed."""
    spec = dep
    while spec > victims_dep:
        update = ctx.run_event("run_updated", deployment_num=spec)
        if update is None or not update["changed_fields"]:
            return dep
        if not {f.strip() for f in update["changed_fields"].split(",")} <= IN_PLACE_CHANGES:
            return spec
        spec -= 1
    return dep


def _split_by_provable(
    entries: list[tuple[Row, list[Row]]],
) -> list[list[tuple[Row, list[Row]]]]:
    provable = [e for e in entries if e[0]["deployment_basis"] != "ambiguous_update"]
    unprovable = [e for e in entries if e[0]["deployment_basis"] == "ambiguous_update"]
    return [part for part in (provable, unprovable) if part]


def _other(job: Row, why: str) -> OtherJob:
    return OtherJob(
        job_id=job["job_id"],
        job_name=job["job_name"],
        rule=job["rule"],
        deployment_num=job["deployment_num"],
        status=job["status"],
        why_not_victim=why,
    )


def _finding(
    ctx: _Context,
    category: Category,
    entries: list[tuple[Row, list[Row]]],
    also: list[OtherJob],
    terminating_event: Row | None,
    victim_categories: dict[str, str],
) -> Finding:
    run = ctx.run
    culprit_ids: dict[str, Row] = {}
    for _, culprits in entries:
        for culprit in culprits:
            culprit_ids[culprit["job_id"]] = culprit
    culprits = sorted(culprit_ids.values(), key=lambda c: _failed_at(c) or datetime.max)
    victim_rows = [victim for victim, _ in entries]
    victim_ids = {v["job_id"] for v in victim_rows}
    notes: list[str] = []
    limitations: list[LimitationRecord] = []
    confidence: Confidence = "confirmed"

    def limit(code: str, message: str) -> None:
        nonlocal confidence
        confidence = "suspected"
        limitations.append(LimitationRecord(code=code, message=message, source=run["provenance"]))

    # The rollout the finding happened in: the culprit's deployment for the #4186 pattern,
    # the victims' (newer) deployment when an older replica's own failure killed them.
    if category == "newer_deployment_collateral":
        update_dep = max(v["deployment_num"] for v in victim_rows)
    else:
        update_dep = max(c["deployment_num"] for c in culprits)
    # the root cause: the update whose job spec the failing replica runs
    cause_dep = update_dep
    if category == "collateral_termination":
        victims_dep = max(v["deployment_num"] for v in victim_rows)
        cause_dep = _spec_deployment(ctx, update_dep, victims_dep)
    update = ctx.run_event("run_updated", deployment_num=cause_dep)
    if cause_dep != update_dep:
        renumbered = ctx.run_event("run_updated", deployment_num=update_dep)
        notes.append(
            f"deployment {update_dep} changed only "
            f"{renumbered['changed_fields'] if renumbered else 'fields applied in place'}, "
            f"applied in place: the failing replica runs the job spec of deployment "
            f"{cause_dep}, whose update is the root cause"
        )
    if category == "collateral_termination":
        for culprit in culprits:
            proven, how = _culprit_created_in_its_deployment(ctx, culprit)
            notes.append(f"{culprit['job_name']}: {how}")
            if not proven:
                confidence = "suspected"
    if category != "same_deployment_collateral":
        inferred = [
            j["job_name"]
            for j in [*culprits, *(v for v, _ in entries)]
            if j["deployment_basis"] == "scaling_lines"
        ]
        if inferred:
            confidence = "suspected"
            notes.append(
                "deployment numbers inferred from 'scaling UP' log lines (dstack < 0.20.8 logs "
                "carry none; autoscaling and retries log the same line): "
                + ", ".join(inferred)
                + "; a database of the same server confirms or clears this"
            )
        if update and update["changed_fields"]:
            fields = {f.strip() for f in update["changed_fields"].split(",")}
            if fields <= IN_PLACE_CHANGES:
                notes.append(
                    "the update changed only fields applied in place; the older replicas kept "
                    "their deployment number in the database, which decides"
                )
    assumed = [v["job_name"] for v in victim_rows if v["deployment_basis"] == "ambiguous_update"]
    if assumed:
        limit(
            "deployment_not_provable_from_logs",
            f"run {run['run_name']}: the update changed only "
            f"{update['changed_fields'] if update else 'replica counts or groups'}, which does "
            "not say which replicas were redeployed and which were bumped in place (pipeline "
            "builds log no bump, reference 11.2 step 6); from the log alone "
            + ", ".join(assumed)
            + " (active at that update) may have been bumped in place or left in the older "
            "deployment and redeployed; the category is the log's best reading, a database of "
            "the same server (jobs.deployment_num) decides",
        )
    sticky = [v["job_name"] for v in victim_rows if v["readiness_line_only"]]
    if sticky:
        limit(
            "health_not_provable_from_logs",
            f"run {run['run_name']}: "
            + ", ".join(sticky)
            + " proven healthy by the readiness line only; it is never retracted and probe "
            "results are DEBUG-only (reference 6.4, 11.3), and the log shows it ready later "
            "than RUNNING (the service has probes), so it may have been failing its probe at "
            "the kill; jobs.ready and the probes' streaks in a database decide",
        )
    if run["stopped_during_cascade"]:
        code, message = stopped_during_cascade(
            run,
            victim_rows,
            ctx.run_event("run_status", old_status="terminating"),
            lambda moment: _at(ctx, moment),
        )
        if run["failure_basis"] == "run_event":
            limitations.append(
                LimitationRecord(code=code, message=message, source=run["provenance"])
            )
        else:
            limit(code, message)
    pending = [v for v in victim_rows if not v["cascade_stop"]]
    if pending:
        expected = expected_stop_reason(run)
        limit(
            "copy_taken_mid_cascade",
            f"run {run['run_name']}: the copy was taken mid-cascade: the run is TERMINATING "
            f"({run['termination_reason']}) and "
            + ", ".join(v["job_name"] for v in pending)
            + f" is still {pending[0]['status']}; dstack's terminating-run pass stops every job "
            f"neither finished nor TERMINATING with {expected} (pipeline_tasks/runs/"
            "terminating.py, process_terminating_run): suspected until a stop is in the evidence",
        )

    evidence: list[EvidenceItem] = []
    if update:
        evidence.append(from_event(update))
    else:
        evidence.append(
            EvidenceItem(
                time=None,
                source=run["provenance"],
                text=(
                    f"run {run['run_name']}: status {run['status']}, termination_reason "
                    f"{run['termination_reason']}, deployment_num {run['deployment_num']} "
                    "(no event records when the update was applied)"
                ),
            )
        )
    for culprit in culprits:
        for earlier in _earlier_failures(ctx, culprit):
            evidence.extend(culprit_evidence(ctx.events_of(earlier), earlier))
        evidence.extend(culprit_evidence(ctx.events_of(culprit), culprit))
    if terminating_event:
        evidence.append(from_event(terminating_event))
    for victim in victim_rows:
        evidence.extend(victim_evidence(ctx.events_of(victim), victim, run))
    for accepted in _accepted_during_cascade(ctx, terminating_event):
        evidence.append(from_event(accepted))
        notes.append(_never_ran(ctx, accepted, terminating_event))
    final = ctx.run_event("run_status", old_status="terminating")
    if final:
        evidence.append(from_event(final))
    elif run["status"] == "terminating":
        notes.append("snapshot taken mid-cascade: the run is still TERMINATING")
    if not ctx.dateless:
        evidence.sort(key=lambda item: (item.time is None, item.time or datetime.min))
    else:
        notes.append("the log gives times of day only: datetimes are left empty, see evidence text")

    stopped_too = [
        _other(
            j,
            f"a victim of this run's {victim_categories[j['job_id']]} finding"
            if j["job_id"] in victim_categories
            else "stopped by the cascade, not decided (see the notes)",
        )
        for j in ctx.jobs
        if j["cascade_stop"]
        and j["job_id"] not in victim_ids
        and j["job_id"] not in culprit_ids
        and not any(o.job_id == j["job_id"] for o in also)
    ]
    return Finding(
        category=category,
        confidence=confidence,
        server=run["server"],
        run_id=run["run_id"],
        run_name=run["run_name"],
        project=run["project"],
        victims=[
            Victim(
                job_id=v["job_id"],
                job_name=v["job_name"],
                rule=v["rule"],
                replica_num=v["replica_num"],
                deployment_num=v["deployment_num"],
                submission_num=v["submission_num"],
                healthy_since=ctx.when(v["healthy_since"]),
                terminated_at=ctx.when(v["stopped_at"]),
                health_proof=HEALTH_PROOFS.get(v["health_proof"], v["health_proof"]),
                stopped=v["cascade_stop"],
                expected_termination_reason=None
                if v["cascade_stop"]
                else expected_stop_reason(run),
            )
            for v in victim_rows
        ],
        culprits=[
            Culprit(
                job_id=c["job_id"],
                job_name=c["job_name"],
                replica_num=c["replica_num"],
                deployment_num=c["deployment_num"],
                submission_num=c["submission_num"],
                termination_reason=c["termination_reason"] or c["event_reason"],
                termination_reason_message=c["termination_reason_message"] or c["event_message"],
                exit_status=c["exit_status"],
                failed_at=ctx.when(_failed_at(c)),
                earlier_failures=[
                    EarlierFailure(
                        job_id=e["job_id"],
                        submission_num=e["submission_num"],
                        termination_reason=e["termination_reason"] or e["event_reason"],
                        termination_reason_message=e["termination_reason_message"]
                        or e["event_message"],
                        exit_status=e["exit_status"],
                        failed_at=ctx.when(_failed_at(e)),
                    )
                    for e in _earlier_failures(ctx, c)
                ],
            )
            for c in culprits
        ],
        run_termination_reason=run["termination_reason"],
        run_failure_reason=run["failure_reason"],
        update_deployment_num=update_dep,
        changed_fields=update["changed_fields"] if update else None,
        updated_by=update["actor"].removeprefix("user ") if update else None,
        also_stopped=[o for o in also if o.job_id not in victim_ids] + stopped_too,
        evidence=evidence,
        notes=notes,
        limitations=limitations,
    )


def _earlier_failures(ctx: _Context, culprit: Row) -> list[Row]:
    """The culprit's replica slot in its deployment, followed back: the earlier submissions
    that failed by themselves, first first. dstack re-submits a failed replica whose failure is
    in `retry.on_events` (services/runs/replicas.py; reference 6.7), so the first failure is
    the root cause and the last the trigger; a slot refilled by a later deployment is another
    story (its deployment differs)."""
    known = ctx.earlier_failures.get(culprit["job_id"])
    if known is None:
        known = ctx.earlier_failures[culprit["job_id"]] = _earlier_failures_of(ctx, culprit)
    return known


def _earlier_failures_of(ctx: _Context, culprit: Row) -> list[Row]:
    rows = [
        j
        for j in ctx.own_failures
        if j["job_id"] != culprit["job_id"]
        and (j["replica_num"], j["job_num"]) == (culprit["replica_num"], culprit["job_num"])
        and j["deployment_num"] == culprit["deployment_num"]
        and (j["submission_num"] or 0) < (culprit["submission_num"] or 0)
    ]
    created = culprit["created_at"]
    updates = [e["time"] for e in ctx.events_by_kind.get("run_updated", ()) if e["time"]]
    deleted = [
        {**d, "deployment_num": culprit["deployment_num"]}
        for d in ctx.deleted
        if d["job_name"] == culprit["job_name"]
        and created is not None
        and d["created_at"] is not None
        and d["created_at"] < created
        # the same deployment: no update came between its creation and the culprit's
        and not any(d["created_at"] < u <= created for u in updates)
    ]
    return sorted(
        [*rows, *deleted],
        key=lambda j: (
            j["created_at"] is None,
            j["created_at"] or datetime.min.replace(tzinfo=UTC),
        ),
    )


def _at(ctx: _Context, moment: datetime | None) -> str:
    if moment is None:
        return "an unknown time"
    if ctx.dateless:
        return moment.strftime("%H:%M:%S.%f")[:-3] + " (time of day)"
    return moment.isoformat()


def _plain_verdicts(runs: pl.DataFrame) -> pl.DataFrame:
    """Verdicts that need no look inside the run, in columns: `why` is null for candidate
    runs (a service a job failure failed or is failing: moments.run_failures, whatever a later
    user stop wrote over the run's reason)."""
    run_type, reason, status = pl.col("run_type"), pl.col("termination_reason"), pl.col("status")
    why = (
        pl.when(run_type.is_not_null() & (run_type != "service"))
        .then(pl.format("a {} run: rolling deployments exist for services only", run_type))
        .when(pl.col("failure_basis").is_not_null())
        .then(pl.lit(None, pl.String))
        .when(status.is_in(ACTIVE_RUN_STATUSES))
        .then(pl.format("run still {} at the end of the evidence", status))
        .when(known(reason))
        .then(pl.format("run ended with {}, not a job failure", reason))
        .otherwise(
            pl.format(
                "run {} without a job failure",
                pl.when(known(status)).then(status).otherwise(pl.lit("in an unknown state")),
            )
        )
    )
    return runs.with_columns(why.alias("_why"))


def detect(
    runs: pl.DataFrame,
    subs: pl.DataFrame,
    events: pl.DataFrame,
    disputed: dict[tuple[str, str], str] | None = None,
    ends: dict[str, datetime] | None = None,
    gaps: dict[tuple[str, str], list[str]] | None = None,
) -> tuple[list[RunVerdict], list[Finding]]:
    """Every run's verdict and the findings. ``disputed`` names runs whose rows disagree
    (evidence.disputed_runs): they are inconclusive whatever the rules say. ``ends``: per
    server, the end of its evidence (Evidence.ends_by_server), when the final rows speak.
    ``gaps``: per run, what its evidence is missing (timeline.evidence_gaps), on its verdict."""
    verdicts, findings = _detect(runs, subs, events, ends or {}, gaps or {})
    if not disputed:
        return verdicts, findings
    return _undecided_where_disputed(verdicts, findings, disputed)


def _undecided_where_disputed(
    verdicts: list[RunVerdict], findings: list[Finding], disputed: dict[tuple[str, str], str]
) -> tuple[list[RunVerdict], list[Finding]]:
    """A run whose own or whose jobs' rows disagree on what the rules read cannot be judged:
    each row could give another verdict, and the evidence does not say which row is true."""
    decided = []
    for verdict in verdicts:
        why = disputed.get((verdict.server, verdict.run_id))
        if why is not None:
            verdict = verdict.model_copy(
                update={
                    "verdict": "inconclusive",
                    "why": f"duplicate rows disagree: {why} (from the rows as merged the rules "
                    f"would say {verdict.verdict})",
                }
            )
        decided.append(verdict)
    return decided, [f for f in findings if (f.server, f.run_id) not in disputed]


def _detect(
    runs: pl.DataFrame,
    subs: pl.DataFrame,
    events: pl.DataFrame,
    ends: dict[str, datetime],
    gaps: dict[tuple[str, str], list[str]],
) -> tuple[list[RunVerdict], list[Finding]]:
    subs = subs.with_columns(
        own_failure().alias("own_failure"), cascade_stop().alias("cascade_stop")
    )
    runs = runs.join(
        run_failures(runs, subs, events), on=["server", "run_id"], how="left", maintain_order="left"
    )
    judged = _plain_verdicts(runs)
    plain = judged.filter(pl.col("_why").is_not_null())
    verdicts = [
        _verdict(run, "no_incident", run["_why"], gaps)
        for run in plain.select(*VERDICT_COLUMNS, "_why").iter_rows(named=True)
    ]
    findings: list[Finding] = []
    # judged in a fixed order, whatever order the sources gave: limitations are reported in
    # the order they are said, so the same evidence must say them in the same order
    candidate_runs = (
        judged.filter(pl.col("_why").is_null())
        .drop("_why")
        .join(next_runs(runs), on=["server", "run_id"], how="left", maintain_order="left")
        .sort(["server", "project", "run_name", "run_id"], nulls_last=True)
    )
    if candidate_runs.is_empty():
        return verdicts, findings
    candidates = _rows(candidate_runs)
    keys = candidate_runs.select("server", "run_id")
    # each job's health at the run's failure, from what the evidence dates by then
    failure_moments = candidate_runs.select("server", "run_id", pl.col("failed_at").alias("as_of"))
    # the candidate runs' events of the kinds read, picked once (one copy of their rows):
    # every read of the events below is of them
    read = _of_runs(events, keys, pl.col("kind").is_in(DETECTION_KINDS))
    with_status = (
        read.filter((pl.col("kind") == "job_status") & (pl.col("entity_type") == "job"))
        .select(
            "server", "run_id", pl.col("entity_id").alias("job_id"), pl.lit(True).alias("_status")
        )
        .unique(["server", "run_id", "job_id"])
    )
    at_failure = pl.col("as_of").is_not_null()
    at_moment = probe_state_at(
        subs.join(failure_moments, on=["server", "run_id"], maintain_order="left")
    )
    # the run's first TERMINATING as the evidence chain reads it (its first such event)
    went_terminating = (
        read.filter((pl.col("kind") == "run_status") & (pl.col("new_status") == "terminating"))
        .group_by(["server", "run_id"], maintain_order=True)
        .first()
        .select("server", "run_id", pl.col("time").alias("run_terminating_at"))
    )
    run_columns = candidate_runs.select(
        "server",
        "run_id",
        "failure_basis",
        "stop_at",
        "stopped_during_cascade",
        pl.col("failed_at").alias("run_failed_at"),
        (pl.col("status") == "terminating").fill_null(False).alias("in_flight"),
    ).join(went_terminating, on=["server", "run_id"], how="left", maintain_order="left")
    judged_jobs = judge_jobs(
        at_moment.join(
            with_status, on=["server", "run_id", "job_id"], how="left", maintain_order="left"
        )
        .select(
            *JOB_COLUMNS,
            "own_failure",
            "cascade_stop",
            (at_failure & pl.col("probe_failing_at")).alias("probe_failed_then"),
            (at_failure & pl.col("probe_passing_at")).alias("probe_passed_then"),
            "probe_line_at",
            "probe_line",
            pl.col("_status").fill_null(False).alias("has_status_event"),
            pl.when(at_failure)
            .then(healthy_at(ends))
            .otherwise(pl.col("health") == "healthy")
            .fill_null(False)
            .alias("healthy_then"),
            (at_failure & dated_after(pl.col("as_of"))).fill_null(False).alias("served_later"),
            served_from().alias("served_from"),
            readiness_line_only().alias("readiness_line_only"),
        )
        .join(run_columns, on=["server", "run_id"], maintain_order="left")
    )
    jobs_by_run = _rows_by_key(judged_jobs.drop(RULES_ONLY_COLUMNS), ["server", "run_id"])
    dateless = dateless_runs(read)
    deleted = deleted_failures(read, subs)  # of created and status events, which are read
    deleted_by_run = _rows_by_key(deleted, ["server", "run_id"])
    # only the events the evidence chain quotes become rows, each with its item's columns
    failed = pl.concat(
        [
            judged_jobs.filter("own_failure").select("server", "job_id"),
            deleted.select("server", "job_id"),
        ]
    )
    victims = judged_jobs.filter(pl.col("rule").is_in(list(CATEGORY_ORDER))).select(
        "server", "job_id"
    )
    quoted = read.filter(quoted_events(_of_jobs(failed), _of_jobs(victims))).with_columns(
        quoted_columns()
    )
    events_by_run = _rows_by_key(
        quoted.filter(pl.col("kind").is_in(["run_status", "run_updated"])).select(
            *RUN_EVENT_COLUMNS, *EVIDENCE_COLUMNS
        ),
        ["server", "run_id"],
    )
    job_events = _rows_by_key(
        quoted.filter(pl.col("entity_type") == "job").select(*JOB_EVENT_COLUMNS, *EVIDENCE_COLUMNS),
        ["server", "run_id", "entity_id"],
    )

    for run in candidates:
        key = (run["server"], run["run_id"])
        judgement = _judge_candidate(
            _Context(
                run,
                jobs_by_run.get(key, []),
                events_by_run.get(key, []),
                job_events,
                key in dateless,
                deleted_by_run.get(key, []),
            )
        )
        verdicts.append(_verdict(run, judgement.verdict, judgement.why, gaps))
        findings.extend(judgement.findings)
    return verdicts, findings


def _rows(frame: pl.DataFrame) -> list[Row]:
    """`frame.rows(named=True)`, built column by column (its times are most of the cost)."""
    names = frame.columns
    columns = zip(*map(python_values, frame.iter_columns()), strict=True)
    return [dict(zip(names, values, strict=True)) for values in columns]


def _rows_by_key(frame: pl.DataFrame, key: list[str]) -> dict[tuple, list[Row]]:
    """`frame.rows_by_key(key, named=True)`, its rows as `_rows` builds them."""
    grouped: dict[tuple, list[Row]] = defaultdict(list)
    keys = zip(*(frame[name].to_list() for name in key), strict=True)
    for k, row in zip(keys, _rows(frame.drop(key)), strict=True):
        grouped[k].append(row)
    return grouped


def dateless_runs(events: pl.DataFrame) -> set[tuple[str, str]]:
    """The (server, run_id) of the runs `events` give times of day only (a rich log alone):
    none, without a query, when every event is dated (a database)."""
    dateless = events["time_basis"] == "time_of_day_only"
    if not dateless.any():
        return set()
    return set(events.filter(dateless).select("server", "run_id").iter_rows())


def _of_jobs(jobs: pl.DataFrame) -> pl.Expr:
    """An event of one of `jobs` (server, job_id): a lookup, as _of_runs."""
    wanted = jobs.select(pl.struct("server", "job_id")).to_series().implode()
    key = pl.struct("server", pl.col("entity_id").alias("job_id"))
    return (pl.col("entity_type") == "job") & key.is_in(wanted).fill_null(False)


def _of_runs(frame: pl.DataFrame, keys: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """`frame`'s rows of the runs `keys` names (unique) where `where` holds, in their order:
    what an inner join on (server, run_id) keeps, by a lookup (the join cost six times as
    much over the events)."""
    wanted = keys.select(pl.struct("server", "run_id")).to_series().implode()
    known = pl.col("server").is_not_null() & pl.col("run_id").is_not_null()
    return frame.filter(known & pl.struct("server", "run_id").is_in(wanted) & where)


VERDICT_COLUMNS = (
    "server",
    "run_id",
    "run_name",
    "project",
    "run_type",
    "status",
    "termination_reason",
    "deployment_num",
)


def _verdict(
    run: Row, verdict: Verdict, why: str, gaps: dict[tuple[str, str], list[str]]
) -> RunVerdict:
    return RunVerdict(
        server=run["server"],
        run_id=run["run_id"],
        run_name=run["run_name"],
        project=run["project"],
        run_type=run["run_type"],
        status=run["status"],
        termination_reason=run["termination_reason"],
        deployment_num=run["deployment_num"],
        verdict=verdict,
        why=why,
        in_progress=run["status"] not in (*FINISHED_RUN_STATUSES, None),
        gaps=gaps.get((run["server"], run["run_id"]), []),
    )
