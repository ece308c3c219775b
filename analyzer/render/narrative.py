"""The story of a finding, in words: a few sentences with times in the display zone, told from
the run's story (pipeline/story.py). Times of day only say so; nothing is guessed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from analyzer.contract import Finding, RunVerdict
from analyzer.dstack import USER_STOP_RUN_REASONS
from analyzer.pipeline.story import RunStory, tell
from analyzer.render.format import (
    Clock,
    actor_name,
    describe_failure,
    field_names,
    floor_duration,
    floor_money,
    fmt_money,
    fmt_seconds,
    resolve_zone,
)


@dataclass
class _Facts:
    """The moments of one incident, from the finding and (for undated logs) the frames."""

    clock: Clock
    run_label: str
    update_at: datetime | None
    update_first_job_at: datetime | None
    actor: str | None
    fields: str | None
    culprit_at: list[datetime | None]
    terminating_at: datetime | None
    victim_stops: list[datetime | None]
    victim_since: list[datetime | None]
    end_of_evidence: datetime | None
    outage_end_seen: bool  # the capacity stayed at zero until the end of the evidence


def run_label(item: Any) -> str:
    label = f"{item.project}/{item.run_name}" if item.project else item.run_name
    return f"{item.server}:{label}" if item.server != "default" else label


class RunFrames:
    """The audit's frames split by run once, for the runs that have findings, and each run's
    story told once: a report of 1,000 findings then reads each run's rows directly instead
    of filtering whole frames per finding."""

    NAMES = ("submissions", "events", "runs", "deployments", "capacity")

    def __init__(self, audit: Any, findings: Sequence[Finding]) -> None:
        self.audit = audit
        keys = pl.DataFrame(
            {"server": [f.server for f in findings], "run_id": [f.run_id for f in findings]},
            schema={"server": pl.String, "run_id": pl.String},
        ).unique()
        self.parts = {
            name: getattr(audit, name)
            .join(keys, on=["server", "run_id"], how="semi")
            .partition_by(["server", "run_id"], as_dict=True)
            for name in self.NAMES
        }
        self.empty = {name: getattr(audit, name).clear() for name in self.NAMES}
        self.stories: dict[tuple[str, str], RunStory] = {}
        self.findings: dict[tuple[str, str], list[Finding]] = {}
        self.verdicts: dict[tuple[str, str], RunVerdict] = {}
        self.ends: dict[bool, dict[str, datetime]] = {}
        self.facts: dict[tuple[int, str | None], _Facts] = {}

    def get(self, name: str, finding: Finding) -> pl.DataFrame:
        return self.parts[name].get((finding.server, finding.run_id), self.empty[name])

    def _ends_by_server(self, *, dated_only: bool = True) -> dict[str, datetime]:
        """The evidence's end per server, computed once per report (not once per run)."""
        if dated_only not in self.ends:
            self.ends[dated_only] = self.audit.evidence.ends_by_server(dated_only=dated_only)
        return self.ends[dated_only]

    def story(self, finding: Finding) -> RunStory:
        """The story of the finding's run, told once per run."""
        key = (finding.server, finding.run_id)
        if key not in self.stories:
            runs = self.get("runs", finding)
            run = runs.row(0, named=True) if runs.height else {"server": key[0], "run_id": key[1]}
            if not self.verdicts:
                for verdict in self.audit.report.runs:
                    self.verdicts.setdefault((verdict.server, verdict.run_id), verdict)
                for found in self.audit.report.findings:
                    self.findings.setdefault((found.server, found.run_id), []).append(found)
            verdict = self.verdicts.get(key)
            self.stories[key] = tell(
                run,
                submissions=self.get("submissions", finding),
                events=self.get("events", finding),
                deployments=self.get("deployments", finding),
                capacity=self.get("capacity", finding),
                findings=self.findings.get(key, []),
                verdicts=[verdict] if verdict else [],
                end_of_evidence=self.audit.end_of_evidence,
                ends_by_server=self._ends_by_server,
            )
        return self.stories[key]


def incident_facts(
    audit: Any, finding: Finding, tz: str | None, frames: RunFrames | None = None
) -> _Facts:
    frames = frames or RunFrames(audit, [finding])
    memo = (id(finding), tz)
    if memo not in frames.facts:
        frames.facts[memo] = _read_facts(frames.story(finding), finding, tz)
    return frames.facts[memo]


