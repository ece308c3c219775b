"""The JSON report: a stable, versioned contract (bump SCHEMA_VERSION only when a field
changes meaning; adding fields keeps the version).

Version 2: the category `newer_deployment_collateral`; victims not yet stopped (a copy taken
mid-cascade); per-finding limitations; `summary.outage_seconds` counts each run's outage once
and is null when no outage is known.

Version 3: every figure is known, a lower bound or unknown. A total is the sum of its known
parts (null when no part is known, never 0.0 for unknown), with `*_is_lower_bound` when a part
ran to the end of the evidence or was measured from a time rounded to its precision, and the
count of its unknown parts; an impact says why its outage is a lower bound
(`lower_bound_reasons`). `incidents` counts runs (a run with findings of two categories is one
incident). A counterfactual says whether its model applies to the run's sequence.

Version 4: each judged job names the rule that judged it (`rule`, on every victim and every
other job the cascade stopped): the ids of `analyzer.pipeline.rules.RULES`, listed below, so
a reader can count and filter findings by rule."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from analyzer.vocabulary import Category, Confidence, Verdict

SCHEMA_VERSION = 4


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
    rule: str  # the rule that made it a victim: its category (docs/json-contract.md, the rules)
    replica_num: int | None
    deployment_num: int | None
    submission_num: int | None = None
    healthy_since: datetime | None
    terminated_at: datetime | None
    health_proof: str
    # False when the evidence ends before the cascade reached it (a copy taken mid-cascade):
    # dstack's terminating-run pass will stop it with `expected_termination_reason`.
    stopped: bool = True
    expected_termination_reason: str | None = None


class EarlierFailure(_Record):
    """An earlier submission of a culprit's replica slot, in the same deployment, that failed
    by itself and that dstack re-submitted (the job's `retry` policy)."""

    job_id: str
    submission_num: int | None
    termination_reason: str | None
    termination_reason_message: str | None
    exit_status: int | None = None
    failed_at: datetime | None


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
    # the slot's earlier failed submissions in this deployment, first first: the first of them
    # is the root cause, this (the last) submission's failure the trigger
    earlier_failures: list[EarlierFailure] = Field(default_factory=list)


class OtherJob(_Record):
    """A job the cascade also stopped that is not a victim (with the reason why not)."""

    job_id: str
    job_name: str
    rule: str  # the first rule that matched it (docs/json-contract.md, the rules)
    deployment_num: int | None
    status: str | None
    why_not_victim: str


class VictimImpact(_Record):
    job_id: str
    price_per_hour: float | None  # $/h of the victim's instance; None when unknown
    lost_seconds: float | None
    lost_cost: float | None  # None when the price (or the window) is unknown
    # The window ran to the end of the evidence, or began at a stop rounded up to its precision.
    lost_is_lower_bound: bool = False


class Impact(_Record):
    """What the kill cost: measured from the evidence, never guessed."""

    outage_start: datetime | None  # the last healthy replica of the run stopped
    recovered_at: datetime | None  # a replica of the same service served again
    recovered_by_run_id: str | None = None
    recovered: bool
    outage_seconds: float | None  # the run's outage: until recovery, or the end of the evidence
    # Not recovered (the server may have stayed down longer), or measured from a stop time the
    # evidence gives in whole seconds or milliseconds (rounded up): `lower_bound_reasons` says.
    outage_is_lower_bound: bool = False
    lower_bound_reasons: list[str] = Field(default_factory=list)
    replicas_lost: int
    healthy_replica_seconds_lost: float | None  # sum of the known victims' losses; None: none
    healthy_replica_seconds_lost_is_lower_bound: bool = False
    replica_time_unknown_victims: int = 0  # victims whose loss is unknown (not in the sum)
    lost_cost: float | None  # sum of the known victims' costs; None when no cost is known
    lost_cost_is_lower_bound: bool = False
    cost_known_for: int  # victims whose cost is known (the others are not in the sum)
    per_victim: list[VictimImpact]
    end_of_evidence: datetime | None


class Counterfactual(_Record):
    """What a well-behaved rollout would have done with the same timeline. `applies` is false
    when the model's rollout mechanism has nothing to act on (no update: no rollout to stall or
    roll back); the platform's behaviour is then still told, and what it would have kept."""

    model: str
    parameters: dict[str, float | int | str]
    applies: bool = True
    declared_failed_at: datetime | None
    rolled_back: bool
    old_replicas_kept: int  # the victims the platform would have left serving
    serving_seconds_kept: float | None  # healthy replica-seconds the model would have kept
    serving_seconds_kept_is_lower_bound: bool = False
    explanation: str


FailureClass = Literal[
    "no_capacity",
    "fleet_at_capacity",
    "container_exit",
    "retry_limit",
    "probe_never_ready",
    "other",
]


class RootCause(_Record):
    failure_class: FailureClass
    detail: str
    changed_fields: str | None
    fleets: list[str]
    # the last failure, when the root cause is an earlier submission's (a re-submitted culprit)
    trigger_class: FailureClass | None = None
    trigger: str | None = None


class CapacityForesight(_Record):
    """For a culprit that failed for lack of capacity: the surge capacity of its fleet(s) as of
    just before the update (`dstack-audit exposure --as-of` that moment), rebuilt from the
    tables. `foreseeable` is true when it was `none`, false when `available`, null when unknown;
    `as_of` is null when the evidence has no date for the update (a rich log alone)."""

    as_of: datetime | None
    surge_capacity: Literal["none", "available", "unknown"]
    foreseeable: bool | None
    reasons: list[str]


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
    # the reason the run went TERMINATING with (its first transition): differs from
    # run_termination_reason when a user stopped the run during the cascade
    run_failure_reason: str | None = None
    update_deployment_num: int | None = None
    changed_fields: str | None = None
    updated_by: str | None = None
    also_stopped: list[OtherJob] = Field(default_factory=list)
    evidence: list[EvidenceItem]
    notes: list[str] = Field(default_factory=list)
    limitations: list[LimitationRecord] = Field(default_factory=list)
    impact: Impact | None = None
    counterfactuals: list[Counterfactual] = Field(default_factory=list)
    root_cause: RootCause | None = None
    capacity_foresight: CapacityForesight | None = None


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
    in_progress: bool = False  # still active at the end of the evidence: not finished
    gaps: list[str] = Field(default_factory=list)  # what the evidence is missing for this run


class Totals(_Record):
    """Figures summed over findings: each the sum of its known parts (null when no part is
    known), a lower bound when a part is, with the count of its unknown parts."""

    incidents: int = 0  # runs with findings: a run with findings of two categories is one
    findings: int
    victims: int
    outage_seconds: float | None = 0.0  # each run's outage once
    outage_is_lower_bound: bool = False
    outage_unknown_runs: int = 0  # runs with findings whose outage is unknown (not in the sum)
    healthy_replica_seconds_lost: float | None = 0.0
    healthy_replica_seconds_lost_is_lower_bound: bool = False
    replica_time_unknown_victims: int = 0
    lost_cost: float | None = 0.0
    lost_cost_is_lower_bound: bool = False
    cost_unknown_victims: int = 0


class GroupSummary(Totals):
    """Findings of one project, fleet, user or day."""

    key: str


class Summary(Totals):
    runs: int
    by_verdict: dict[str, int]
    runs_in_progress: int = 0
    by_server: list[GroupSummary] = Field(default_factory=list)
    by_project: list[GroupSummary] = Field(default_factory=list)
    by_fleet: list[GroupSummary] = Field(default_factory=list)
    by_user: list[GroupSummary] = Field(default_factory=list)
    by_day: list[GroupSummary] = Field(default_factory=list)
    by_failure_class: list[GroupSummary] = Field(default_factory=list)


class ModelDescription(_Record):
    name: str
    parameters: dict[str, float | int | str]
    description: str


class Report(_Record):
    schema_version: int = SCHEMA_VERSION
    generated_by: str
    redaction_rules: str = ""  # the secret rule set every text was masked with (redact.py)
    inputs: list[InputRecord]
    limitations: list[LimitationRecord]
    summary: Summary
    end_of_evidence: datetime | None = None
    counterfactual_models: list[ModelDescription] = Field(default_factory=list)
    runs: list[RunVerdict]
    findings: list[Finding]
