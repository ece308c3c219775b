"""What dstack does, said once: its statuses and reasons, which fields of a run spec roll a
service out and which are applied in place, the fingerprint of a job spec's rolling fields,
and whether a replica fits an instance's idle blocks. The detector, the states, exposure and
the guard read these, never their own copies (dstack 0.22.5 unless said).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import polars as pl

# JobStatus / RunStatus (core/models/runs.py): the finished ones never change again.
FINISHED_JOB_STATUSES = ("terminated", "aborted", "failed", "done")
FINISHED_RUN_STATUSES = ("terminated", "failed", "done")
# A replica whose job is TERMINATING or finished is inactive (pipeline_tasks/runs/active.py)
ENDED_JOB_STATUSES = ("terminating", *FINISHED_JOB_STATUSES)
# A job not yet placed, or placed and not yet serving, or RUNNING
ACTIVE_JOB_STATUSES = ("submitted", "provisioning", "pulling", "running")
ACTIVE_RUN_STATUSES = ("pending", "submitted", "provisioning", "running")
# InstanceStatus (core/models/instances.py): a terminating or terminated instance holds no
# replica again; an idle or busy one can take one on its idle blocks.
ENDED_INSTANCE_STATUSES = ("terminating", "terminated")
PLACEABLE_INSTANCE_STATUSES = ("idle", "busy")

# JobTerminationReason classes (reference 5.4).
NORMAL_JOB_REASONS = (
    "terminated_by_user",
    "scaled_down",
    "done_by_runner",
    "aborted_by_user",
)
SERVER_STOP_JOB_REASONS = (
    "terminated_by_server",
    "inactivity_duration_exceeded",
    "terminated_due_to_utilization_policy",
    "max_duration_exceeded",
)
# Messages that mark a server stop as a resubmission/retry step, not a failure
# (services/runs/replicas.py).
RETRY_STOP_MESSAGES = ("Run is to be resubmitted", "Replica is to be retried")
RUN_FAILURE_REASONS = ("job_failed", "retry_limit_exceeded")
# A user's stop or abort of a run, and the labels the terminating pass then gives the jobs it
# reaches (RunTerminationReason.to_job_termination_reason, core/models/runs.py).
USER_STOP_RUN_REASONS = ("stopped_by_user", "aborted_by_user")
USER_STOP_JOB_REASONS = ("terminated_by_user", "aborted_by_user")

# services/runs/spec.py: the service configuration fields whose change changes the JobSpec
# (a rolling deployment), and the RunSpec fields that do the same (reference 6.1).
ROLLING_CONF_FIELDS = (
    "port",
    "probes",
    "resources",
    "volumes",
    "docker",
    "files",
    "image",
    "user",
    "privileged",
    "entrypoint",
    "working_dir",
    "python",
    "nvcc",
    "single_branch",
    "env",
    "shell",
    "commands",
)
ROLLING_SPEC_FIELDS = ("repo_data", "repo_code_hash", "file_archives", "working_dir")
# Updatable in place without a new replica: the JobSpec stays as it is. `groups` is the list
# of replica groups: a change of a group's own rolling field rolls that group out.
IN_PLACE_CONF_FIELDS = ("replicas", "groups", "scaling", "gateway", "priority", "type", "name")
IN_PLACE_SPEC_FIELDS = ("configuration_path", "configuration")
GROUP_IN_PLACE_KEYS = ("name", "replicas", "scaling")

# The same facts in the words of the event "Run updated ... Changed fields: ..." (0.20.8+):
# a change of only these leaves the JobSpec as it is, so dstack bumps in place every active
# job whose spec is the run's current one (reference 6.2) and redeploys none.
IN_PLACE_CHANGES = frozenset(
    {
        "configuration.replicas",
        "configuration.scaling",
        "configuration.priority",
        "configuration.gateway",
        "configuration.inactivity_duration",
    }
)
# A change of only replica counts or groups bumps the jobs whose spec is the current one and
# leaves a rollout's older replicas at their deployment (their spec differs); a `groups` change
# may also roll one group out and bump another (reference 6.2, 11.2 step 6). Pipeline builds
# log no bump, so which jobs were bumped is not in a log.
REPLICA_COUNT_CHANGES = frozenset({"configuration.replicas", "configuration.groups"})

# JobSpec fields a rolling deployment changes (reference 6.1, 11.1.5): their hash tells a
# redeployed job from one bumped in place.
ROLLING_JOB_SPEC_PATHS = (
    "$.commands",
    "$.image_name",
    "$.env",
    "$.requirements",
    "$.repo_code_hash",
    "$.probes",
    "$.service_port",
    "$.working_dir",
    "$.user",
    "$.privileged",
    "$.volumes",
    "$.file_archives",
    "$.app_specs",
    "$.registry_auth",
)


def spec_fingerprint(job_spec: pl.Expr) -> pl.Expr:
    """The hash of a job spec's rolling fields (`job_spec_data` as JSON text): two jobs with
    one fingerprint run one JobSpec as far as a rollout is concerned."""
    return (
        pl.concat_str(
            [job_spec.str.json_path_match(path).fill_null("") for path in ROLLING_JOB_SPEC_PATHS],
            separator="\x1f",
        )
        .hash()
        .cast(pl.String)
    )


def own_failure() -> pl.Expr:
    """A job that failed by itself (reference 5.4 fail class, or a server stop with a message
    that is not a retry step); cascade kills (TERMINATED_BY_SERVER, no message) are not.

    dstack's run pass counts every latest submission that is neither DONE nor SCALED_DOWN as a
    failure of its replica (reference 6.7; background/pipeline_tasks/runs/active.py,
    `_analyze_active_run_replica`); the retry steps of services/runs/replicas.py stop siblings
    with "Replica is to be retried" / "Run is to be resubmitted", which are no failures."""
    reason = pl.col("termination_reason")
    message = pl.col("termination_reason_message")
    retry_step = pl.any_horizontal([message.str.starts_with(m) for m in RETRY_STOP_MESSAGES])
    return (
        pl.when(reason.is_in(NORMAL_JOB_REASONS))
        .then(False)
        .when(reason.is_in(SERVER_STOP_JOB_REASONS))
        .then(message.is_not_null() & ~retry_step)
        .when(reason.is_not_null())
        .then(True)
        .otherwise((pl.col("status") == "failed").fill_null(False))
    )


def cascade_stop() -> pl.Expr:
    """Stopped by the run's termination cascade: dstack's terminating-run pass gives every job
    neither finished nor TERMINATING the reason `RunTerminationReason.to_job_termination_reason()`
    (JOB_FAILED, RETRY_LIMIT_EXCEEDED -> TERMINATED_BY_SERVER) and leaves the message NULL
    (reference 6.8; core/models/runs.py, pipeline_tasks/runs/terminating.py)."""
    return (
        (pl.col("termination_reason") == "terminated_by_server")
        & pl.col("termination_reason_message").is_null()
        & pl.col("status").is_in(["terminated", "terminating"])
    ).fill_null(False)


class Matches(Protocol):
    def matches(
        self,
        cpus: int,
        memory_mib: int,
        gpus: int,
        gpu_name: str | None,
        gpu_memory_mib: int | None,
        disk_mib: int | None,
    ) -> bool: ...


@lru_cache(maxsize=4096)
def blocks_fit(
    req: Matches,
    cpus: int,
    memory_mib: int,
    gpus: int | None,
    gpu_name: str | None,
    gpu_memory_mib: int | None,
    disk_mib: int | None,
    total_blocks: int | None,
    busy_blocks: int,
) -> bool:
    """Whether an instance's idle blocks hold one replica of `req`: dstack offers the smallest
    share of blocks whose resources match (cpus, memory and GPUs divided by the blocks, disk
    not: services/offers.py, generate_shared_offer) and places it when that many are idle."""
    total = max(total_blocks or 1, 1)
    idle = total - busy_blocks
    for blocks in range(1, total + 1):
        share = (cpus // total, memory_mib // total, (gpus or 0) // total)
        if req.matches(*(part * blocks for part in share), gpu_name, gpu_memory_mib, disk_mib):
            return blocks <= idle
    return False


# Alembic head -> the release that last migrated the database (reference section 0).
ALEMBIC_RELEASES = {
    "35e90e1b0d3e": "0.19.14",
    "728b1488b1b4": "0.19.22",
    "74a1f55209bd": "0.19.24",
    "e2d08cd1b8d9": "0.19.25",
    "006512f572b4": "0.19.40",
    "22d74df9897e": "0.20.0",
    "706e0acc3a7d": "0.20.7-0.20.9",
    "a8ed24fd7f90": "0.20.10",
    "8b6d5d8c1b9a": "0.20.13",
    "c1c2ecaee45c": "0.20.14-0.20.15",
    "ad8c50120507": "0.20.16",
    "94fcd7e38b7e": "0.20.17",
    "05c351d08f6b": "0.20.19",
    "e9c5e7e26c78": "0.20.28",
    "4d3cbb932bb2": "0.20.29",
    "ecc9e8a0bfac": "0.21.0",
    "3d4f69210528": "0.21.1",
    "04126c7ea0c8": "0.21.2",
    "dbbe9f32ec66": "0.21.2+ (HEAD 2026-08)",
    "620892d149b5": "0.21.3-0.21.5",
    "652af7a3c9c9": "0.22.0",
    "40f19bea9d2a": "0.22.1-0.22.5",
}