def _read_facts(story: RunStory, finding: Finding, tz: str | None) -> _Facts:
    """The moments of `finding` in words' order, from its run's story."""
    ok = story.on_clock
    jobs = {row["job_id"]: row for row in story.submissions.iter_rows(named=True)}
    update_at = first_job = None
    actor, fields = finding.updated_by, finding.changed_fields
    if finding.update_deployment_num is not None:
        deps = story.deployments.filter(pl.col("deployment_num") == finding.update_deployment_num)
        if deps.height:
            dep = deps.row(0, named=True)
            update_at = ok(dep["began_at"])
            first_job = ok(dep["first_job_at"])
            actor = actor or actor_name(dep["actor"])
            fields = fields or ", ".join(dep["changed_fields"] or []) or None

    def job_time(job_id: str, name: str) -> datetime | None:
        job = jobs.get(job_id)
        return ok(job.get(name)) if job else None

    culprit_at = [ok(c.failed_at) or job_time(c.job_id, "stopped_at") for c in finding.culprits]
    victim_stops = [
        ok(v.terminated_at) or job_time(v.job_id, "stopped_at") for v in finding.victims
    ]
    victim_since = [
        ok(v.healthy_since)
        or job_time(v.job_id, "healthy_since")
        or job_time(v.job_id, "running_at")
        for v in finding.victims
    ]
    end = ok(finding.impact.end_of_evidence if finding.impact else None) or ok(
        story.end_of_evidence
    )
    seen = False
    if victim_stops and all(victim_stops) and end is not None:
        last = max(s for s in victim_stops if s is not None)
        after = [n for t, n in story.capacity if last <= t < end]
        seen = bool(after) and after[-1] == 0 and all(n == 0 for n in after)
    return _Facts(
        clock=Clock(resolve_zone(tz), story.dateless),
        run_label=run_label(finding),
        update_at=update_at,
        update_first_job_at=first_job,
        actor=actor_name(actor) if actor else None,
        fields=field_names(fields),
        culprit_at=culprit_at,
        terminating_at=min(story.terminating_at(), default=None),
        victim_stops=victim_stops,
        victim_since=victim_since,
        end_of_evidence=end,
        outage_end_seen=seen,
    )


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _names(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def narrative(
    audit: Any, finding: Finding, *, tz: str | None = None, frames: RunFrames | None = None
) -> str:
    """What happened, in a few sentences, with times in the display zone (`code` in
    backticks). Times of day only say so; nothing is guessed. `frames`: the audit split by
    run (RunFrames), when many findings are told."""
    f = incident_facts(audit, finding, tz, frames)
    clock = f.clock
    first_time = next(
        (
            t
            for t in (f.update_at, f.update_first_job_at, *f.culprit_at, *f.victim_stops)
            if t is not None
        ),
        None,
    )
    said_date = False

    def at(value: datetime | None) -> str:
        nonlocal said_date
        if value is None:
            return "at an unrecorded time"
        if clock.dateless:
            text = f"at {clock.tod(value)}"
            if not said_date:
                text += " (local time of day; the date is unknown)"
            said_date = True
            return text
        if not said_date:
            said_date = True
            local = clock.local(value)
            return f"on {local:%Y-%m-%d} at {clock.tod(value)} ({clock.zone_label(value)})"
        return f"at {clock.near(value, first_time)}"

    sentences = []
    dep = finding.update_deployment_num
    if dep is not None:
        what = f"`{f.fields}`" if f.fields else "the configuration"
        if f.update_at is not None:
            who = f.actor or "someone"
            sentences.append(
                f"{_upper_first(at(f.update_at))} {who} updated {what} of {f.run_label} "
                f"(deployment {dep})."
            )
        elif f.update_first_job_at is not None:
            sentences.append(
                f"{f.run_label} was updated to deployment {dep}"
                + (f" ({what})" if f.fields else "")
                + f"; no event records when or by whom, its first new job was created "
                f"{at(f.update_first_job_at)}."
            )
        else:
            sentences.append(
                f"{f.run_label} was moved to deployment {dep} at an unrecorded time "
                "(no event, no new job)."
            )
    for culprit, when in zip(finding.culprits, f.culprit_at, strict=True):
        newer = (
            finding.category == "collateral_termination"
            and dep is not None
            and culprit.deployment_num == dep
        )
        who = (
            f"the new replica {culprit.job_name}"
            if newer
            else f"the replica {culprit.job_name} of deployment {culprit.deployment_num}"
        )
        sentences.append(_upper_first(f"{at(when)} {who} {describe_failure(culprit)}."))
    # the reason the run failed with, not one a user's stop wrote over it later
    # (services/runs/__init__.py, stop_runs)
    final = finding.run_termination_reason
    failed_with = finding.run_failure_reason or (
        final if final not in USER_STOP_RUN_REASONS else None
    )
    reason = (failed_with or "").upper() or "reason not recorded"
    failed_when = max((t for t in f.culprit_at if t is not None), default=None)
    if f.terminating_at is not None and failed_when is not None:
        delta = (f.terminating_at - failed_when).total_seconds()
        run_part = (
            f"{fmt_seconds(delta)} later dstack failed the whole run ({reason})"
            if delta >= 0
            else f"dstack failed the whole run ({reason}) {at(f.terminating_at)}"
        )
    elif f.terminating_at is not None:
        run_part = f"dstack failed the whole run ({reason}) {at(f.terminating_at)}"
    else:
        run_part = f"dstack then failed the whole run ({reason})"
    by_dep: dict[int | None, list[int]] = {}
    for i, victim in enumerate(finding.victims):
        by_dep.setdefault(victim.deployment_num, []).append(i)
    stop_parts = []
    pending = [v for v in finding.victims if not v.stopped]
    for vdep, every in by_dep.items():
        idx = [i for i in every if finding.victims[i].stopped]
        if not idx:
            continue
        names = [finding.victims[i].job_name for i in idx]
        stops = [f.victim_stops[i] for i in idx]
        since = [f.victim_since[i] for i in idx if f.victim_since[i] is not None]
        known = [s for s in stops if s is not None]
        when = at(min(known)) if known else "at an unrecorded time"
        same = finding.category == "same_deployment_collateral" or (dep is not None and vdep == dep)
        whose = "of the same deployment" if same else f"of deployment {vdep}"
        noun = "the healthy replica" if len(names) == 1 else f"the {len(names)} healthy replicas"
        part = f"{when} stopped {noun} {_names(names)} {whose}"
        if since:
            first, last = min(since), max(since)
            served = clock.near(first, first_time)
            if (last - first).total_seconds() > 1:
                served += f"–{clock.near(last, first_time)}"
            part += f", which had served since {served}"
        stop_parts.append(part)
    if pending:
        # a copy taken mid-cascade: the stop has not happened, only dstack's next pass will
        expected = " / ".join(sorted({v.expected_termination_reason or "?" for v in pending}))
        noun = (
            "the healthy replica" if len(pending) == 1 else f"the {len(pending)} healthy replicas"
        )
        stop_parts.append(
            f"doomed {noun} {_names([v.job_name for v in pending])}, not yet stopped when the "
            f"evidence ends (dstack's terminating pass is expected to stop "
            f"{'it' if len(pending) == 1 else 'them'} with `{expected}`)"
        )
    sentences.append(run_part + " and " + "; ".join(stop_parts) + ".")
    impact = finding.impact
    if impact and impact.recovered and impact.recovered_at:
        same = impact.recovered_by_run_id == finding.run_id
        sentences.append(
            f"The service served again {at(impact.recovered_at)}"
            + ("" if same else f" (run {(impact.recovered_by_run_id or '?')[:8]})")
            + f", after an outage of "
            f"{_prose(impact.outage_seconds, impact.outage_is_lower_bound)}."
        )
    elif impact and impact.outage_start is not None:
        sentences.append(
            "The service has not served since (as of "
            f"{clock.near(impact.end_of_evidence, first_time)}, the end of the evidence): an "
            f"outage of {_prose(impact.outage_seconds, impact.outage_is_lower_bound)}."
        )
    elif f.outage_end_seen:
        sentences.append(
            "The service did not serve again before the end of the evidence "
            f"({clock.near(f.end_of_evidence, first_time)})."
        )
    elif impact is not None:
        sentences.append("How long the service was down is not known from the evidence.")
    if impact and impact.healthy_replica_seconds_lost is not None:
        unknown = impact.replica_time_unknown_victims
        cost_unknown = len(impact.per_victim) - impact.cost_known_for
        sentences.append(
            f"{_plural(impact.replicas_lost, 'healthy replica')} lost "
            + _prose(
                impact.healthy_replica_seconds_lost,
                impact.healthy_replica_seconds_lost_is_lower_bound,
            )
            + " of serving time"
            + (f" (and {unknown} an unknown time)" if unknown else "")
            + (
                ", "
                + (
                    "at least " + fmt_money(floor_money(impact.lost_cost))
                    if impact.lost_cost_is_lower_bound
                    else fmt_money(impact.lost_cost)
                )
                + " at the instances' prices"
                + (f" (+{cost_unknown} at a price not known)" if cost_unknown else "")
                + "."
                if impact.lost_cost is not None
                else " (price unknown)."
            )
        )
    return " ".join(sentences)


def _prose(seconds: float | None, lower_bound: bool) -> str:
    """A duration in a sentence: 'at least 2m58s' for a lower bound, 'an unknown time'."""
    if seconds is None:
        return "an unknown time"
    return (
        "at least " + fmt_seconds(floor_duration(seconds)) if lower_bound else fmt_seconds(seconds)
    )
