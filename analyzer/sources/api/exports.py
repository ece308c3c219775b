"""Loading a set of API and CLI export files (see analyzer.sources.api) into one SourceData:
the same run, job or event seen in several files becomes one row."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

import analyzer.catalogue as catalogue
from analyzer.errors import AuditInputError
from analyzer.model import EVENTS_SCHEMA, INSTANCES_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA, conform
from analyzer.sources.api.event_text import text_event_rows
from analyzer.sources.api.fleets import fleet_frames, fleet_secret_values, link_instances
from analyzer.sources.api.recognise import (
    EMPTY_LIST,
    EVENT_TEXT,
    FLEETS_PAGE,
    KIND,
    PS_JSON,
    RUNS_PAGE,
    classify,
)
from analyzer.sources.api.rows import (
    RUNS_LIST_SUBMISSIONS_LIMIT,
    ExportFile,
    Kept,
    job_rows,
    json_event_rows,
    keep_best,
    rank_of,
    read_export,
    rows_frame,
    run_row,
    secret_values,
    spec_fingerprints,
)
from analyzer.sources.attach import attach_job_runs
from analyzer.sources.base import Limitation, SourceData, file_facts


def load_set(paths: list[Path], server: str, label: str, *, tolerant: bool) -> SourceData:
    data = SourceData()
    files: list[ExportFile] = []
    for path in paths:
        shape = classify(path)
        if shape is None or shape == EMPTY_LIST:
            info = file_facts(path, "unrecognised" if shape is None else f"{KIND} ({shape})")
            info.notes.append(
                "an empty JSON list (an empty runs or events page): nothing to audit"
                if shape == EMPTY_LIST
                else "not a dstack runs/events export, database, table export or server log "
                "(e.g. the exporter's manifest or the projects list); not audited"
            )
            data.inputs.append(info)
            continue
        try:
            found = read_export(path)
        except AuditInputError as error:
            if not tolerant:
                raise
            info = file_facts(path, f"{KIND} (unreadable)")
            info.notes.append(f"{error.problem}; not audited")
            data.inputs.append(info)
            data.limitations.append(
                Limitation(
                    "unreadable_export",
                    f"{error.problem}: the audit went on without this file; runs or events "
                    "only it held are missing (re-export it)",
                    str(path),
                )
            )
            continue
        files.append(found)
        data.inputs.append(found.info)

    runs: dict[str, Kept] = {}
    jobs: dict[str, Kept] = {}
    raws: list[dict] = []
    for found in files:
        version = found.server_version
        if version:
            data.server_version = version
        for run, raw, pointer in found.runs:
            raws.append(raw)
            row = run_row(run, raw, server, f"{found.info.path}#{pointer}")
            keep_best(runs, row["run_id"], row, rank_of(row, found.shape), found.shape)
            for job_row, spec in job_rows(run, raw, server, found.info.path, pointer):
                rank = rank_of(job_row, found.shape)
                keep_best(jobs, job_row["job_id"], job_row, rank, found.shape, spec)
    data.secrets = secret_values(raws)

    job_list = [
        k.row | {"provenance": "; ".join(dict.fromkeys(k.provenance))} for k in jobs.values()
    ]
    for row, fingerprint in zip(
        job_list, spec_fingerprints([k.spec for k in jobs.values()]), strict=True
    ):
        row["spec_fingerprint"] = fingerprint
    run_list = [
        k.row | {"provenance": "; ".join(dict.fromkeys(k.provenance))} for k in runs.values()
    ]
    data.runs = rows_frame(run_list, RUNS_SCHEMA)
    data.jobs = rows_frame(job_list, JOBS_SCHEMA)
    if any(f.shape == FLEETS_PAGE for f in files):
        _with_fleets(data, files, job_list, server, label)

    job_runs = {row["job_id"]: row["run_id"] for row in job_list}
    json_rows = json_event_rows(files, server, job_runs)
    text_files = [f for f in files if f.shape == EVENT_TEXT]
    text_rows = text_event_rows(text_files, server, run_list, job_list, json_rows, data, label)
    data.events = _events_frame(json_rows + text_rows, run_list)
    _limitations(data, files, runs, jobs, json_rows, text_files, label)
    return data


EVENT_ROW_SCHEMA = {
    name: EVENTS_SCHEMA[name]
    for name in (
        "server",
        "source",
        "seq",
        "time",
        "time_text",
        "time_basis",
        "origin",
        "entity_type",
        "entity_id",
        "entity_name",
        "run_id",
        "actor",
        "message",
        "provenance",
    )
}


def _with_fleets(
    data: SourceData, files: list[ExportFile], jobs: list[dict], server: str, label: str
) -> None:
    """The set's fleets and instances, and each job's instance (see api.fleets)."""
    data.fleets, instances, limitations = fleet_frames(files, server, label)
    data.instances = instances.select(list(INSTANCES_SCHEMA))
    data.has_fleet_tables = True
    data.limitations.extend(limitations)
    data.secrets |= fleet_secret_values(files)
    tied, untied = link_instances(jobs, instances)
    names = data.fleets.select("fleet_id", pl.col("fleet_name").alias("_fleet_name"))
    data.jobs = (
        data.jobs.drop("instance_id", "instance_name", "fleet_id", "fleet_name")
        .join(tied, on="job_id", how="left", maintain_order="left")
        .join(names, on="fleet_id", how="left", maintain_order="left")
        .rename({"_fleet_name": "fleet_name"})
        .select(list(JOBS_SCHEMA))
    )
    if untied:
        data.limitations.append(
            Limitation(
                "api_job_instance_unknown",
                f"{untied} provisioned job submission(s) could not be tied to one instance (the "
                "API has no jobs.used_instance_id; a job's hostname, backend, region and "
                "instance type matched no instance alive then, or several): the blocks they "
                "held are not counted on any instance",
                label,
            )
        )


def _events_frame(rows: list[dict[str, Any]], runs: list[dict]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame(schema=EVENTS_SCHEMA)
    for seq, row in enumerate(rows):
        row["seq"] = seq
    frame = rows_frame(rows, EVENT_ROW_SCHEMA)
    parsed = catalogue.parse_event_messages(frame.lazy()).collect()
    # job ids were resolved to runs as the rows were built (the text lines need them)
    attached = attach_job_runs(parsed, runs=rows_frame(runs, RUNS_SCHEMA))
    return conform(attached, EVENTS_SCHEMA).collect().sort(["time", "seq"])


def _limitations(
    data: SourceData,
    files: list[ExportFile],
    runs: dict[str, Kept],
    jobs: dict[str, Kept],
    json_rows: list[dict],
    text_files: list[ExportFile],
    label: str,
) -> None:
    run_files = [f for f in files if f.runs]
    if run_files:
        data.limitations.append(
            Limitation(
                "api_fields_not_exposed",
                "the runs API (and `dstack ps --json`, `dstack run get --json`) does not expose "
                "the job fields ready, registered, graceful_termination_attempts, remove_at, "
                "running_at, nor the job's instance id (with the fleets and instances lists, a "
                "job is tied to its instance by its provisioning data): a replica's health is "
                "proven instead "
                "from its probe streaks (probes[].success_streak against the spec's ready_after, "
                "default 1) or from the event 'Service replica ready to receive requests'; "
                "without probes and without events a healthy replica cannot be told from one "
                "that never served",
                label,
            )
        )
        data.limitations.append(
            Limitation(
                "api_deployment_is_current",
                "a job submission's deployment_num in the API is its current one: in-place "
                "bumps (e.g. an update of replicas only) are visible only through it, and the "
                "deployment a replica was created in comes only from the events ('Run updated. "
                "Deployment: N' before its 'Job created' event); only the latest submission's "
                "job_spec is exported per job, so earlier deployments' specs cannot be compared",
                label,
            )
        )
    if run_files and not json_rows and not text_files:
        data.limitations.append(
            Limitation(
                "api_runs_without_events",
                "the order culprit failure -> run TERMINATING -> victim stopped is recorded only "
                "in the events (events API, or `dstack event --since ...`) and this export holds "
                "none: unless events of the same runs are audited with it, victims are judged "
                "from final states, probe streaks and last_processed_at only",
                label,
            )
        )
    ps_only = [k for k in runs.values() if k.shapes == {PS_JSON}]
    if ps_only:
        ids = {k.row["run_id"] for k in ps_only}
        hidden = sum(
            1
            for k in jobs.values()
            if k.row["run_id"] in ids and (k.row["submission_num"] or 0) > 0
        )
        data.limitations.append(
            Limitation(
                "ps_json_latest_submission_only",
                "`dstack ps --json` lists only the latest submission of each job: older "
                "submissions of a re-used replica slot (replicas of earlier deployments, retried "
                "or re-run submissions) are missing, so a victim or culprit among them cannot be "
                f"seen ({len(ps_only)} run(s) known only from it"
                + (
                    f"; {hidden} job(s) there have earlier submissions not exported"
                    if hidden
                    else ""
                )
                + "); export `dstack run get --json` or the runs API for every submission",
                label,
            )
        )
    slots: Counter = Counter(
        (k.row["run_id"], k.row["replica_num"], k.row["job_num"]) for k in jobs.values()
    )
    capped = {
        run_id
        for (run_id, _, _), count in slots.items()
        if count >= RUNS_LIST_SUBMISSIONS_LIMIT
        and run_id in runs
        and runs[run_id].shapes == {RUNS_PAGE}
    }
    if capped:
        data.limitations.append(
            Limitation(
                "runs_list_submissions_capped",
                f"{len(capped)} run(s) known only from the runs list have a job with "
                f"{RUNS_LIST_SUBMISSIONS_LIMIT} submissions there; the list returns at most the "
                "latest 10 per job, so earlier ones may be missing (the runs get call returns all)",
                label,
            )
        )
