"""Partitions of one audit, merged into the report one process gives.

A partition reads whole services, but an instance is held, and a placement refused, by runs of
every partition: the capacity foresight (analyzer.pipeline.exposure.foresight) of a finding
needs them all. So each partition sends, beside its report, a `ForesightPiece`, and the merge
works the foresight out once over every partition's findings and pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from analyzer.contract import Finding, Report
from analyzer.pipeline.assemble import merge_reports
from analyzer.pipeline.exposure import Frames
from analyzer.pipeline.foresight import foresight, wanted_findings

# What the foresight reads of the submissions of runs other than the probed ones: the
# instances they hold (`held`), the provider's refusals (`refused`) and the jobs waiting in
# dstack's queue (analyzer.pipeline.placement.queued_at), in timeline order; and of their runs.
_CROSS_RUN_COLUMNS = (
    "server",
    "run_id",
    "job_name",
    "replica_num",
    "job_num",
    "submission_num",
    "instance_id",
    "created_at",
    "stopped_at",
    "blocks",
    "termination_reason",
    "termination_reason_message",
    "replica_group",
    "status",
    "left_queue_at",
    # who held a fleet's room at a failure (foresight, placement.holders_at)
    "fleet_name",
    "deployment_num",
    "instance_name",
    "health",
    "health_proof",
)
_CROSS_RUN_RUN_COLUMNS = ("server", "run_id", "project", "run_name", "fleet_id", "placement_spec")
_TIMELINE_ORDER = ["server", "run_id", "replica_num", "job_num", "submission_num"]


@dataclass
class ForesightPiece:
    """One partition's share of the capacity foresight's facts. An instance is held, and a
    placement refused, by runs of every partition, so the foresight is worked out once, over
    every partition's findings, when they are merged (as in one process): each partition
    sends the few columns of its other runs' jobs that tell what they held, were refused or
    waited for (and of those runs), the whole rows of its runs with a no-capacity culprit, and
    (the first partition, or each server of a fleet) the fleets and instances it read."""

    runs: pl.DataFrame
    submissions: pl.DataFrame
    deployments: pl.DataFrame
    dateless: set[tuple[str, str]]
    updates: pl.DataFrame | None  # the "Run updated" events of its runs (specs.run_spec_at)
    fleets: pl.DataFrame | None
    instances: pl.DataFrame | None
    fleet_table_servers: set[str]
    server_versions: dict[str, str]
    evidence_ends: dict[str, datetime]
    narrowed: bool  # --project or --since: other runs' jobs were not read at all
    secrets: set[str]  # the partition's known secret values, to mask what the foresight says


def foresight_piece(
    frames: Frames,
    findings: list[Finding],
    deployments: pl.DataFrame,
    dateless: set[tuple[str, str]],
    *,
    whole_tables: bool,
    narrowed: bool,
    secrets: set[str],
) -> ForesightPiece:
    """This partition's `ForesightPiece` (`whole_tables`: it carries the fleets and
    instances, which every partition reads whole)."""
    key = pl.DataFrame(
        sorted({(f.server, f.run_id) for f in wanted_findings(findings)}),
        schema={"server": pl.String, "run_id": pl.String},
        orient="row",
    )
    subs = frames.submissions
    # every job of another run may have held an instance, been refused one or waited in the
    # queue at a moment a probe asks about: the moments are known only at the merge
    others = subs.join(key, on=["server", "run_id"], how="anti").select(_CROSS_RUN_COLUMNS)
    runs = pl.concat(
        [
            frames.runs.join(key, on=["server", "run_id"], how="semi"),
            frames.runs.join(key, on=["server", "run_id"], how="anti").select(
                _CROSS_RUN_RUN_COLUMNS
            ),
        ],
        how="diagonal_relaxed",
    )
    return ForesightPiece(
        runs=runs,
        submissions=pl.concat(
            [subs.join(key, on=["server", "run_id"], how="semi"), others], how="diagonal_relaxed"
        ),
        deployments=deployments.join(key, on=["server", "run_id"], how="semi"),
        dateless=dateless,
        updates=frames.updates,
        fleets=frames.fleets if whole_tables else None,
        instances=frames.instances if whole_tables else None,
        fleet_table_servers=frames.fleet_table_servers,
        server_versions=frames.server_versions,
        evidence_ends=frames.evidence_ends,
        narrowed=narrowed,
        secrets=secrets,
    )


def foresight_of_pieces(findings: list[Finding], pieces: list[ForesightPiece]) -> list[Finding]:
    """`foresight` over the merged findings of every partition, from their pieces: the same
    facts, in the same order, as one process reads (each new answer masked with the
    partitions' known secrets, as the partitions masked the rest of their findings)."""
    from analyzer.redact import Redactor

    # every piece that read fleets and instances: the first partition's, or each server's
    whole = [p for p in pieces if p.fleets is not None]
    frames = Frames(
        runs=pl.concat([p.runs for p in pieces], how="diagonal_relaxed"),
        submissions=pl.concat([p.submissions for p in pieces], how="diagonal_relaxed").sort(
            _TIMELINE_ORDER, maintain_order=True
        ),
        fleets=pl.concat([p.fleets for p in whole], how="diagonal_relaxed"),
        instances=pl.concat([p.instances for p in whole], how="diagonal_relaxed"),
        fleet_table_servers=set().union(*(p.fleet_table_servers for p in pieces)),
        server_versions={k: v for p in pieces for k, v in p.server_versions.items()},
        narrowed=any(p.narrowed for p in pieces),
        evidence_ends={k: v for p in pieces for k, v in p.evidence_ends.items()},
        updates=pl.concat(
            [p.updates for p in pieces if p.updates is not None], how="diagonal_relaxed"
        )
        if any(p.updates is not None for p in pieces)
        else None,
    )
    deployments = pl.concat([p.deployments for p in pieces], how="diagonal_relaxed")
    dateless = set().union(*(p.dateless for p in pieces))
    redactor = Redactor(values=set().union(*(p.secrets for p in pieces)))
    answered = list(foresight(frames, findings, deployments, dateless))
    worked = [
        i
        for i, (old, new) in enumerate(zip(findings, answered, strict=True))
        if new.capacity_foresight is not None and new is not old
    ]
    # every new answer masked in one pass: each distinct text once, not once per finding
    masked = redactor.apply_model([answered[i].capacity_foresight for i in worked], controls=True)
    for i, answer in zip(worked, masked, strict=True):
        answered[i] = answered[i].model_copy(update={"capacity_foresight": answer})
    return answered


@dataclass
class PartitionResult:
    """What one partition of a larger audit returns: its report (its findings without their
    capacity foresight) and its share of the foresight's facts."""

    report: Report
    foresight: ForesightPiece


def merge_partitions(results: list[PartitionResult]) -> Report:
    """The merged report of the partitions, each finding's capacity foresight worked out over
    every partition's facts, every text masked with every partition's known secret values:
    the report one process gives."""
    from analyzer.redact import Redactor

    pieces = [r.foresight for r in results]
    merged = merge_reports(
        [r.report for r in results],
        complete=lambda findings: foresight_of_pieces(findings, pieces),
    )
    # one process masks every text with the secret values of all the inputs: a value one
    # partition's (or server's) runs hold and another's free text repeats is masked there too
    known = Redactor(values=set().union(*(p.secrets for p in pieces)))
    return known.guard_model(merged)
