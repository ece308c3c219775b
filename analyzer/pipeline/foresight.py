"""The capacity foresight of a finding (its `capacity_foresight`): the surge capacity of
its fleet(s) as of just before the update that started the failing deployment, the same
computation as `dstack-audit exposure --as-of` that moment (analyzer.pipeline.exposure), for
the spec that update put in force (the surge replica's, from the spec history:
analyzer.pipeline.specs)."""

from __future__ import annotations

import re

import polars as pl

from analyzer.contract import CapacityForesight, Finding
from analyzer.pipeline.exposure import BEFORE_UPDATE, NO_CAPACITY, Frames, assess_states
from analyzer.pipeline.placement import holders_at

DATELESS = CapacityForesight(
    as_of=None,
    surge_capacity="unknown",
    foreseeable=None,
    reasons=["the update's date is unknown (a rich log alone gives times of day only)"],
)


def wanted_findings(findings: list[Finding]) -> list[Finding]:
    """The findings whose culprit failed for lack of capacity: those the foresight speaks of."""
    return [f for f in findings if any(c.termination_reason == NO_CAPACITY for c in f.culprits)]


def foresight(
    frames: Frames,
    findings: list[Finding],
    deployments: pl.DataFrame,
    dateless: set[tuple[str, str]] = frozenset(),
) -> list[Finding]:
    """Each finding whose culprit failed for lack of capacity, with the surge capacity as of
    just before the update that started the failing deployment (unknown for the `dateless`
    (server, run id) pairs: no date places the update among the tables' times)."""
    wanted = wanted_findings(findings)
    if not wanted:
        return findings
    asked = [
        (
            finding.server,
            finding.run_id,
            next(c for c in finding.culprits if c.termination_reason == NO_CAPACITY).deployment_num,
        )
        for finding in wanted
        if (finding.server, finding.run_id) not in dateless
    ]
    key = ["server", "run_id", "deployment_num"]
    probes = (
        pl.DataFrame(
            asked,
            schema={
                "server": pl.String,
                "run_id": pl.String,
                "deployment_num": deployments.schema["deployment_num"],
            },
            orient="row",
        )
        .join(
            deployments.select(*key, pl.coalesce("began_at", "first_job_at").alias("began")),
            on=key,
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        .drop_nulls("began")
        .select(
            "server",
            "run_id",
            (pl.col("began") - BEFORE_UPDATE).cast(pl.Datetime("us", "UTC")).alias("as_of"),
            # the surge replica runs the spec the update put in force (specs.run_spec_at)
            pl.col("began").cast(pl.Datetime("us", "UTC")).alias("spec_as_of"),
        )
        .unique(maintain_order=True)
    )
    states = {
        (a.row["server"], a.row["run_id"]): a
        for a in assess_states(frames, probes, [], detail=False)
    }
    holders = _capacity_holders(wanted, frames)
    updated = []
    for finding in findings:
        state = states.get((finding.server, finding.run_id))
        no_capacity = any(c.termination_reason == NO_CAPACITY for c in finding.culprits)
        if no_capacity and (finding.server, finding.run_id) in dateless:
            updated.append(finding.model_copy(update={"capacity_foresight": DATELESS}))
            continue
        if state is None or not no_capacity:
            updated.append(finding)
            continue
        reasons = [*state.reasons[1:], *holders.get((finding.server, finding.run_id), [])]
        update: dict = {
            "capacity_foresight": CapacityForesight(
                as_of=state.row["as_of"],
                surge_capacity=state.surge,
                foreseeable={"none": True, "available": False}.get(state.surge),
                reasons=reasons,
            )
        }
        root = _root_cause_naming_the_queue(finding, state.surge, reasons)
        if root is not None:
            update["root_cause"] = root
        updated.append(finding.model_copy(update=update))
    return updated


HOLDERS_NAMED = 3  # per finding: the jobs that held the room, the rest counted


def _capacity_holders(findings: list[Finding], frames: Frames) -> dict[tuple, list[str]]:
    """Per finding whose culprit was refused 'Fleet is at capacity': who held the fleet's room
    at that moment (placement.holders_at), named with its run, since when and until when, and
    its final health; this run's own replicas included."""
    failures = pl.DataFrame(
        [
            {
                "i": i,
                "server": f.server,
                "fleet_name": name,
                "as_of": c.failed_at,
                "own": f.run_id,
            }
            for i, f in enumerate(findings)
            for c in f.culprits[:1]
            if c.failed_at is not None
            and "fleet is at capacity" in (c.termination_reason_message or "").lower()
            for name in (f.root_cause.fleets if f.root_cause else [])
        ],
        schema={
            "i": pl.Int64,
            "server": pl.String,
            "fleet_name": pl.String,
            "as_of": pl.Datetime("us", "UTC"),
            "own": pl.String,
        },
    )
    if failures.is_empty():
        return {}
    held = holders_at(failures, frames.submissions, frames.runs, HOLDERS_NAMED)
    said: dict[tuple, list[str]] = {}
    for row in held.iter_rows(named=True):
        whose = "this run's" if row["run_id"] == row["own"] else f"run {row['run_name']}'s"
        until = (
            f"until {row['stopped_at']:%Y-%m-%d %H:%M:%S}"
            if row["stopped_at"]
            else "still there at the end of the evidence"
        )
        finding = findings[row["i"]]
        said.setdefault((finding.server, finding.run_id), []).append(
            f"at the failure ({row['as_of']:%Y-%m-%d %H:%M:%S}) fleet {row['fleet_name']} was at "
            f"capacity: {whose} {row['job_name']} (deployment {row['deployment_num']}) held "
            f"instance {row['instance_name']} since {row['created_at']:%Y-%m-%d %H:%M:%S}, "
            f"{until} (health: {row['health']}"
            + (f", {row['health_proof']}" if row["health_proof"] else "")
            + ")"
            + (
                f"; and {row['of'] - HOLDERS_NAMED} more job(s) on its instances"
                if row["rank"] == HOLDERS_NAMED - 1 and row["of"] > HOLDERS_NAMED
                else ""
            )
        )
    return said


_QUEUE_TOOK_IT = "the room left goes to other runs' queued replicas first"
_QUEUED_RUN = r"run (\S+)'s queued (\S+)"


def _root_cause_naming_the_queue(finding: Finding, surge: str, reasons: list[str]):
    """The root cause of a no-capacity failure whose room another run's queued replica took:
    that run named (placement.queued_first: dstack places the queue by priority, then age)."""
    root = finding.root_cause
    if root is None or surge != "none":
        return None
    taken = [found for r in reasons if _QUEUE_TOOK_IT in r for found in re.findall(_QUEUED_RUN, r)]
    if not taken:
        return None
    runs = ", ".join(dict.fromkeys(f"run {run} ({job})" for run, job in taken))
    return root.model_copy(
        update={
            "detail": f"{root.detail}; the room the surge replica needed went first to the "
            f"queued replica of {runs}, which dstack places before it (priority, then age: "
            "jobs_submitted.py)"
        }
    )
