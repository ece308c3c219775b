"""The JSON report: a stable, versioned contract (bump SCHEMA_VERSION only when a field
changes meaning; adding fields keeps the version)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Category = Literal["collateral_termination", "same_deployment_collateral"]
Verdict = Literal[
    "collateral_termination",
    "same_deployment_collateral",
    "no_healthy_victim",
    "no_incident",
    "inconclusive",
]
Confidence = Literal["confirmed", "suspected"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputRecord(_Record):
    path: str
    kind: str
    sha256: str | None
    size: int | None = None
    mtime: datetime | None = None
    records: int
    unparsed: int
    server_version: str | None = None
    notes: list[str] = Field(default_factory=list)


class LimitationRecord(_Record):
    code: str
    message: str
    source: str


class EvidenceItem(_Record):
    time: datetime | None
    source: str  # provenance: table:primary key or file:line (several joined by "; ")
    text: str


class Victim(_Record):
    job_id: str
    job_name: str
    replica_num: int | None
    deployment_num: int | None
    submission_num: int | None = None
    healthy_since: datetime | None
    terminated_at: datetime | None
    health_proof: str


class Culprit(_Record):
    job_id: str
    job_name: str
    replica_num: int | None
    deployment_num: int | None
    submission_num: int | None = None
    termination_reason: str | None
    termination_reason_message: str | None
    exit_status: int | None = None
    failed_at: datetime | None


class OtherJob(_Record):
    """A job the cascade also stopped that is not a victim (with the reason why not)."""

    job_id: str
    job_name: str
    deployment_num: int | None
    status: str | None
    why_not_victim: str


class Finding(_Record):
    category: Category
    confidence: Confidence
    server: str
    run_id: str
    run_name: str
    project: str | None
    victims: list[Victim]
    culprits: list[Culprit]
    run_termination_reason: str | None
    update_deployment_num: int | None = None
    changed_fields: str | None = None
    updated_by: str | None = None
    also_stopped: list[OtherJob] = Field(default_factory=list)
    evidence: list[EvidenceItem]
    notes: list[str] = Field(default_factory=list)


class RunVerdict(_Record):
    server: str
    run_id: str
    run_name: str
    project: str | None
    run_type: str | None
    status: str | None
    termination_reason: str | None
    deployment_num: int | None
    verdict: Verdict
    why: str


class Summary(_Record):
    runs: int
    findings: int
    victims: int
    by_verdict: dict[str, int]


class Report(_Record):
    schema_version: int = SCHEMA_VERSION
    generated_by: str
    inputs: list[InputRecord]
    limitations: list[LimitationRecord]
    summary: Summary
    runs: list[RunVerdict]
    findings: list[Finding]
