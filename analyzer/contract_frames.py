"""The report's records as polars frames, for notebooks and SQL (one row per record): the contract
in columns, kept beside it: the library (Audit.tables) and the renderers both read them."""

from __future__ import annotations

import polars as pl

from analyzer.contract import Report
from analyzer.model import UTC_TIME

T = UTC_TIME

VERDICTS = {
    "server": pl.String,
    "run_id": pl.String,
    "project": pl.String,
    "run_name": pl.String,
    "run_type": pl.String,
    "status": pl.String,
    "termination_reason": pl.String,
    "deployment_num": pl.Int64,
    "verdict": pl.String,
    "why": pl.String,
    "in_progress": pl.Boolean,
    "gaps": pl.List(pl.String),
}
FINDINGS = {
    "rank": pl.Int64,
    "server": pl.String,
    "run_id": pl.String,
    "project": pl.String,
    "run_name": pl.String,
    "category": pl.String,
    "confidence": pl.String,
    "run_termination_reason": pl.String,
    "update_deployment_num": pl.Int64,
    "changed_fields": pl.String,
    "updated_by": pl.String,
    "victims": pl.Int64,
    "failure_class": pl.String,
    "fleets": pl.List(pl.String),
    "outage_start": T,
    "recovered_at": T,
    "recovered": pl.Boolean,
    "outage_seconds": pl.Float64,
    "outage_is_lower_bound": pl.Boolean,
    "healthy_replica_seconds_lost": pl.Float64,
    "lost_cost": pl.Float64,
    "healthy_replica_seconds_lost_is_lower_bound": pl.Boolean,
    "lost_cost_is_lower_bound": pl.Boolean,
    "cost_unknown_victims": pl.Int64,
}
VICTIMS = {
    "rank": pl.Int64,
    "server": pl.String,
    "run_id": pl.String,
    "category": pl.String,
    "project": pl.String,
    "run_name": pl.String,
    "job_id": pl.String,
    "job_name": pl.String,
    "replica_num": pl.Int64,
    "deployment_num": pl.Int64,
    "healthy_since": T,
    "terminated_at": T,
    "health_proof": pl.String,
    "price_per_hour": pl.Float64,
    "lost_seconds": pl.Float64,
    "lost_cost": pl.Float64,
}
CULPRITS = {
    "rank": pl.Int64,
    "server": pl.String,
    "run_id": pl.String,
    "job_id": pl.String,
    "job_name": pl.String,
    "replica_num": pl.Int64,
    "deployment_num": pl.Int64,
    "termination_reason": pl.String,
    "termination_reason_message": pl.String,
    "exit_status": pl.Int64,
    "failed_at": T,
}
EVIDENCE = {
    "rank": pl.Int64,
    "run_id": pl.String,
    "time": T,
    "source": pl.String,
    "text": pl.String,
}
INPUTS = {
    "path": pl.String,
    "kind": pl.String,
    "sha256": pl.String,
    "size": pl.Int64,
    "records": pl.Int64,
    "unparsed": pl.Int64,
    "server_version": pl.String,
}
LIMITATIONS = {"code": pl.String, "message": pl.String, "source": pl.String}


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def verdicts(report: Report) -> pl.DataFrame:
    return _frame([v.model_dump(include=set(VERDICTS)) for v in report.runs], VERDICTS)


def findings(report: Report) -> pl.DataFrame:
    rows = []
    for rank, f in enumerate(report.findings, 1):
        impact = f.impact
        rows.append(
            {
                "rank": rank,
                "server": f.server,
                "run_id": f.run_id,
                "project": f.project,
                "run_name": f.run_name,
                "category": f.category,
                "confidence": f.confidence,
                "run_termination_reason": f.run_termination_reason,
                "update_deployment_num": f.update_deployment_num,
                "changed_fields": f.changed_fields,
                "updated_by": f.updated_by,
                "victims": len(f.victims),
                "failure_class": f.root_cause.failure_class if f.root_cause else None,
                "fleets": f.root_cause.fleets if f.root_cause else [],
                "outage_start": impact.outage_start if impact else None,
                "recovered_at": impact.recovered_at if impact else None,
                "recovered": impact.recovered if impact else None,
                "outage_seconds": impact.outage_seconds if impact else None,
                "outage_is_lower_bound": impact.outage_is_lower_bound if impact else None,
                "healthy_replica_seconds_lost": impact.healthy_replica_seconds_lost
                if impact
                else None,
                "lost_cost": impact.lost_cost if impact else None,
                # as the CLI says it: "≥" and "(+N unknown)" (analyzer.render.format)
                "healthy_replica_seconds_lost_is_lower_bound": (
                    impact.healthy_replica_seconds_lost_is_lower_bound if impact else None
                ),
                "lost_cost_is_lower_bound": impact.lost_cost_is_lower_bound if impact else None,
                "cost_unknown_victims": len(impact.per_victim) - impact.cost_known_for
                if impact
                else None,
            }
        )
    return _frame(rows, FINDINGS)


def victims(report: Report) -> pl.DataFrame:
    rows = []
    for rank, f in enumerate(report.findings, 1):
        per_victim = {v.job_id: v for v in (f.impact.per_victim if f.impact else [])}
        for v in f.victims:
            cost = per_victim.get(v.job_id)
            rows.append(
                {
                    "rank": rank,
                    "server": f.server,
                    "run_id": f.run_id,
                    "category": f.category,
                    "project": f.project,
                    "run_name": f.run_name,
                    **v.model_dump(exclude={"submission_num"}),
                    "price_per_hour": cost.price_per_hour if cost else None,
                    "lost_seconds": cost.lost_seconds if cost else None,
                    "lost_cost": cost.lost_cost if cost else None,
                }
            )
    return _frame(rows, VICTIMS)


def culprits(report: Report) -> pl.DataFrame:
    rows = [
        {
            "rank": rank,
            "server": f.server,
            "run_id": f.run_id,
            **c.model_dump(exclude={"submission_num"}),
        }
        for rank, f in enumerate(report.findings, 1)
        for c in f.culprits
    ]
    return _frame(rows, CULPRITS)


def evidence(report: Report) -> pl.DataFrame:
    rows = [
        {"rank": rank, "run_id": f.run_id, **e.model_dump()}
        for rank, f in enumerate(report.findings, 1)
        for e in f.evidence
    ]
    return _frame(rows, EVIDENCE)


def inputs(report: Report) -> pl.DataFrame:
    return _frame([i.model_dump(include=set(INPUTS)) for i in report.inputs], INPUTS)


def limitations(report: Report) -> pl.DataFrame:
    return _frame([lim.model_dump() for lim in report.limitations], LIMITATIONS)
