"""dstack's fleets and instances lists (`POST /api/fleets/list`, `/api/instances/list`) -> the
canonical fleets and instances frames the database sources give (`dstack_tables._fleets`), and
each job's instance.

What the API leaves out, and where it comes from instead:
- an instance's `started_at` (set with the status leaving PENDING: `jobs_submitted.py::
  _promote_placeholder_instance`, `instances/cloud_provisioning.py`, `instances/ssh_deploy.py`)
  is the time of the instance's first event out of PENDING ("Instance provisioned for job.
  Instance status: PROVISIONING", "Instance status changed PENDING -> ..."); without such an
  event, its creation time, a lower bound (a limitation says so);
- its end is `finished_at` (set with TERMINATED, `instances/termination.py`), else the event
  "-> TERMINATED";
- a fleet's `deleted_at` (set with TERMINATED, `pipeline_tasks/fleets.py::_process_fleet`) is
  the event "Fleet status changed ... -> TERMINATED";
- a job's instance (`jobs.used_instance_id`): the API gives the job's `job_provisioning_data`,
  which is its instance's (`jobs_submitted.py` copies the instance's), but neither that
  document's provider `instance_id` nor any job id is in an Instance; its `hostname`, backend,
  region and instance type are, so a job is tied to the one instance with those whose life
  (created .. finished) overlaps the job's; none or several: no instance (a limitation).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import polars as pl

from analyzer.model import FLEETS_SCHEMA, INSTANCES_SCHEMA
from analyzer.redact import Redactor, json_secret_values
from analyzer.sources.api.models import InstanceModel
from analyzer.sources.api.recognise import INSTANCES_PAGE
from analyzer.sources.api.rows import ExportFile, _enum, _utc, rows_frame
from analyzer.sources.base import Limitation

_NEW_STATUS = re.compile(r"(?:-> |Instance status: )([A-Z_]+)")
LINK_KEYS = ("_host", "_backend", "_region", "_type")


def _status_times(files: list[ExportFile]) -> tuple[dict, dict, dict]:
    """From the instance and fleet events: (instance id -> first time out of PENDING,
    instance id -> first time TERMINATED, fleet id -> first time TERMINATED)."""
    started: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    deleted: dict[str, datetime] = {}

    def first(times: dict[str, datetime], key: str, when: datetime) -> None:
        if key not in times or when < times[key]:
            times[key] = when

    for found in files:
        for event, _raw, _pointer in found.events:
            match = _NEW_STATUS.search(event.message)
            if match is None:
                continue
            status, when = match.group(1), _utc(event.recorded_at)
            for target in event.targets:
                if target.id is None:
                    continue
                key, kind = str(target.id), _enum(target.type)
                if kind == "instance" and event.message.startswith("Instance "):
                    if status != "PENDING":
                        first(started, key, when)
                    if status == "TERMINATED":
                        first(ended, key, when)
                fleet_end = event.message.startswith("Fleet status changed")
                if kind == "fleet" and fleet_end and status == "TERMINATED":
                    first(deleted, key, when)
    return started, ended, deleted


def _nodes(configuration: dict) -> tuple[int | None, int | None]:
    nodes = configuration.get("nodes")
    if isinstance(nodes, int):
        return nodes, nodes
    if isinstance(nodes, dict):
        low, high = nodes.get("min"), nodes.get("max")
        return (low if isinstance(low, int) else None), (high if isinstance(high, int) else None)
    return None, None


def _instance_row(
    instance: InstanceModel, server: str, provenance: str, started: dict, ended: dict
) -> dict[str, Any]:
    key = str(instance.id)
    resources = (instance.instance_type.resources if instance.instance_type else None) or {}
    gpus = [g for g in resources.get("gpus") or [] if isinstance(g, dict)]
    created = _utc(instance.created)
    status = _enum(instance.status)
    start = started.get(key)
    if start is None and status != "pending" and instance.instance_type is not None:
        start = created  # started, when unknown: its creation is a lower bound
    return {
        "server": server,
        "instance_id": key,
        "instance_name": instance.name,
        "fleet_id": str(instance.fleet_id) if instance.fleet_id else None,
        "project": instance.project_name,
        "status": status,
        "backend": _enum(instance.backend),
        "created_at": created,
        "started_at": start,
        "ended_at": _utc(instance.finished_at) or ended.get(key),
        "termination_reason": _enum(instance.termination_reason),
        "total_blocks": instance.total_blocks or 1,
        "cpus": resources.get("cpus"),
        "memory_mib": resources.get("memory_mib"),
        "gpus": len(gpus) if instance.instance_type is not None else None,
        "gpu_name": gpus[0].get("name") if gpus else None,
        "gpu_memory_mib": gpus[0].get("memory_mib") if gpus else None,
        "disk_mib": (resources.get("disk") or {}).get("size_mib"),
        "price": instance.price,
        "provenance": provenance,
        "_started_by_event": key in started,
        "_host": instance.hostname,
        "_region": instance.region,
        "_type": instance.instance_type.name if instance.instance_type else None,
    }


def fleet_frames(
    files: list[ExportFile], server: str, label: str
) -> tuple[pl.DataFrame, pl.DataFrame, list[Limitation]]:
    """The fleets and instances of every fleets and instances page of the set (an instance
    listed in both: the instances list's copy, which also holds deleted instances)."""
    started, ended, deleted = _status_times(files)
    fleets: dict[str, dict] = {}
    instances: dict[str, dict] = {}
    embedded: dict[str, dict] = {}
    for found in files:
        for fleet, _raw, pointer in found.fleets:
            key = str(fleet.id)
            configuration = fleet.spec.get("configuration") or {}
            low, high = _nodes(configuration)
            status = _enum(fleet.status)
            placement = configuration.get("placement")
            fleets[key] = {
                "server": server,
                "fleet_id": key,
                "project": fleet.project_name,
                "fleet_name": fleet.name,
                "status": status,
                "created_at": _utc(fleet.created_at),
                "deleted_at": deleted.get(key),
                "nodes_min": low,
                "nodes_max": high,
                "ssh": configuration.get("ssh_config") is not None,
                "placement": placement if isinstance(placement, str) else None,
                "provenance": f"{found.info.path}#{pointer}",
                "_undated_deletion": status == "terminated" and key not in deleted,
            }
            for i, instance in enumerate(fleet.instances):
                place = f"{found.info.path}#{pointer}/instances/{i}"
                embedded[str(instance.id)] = _instance_row(instance, server, place, started, ended)
        for instance, _raw, pointer in found.instances:
            place = f"{found.info.path}#{pointer}"
            instances[str(instance.id)] = _instance_row(instance, server, place, started, ended)
    # in the order the tables hold them (rows inserted as created), not the pages' order
    rows = sorted(
        (embedded | instances).values(), key=lambda r: (r["created_at"], r["instance_id"])
    )
    fleet_rows = sorted(fleets.values(), key=lambda r: (r["created_at"], r["fleet_id"]))
    limitations = []
    undated = [r["instance_name"] for r in rows if r["started_at"] and not r["_started_by_event"]]
    if undated:
        limitations.append(
            Limitation(
                "api_instance_start_undated",
                f"{len(undated)} instance(s) (e.g. {undated[0]}) have no event dating when they "
                "left PENDING (the API has no started_at; events older than the server's events "
                "TTL are gone): their creation time stands for it, so before T they may have "
                "been still provisioning",
                label,
            )
        )
    gone = [f["fleet_name"] for f in fleet_rows if f["_undated_deletion"]]
    if gone:
        limitations.append(
            Limitation(
                "api_fleet_deletion_undated",
                f"{len(gone)} deleted fleet(s) (e.g. {gone[0]}) have no event dating their "
                "deletion (the API has no deleted_at): they count as existing at every T",
                label,
            )
        )
    if fleets and not any(f.shape == INSTANCES_PAGE for f in files):
        limitations.append(
            Limitation(
                "api_instances_list_missing",
                "no instances list page (`/api/instances/list`): only the fleets' instances "
                "not deleted are known, so an instance alive before T and deleted since is not",
                label,
            )
        )
    links = {**INSTANCES_SCHEMA, **dict.fromkeys(LINK_KEYS, pl.String())}
    instance_frame = rows_frame([r | {"_backend": r["backend"]} for r in rows], links)
    return (
        rows_frame(fleet_rows, FLEETS_SCHEMA),
        instance_frame,
        limitations,
    )


def link_instances(jobs: list[dict], instances: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """(job_id, instance_id, instance_name, fleet_id) of every provisioned job tied to exactly
    one instance (see the module's docstring; `instances` as `fleet_frames` gives them), and
    how many provisioned jobs were tied to none or to several."""
    link_schema = {
        "job_id": pl.String(),
        "submitted_at": pl.Datetime("us", "UTC"),
        "last_processed_at": pl.Datetime("us", "UTC"),
        **dict.fromkeys(LINK_KEYS, pl.String()),
    }
    provisioned = rows_frame([j for j in jobs if j.get("has_provisioning_data")], link_schema)
    candidates = (
        provisioned.drop_nulls("_host")
        .join(
            instances.select(
                "instance_id", "instance_name", "fleet_id", "created_at", "ended_at", *LINK_KEYS
            ),
            on=list(LINK_KEYS),
            nulls_equal=True,
        )
        .filter(
            (pl.col("created_at") <= pl.col("last_processed_at"))
            & (pl.col("ended_at").is_null() | (pl.col("ended_at") >= pl.col("submitted_at")))
        )
        .group_by("job_id")
        .agg("instance_id", "instance_name", "fleet_id")
    )
    tied = candidates.filter(pl.col("instance_id").list.len() == 1).select(
        "job_id", *(pl.col(c).list.first() for c in ("instance_id", "instance_name", "fleet_id"))
    )
    return tied, provisioned.height - tied.height


# Private keys an SSH fleet's spec may still hold after `_remove_fleet_spec_sensitive_info`
# (which clears `ssh_config.ssh_key` and the hosts' keys only).
FLEET_SECRET_PATHS = (
    "$.configuration.ssh_config.ssh_key.private",
    "$.configuration.ssh_config.proxy_jump.ssh_key.private",
)


def fleet_secret_values(files: list[ExportFile]) -> set[str]:
    """Secret values inside fleet specs (env values, private keys), only so that no output
    can show them."""
    specs = [json.dumps(raw.get("spec")) for found in files for _m, raw, _p in found.fleets]
    redactor = Redactor()
    if specs:
        spec = pl.col("spec")
        frame = pl.DataFrame({"spec": specs}, schema={"spec": pl.String})
        redactor.add_frame_values(
            frame.select(
                *json_secret_values(spec),
                *(
                    spec.str.json_path_match(p).alias(f"k{i}")
                    for i, p in enumerate(FLEET_SECRET_PATHS)
                ),
            )
        )
    return redactor.values
