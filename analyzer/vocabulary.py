"""The tool's vocabulary, declared once: every string value a canonical frame column, a rule or
the JSON contract compares against. Each is a `Literal` type (what type checkers and the JSON
contract read) and the tuple of its values (what `model.conform` and the tests check).

A value outside its vocabulary is a typo: `model.conform` fails on it, and
tests/test_vocabulary.py scans the code for comparisons with values no vocabulary declares.
"""

from __future__ import annotations

from typing import Literal, get_args

# events.kind: what a row says (the message catalogue maps dstack's texts to these).
EventKind = Literal[
    "run_submitted",
    "run_status",
    "run_updated",
    "run_scaling",
    "job_created",
    "job_status",
    "job_updated",
    "job_ready",
    "job_registered",
    "job_unregistered",
    "graceful_stop",
    "job_exit_status",
    "job_provisioned",
    "probe_passed",  # a DEBUG probe line: the replica answered 2xx (scheduled_tasks/probes.py)
    "probe_failed",  # a DEBUG probe line: a non-2xx answer or no answer at all
    "other",  # a run/job message understood to carry nothing the timeline needs
    "unrecognised",  # matches no template: counted, never silently dropped
]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)

# events.time_basis: how `time` was obtained.
TimeBasis = Literal[
    "db_utc",  # a database timestamp, UTC by dstack's contract
    "log_wrapper_utc",  # docker/kubectl/journald time in front of the line
    "log_local_offset_inferred",  # local log time shifted by an offset aligned with the DB
    "log_local_offset_given",  # local log time shifted by --log-tz
    "log_local_assumed_utc",  # local log time, zone unknown, taken as UTC (said in limitations)
    "log_local_unaligned",  # local log time before reconcile aligns it (never in a report)
    "time_of_day_only",  # rich log without a date
]
TIME_BASES: tuple[str, ...] = get_args(TimeBasis)

# events.origin: a status line is no event.
EventOrigin = Literal["events_table", "event_line", "status_line"]
EVENT_ORIGINS: tuple[str, ...] = get_args(EventOrigin)

EntityType = Literal["run", "job"]
ENTITY_TYPES: tuple[str, ...] = get_args(EntityType)

# jobs.deployment_basis: where a job's deployment number comes from.
DeploymentBasis = Literal["table", "events", "scaling_lines", "ambiguous_update"]
DEPLOYMENT_BASES: tuple[str, ...] = get_args(DeploymentBasis)

# The health ladder's proofs (pipeline/timeline.py words each one).
HealthyProof = Literal[
    "ready_flag",
    "ready_flag_and_probes",
    "ready_event",
    "ready_event_and_probes",
    "registered_event",
    "registered_event_and_probes",
    "probe_streaks",
    "probe_lines",
    "running_no_probes",
    "still_running_no_probes",
]
UnhealthyProof = Literal[
    "probe_failing", "probe_failed_logged", "never_running", "not_ready", "probes_never_ran"
]
UndecidedProof = Literal["ready_flag_contradicts_running"]
HealthProof = Literal[HealthyProof, UnhealthyProof, UndecidedProof]
HEALTHY_PROOFS: tuple[str, ...] = get_args(HealthyProof)
UNHEALTHY_PROOFS: tuple[str, ...] = get_args(UnhealthyProof)
HEALTH_PROOFS: tuple[str, ...] = get_args(HealthProof)
Health = Literal["healthy", "not_healthy", "unknown"]
HEALTH_STATES: tuple[str, ...] = get_args(Health)

# Verdicts (the JSON contract): a run's verdict is its first category with victims.
Category = Literal[
    "collateral_termination", "same_deployment_collateral", "newer_deployment_collateral"
]
Verdict = Literal[Category, "no_healthy_victim", "no_incident", "inconclusive"]
Confidence = Literal["confirmed", "suspected"]
CATEGORIES: tuple[str, ...] = get_args(Category)
VERDICTS: tuple[str, ...] = get_args(Verdict)
CONFIDENCES: tuple[str, ...] = get_args(Confidence)

# Limitation codes: what the evidence cannot show, per input or per finding.
LimitationCode = Literal[
    "api_deployment_is_current",
    "api_fields_not_exposed",
    "api_fleet_deletion_undated",
    "api_instance_start_undated",
    "api_instances_list_missing",
    "api_job_instance_unknown",
    "api_live_snapshot",
    "api_runs_without_events",
    "cli_event_latest_100",
    "cli_event_names_unresolved",
    "cli_event_time_aligned",
    "cli_event_time_zone_unknown",
    "collection_altered",
    "conflicting_duplicate_rows",
    "copy_taken_mid_cascade",
    "damaged_values",
    "deployment_not_provable_from_logs",
    "end_of_evidence_lower_bound",
    "fleet_spec_as_last_recorded",
    "health_not_provable_from_logs",
    "huge_values",
    "input_changed_while_read",
    "log_capacity_hint",
    "log_clock_went_back",
    "log_events_missing_from_database",
    "log_events_past_events_ttl",
    "log_from_different_server_state",
    "log_matches_no_database",
    "log_run_attribution_ambiguous",
    "log_time_aligned",
    "log_time_of_day_only",
    "log_time_zone_unknown",
    "log_unreachable_hint",
    "log_without_run_evidence",
    "missing_columns",
    "no_events_table",
    "no_fleet_tables",
    "no_probes_table",
    "no_run_evidence",
    "ps_json_latest_submission_only",
    "run_stopped_during_cascade",
    "runs_list_submissions_capped",
    "unknown_schema_release",
    "unreadable_export",
]
LIMITATION_CODES: tuple[str, ...] = get_args(LimitationCode)
