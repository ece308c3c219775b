"""The dstack API's Run and Event objects as pydantic models: only the fields the audit reads,
anything else ignored, so exports of every dstack version validate (reference section 8.3).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, TypeAdapter


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ProbeSpecModel(_Model):
    ready_after: int | None = None


class JobSpecModel(_Model):
    job_name: str
    replica_num: int = 0
    job_num: int = 0
    replica_group: str | None = None
    probes: list[ProbeSpecModel] | None = None


class ProbeModel(_Model):
    success_streak: int | None = None


class SubmissionModel(_Model):
    id: UUID
    submission_num: int = 0
    deployment_num: int = 0  # 0 from servers older than 0.19.14 (reference 10)
    submitted_at: datetime
    last_processed_at: datetime | None = None
    finished_at: datetime | None = None
    status: str
    termination_reason: str | None = None
    termination_reason_message: str | None = None
    exit_status: int | None = None
    job_provisioning_data: dict[str, Any] | None = None
    job_runtime_data: dict[str, Any] | None = None
    probes: list[ProbeModel] | None = None  # absent before 0.19.22


class JobModel(_Model):
    job_spec: JobSpecModel
    job_submissions: list[SubmissionModel] = []


class RunSpecModel(_Model):
    run_name: str | None = None
    configuration: dict[str, Any] | None = None


class RunModel(_Model):
    id: UUID
    project_name: str | None = None
    user: str | None = None
    submitted_at: datetime
    last_processed_at: datetime | None = None
    status: str
    termination_reason: str | None = None
    run_spec: RunSpecModel
    fleet: dict[str, Any] | None = None  # {id, name} once the run is placed (0.20+)
    jobs: list[JobModel] = []
    deployment_num: int = 0
    deleted: bool | None = None
    service: dict[str, Any] | None = None


class PsModel(_Model):
    project: str | None = None
    runs: list[RunModel]


class TargetModel(_Model):
    type: str
    project_name: str | None = None
    id: UUID | None = None
    name: str | None = None


class EventModel(_Model):
    id: UUID
    message: str
    recorded_at: datetime
    actor_user_id: UUID | None = None
    actor_user: str | None = None
    targets: list[TargetModel]


class InstanceTypeModel(_Model):
    name: str | None = None
    resources: dict[str, Any] | None = None


class InstanceModel(_Model):
    """`core/models/instances.py::Instance` as `services/instances.py::instance_model_to_instance`
    fills it: no start, deletion or processing time, and no provider instance id."""

    id: UUID
    project_name: str | None = None
    backend: str | None = None
    instance_type: InstanceTypeModel | None = None
    name: str
    fleet_id: UUID | None = None
    fleet_name: str | None = None
    hostname: str | None = None
    status: str
    termination_reason: str | None = None
    created: datetime
    finished_at: datetime | None = None
    region: str | None = None
    price: float | None = None
    total_blocks: int | None = None
    busy_blocks: int = 0


class FleetModel(_Model):
    """`core/models/fleets.py::Fleet` (`services/fleets.py::fleet_model_to_fleet`: the spec
    without SSH keys, only the instances not deleted)."""

    id: UUID
    name: str
    project_name: str | None = None
    spec: dict[str, Any]
    created_at: datetime
    status: str
    instances: list[InstanceModel] = []


class ServerInfoModel(_Model):
    server_version: str | None = None


RUNS_LIST = TypeAdapter(list[RunModel])


EVENTS_LIST = TypeAdapter(list[EventModel])


FLEETS_LIST = TypeAdapter(list[FleetModel])


INSTANCES_LIST = TypeAdapter(list[InstanceModel])
