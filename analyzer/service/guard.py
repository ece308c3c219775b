"""`dstack-audit guard`: a dstack apply policy that refuses the rollout that would take a
service down (issue 25).

dstack 0.22.5's builtin `rest_plugin` (`dstack/plugins/builtin/rest_plugin/_plugin.py`,
`CustomApplyPolicy`) posts `{user, project, spec}` to `<DSTACK_PLUGIN_SERVICE_URI>/apply_policies/
on_run_apply` (and `on_fleet_apply`, `on_volume_apply`, `on_gateway_apply`) from `get_plan` and
`apply_plan` (`services/runs/__init__.py`), waits at most `PLUGIN_REQUEST_TIMEOUT_SEC` = 8 s, and
reads `{spec, error}` back: a non-null `error` reaches the user as `Apply request rejected:
<error>`. The guard always answers the spec it was given (it never changes one).

The decision, for an update of a RUNNING service (`apply_plan` bumps `deployment_num`):
- new replicas start when the JobSpec changes (`_build_deployment_update_map` /
  `job_spec_updatable_in_place`: the configuration fields of `_TYPE_SPECIFIC_CONF_UPDATABLE_FIELDS`
  marked "rolling deployment" and the spec's `repo_data`, `repo_code_hash`, `file_archives`,
  `working_dir`), one surge replica at a time (`ROLLING_DEPLOYMENT_MAX_SURGE` = 1) above the
  desired count, or when the desired count grows (`_build_service_scaling_maps`);
- a failure of any of them fails the run and stops its healthy replicas (dstack #4186,
  `analyzer.pipeline.exposure.judge_release`);
- room is what `jobs_submitted.py` would find: an idle (or partly busy) instance whose idle blocks
  fit one replica, or a cloud fleet below `nodes.max` (`can_create_new_cloud_instance_in_fleet`;
  never an SSH fleet, never with `creation_policy: reuse`), less the other runs' queued
  replicas (SUBMITTED, not yet provisioned) that will take it first.
The server's state comes from `analyzer.service.model` (a live model refreshed in the
background); `decide` is pure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from analyzer.dstack import (
    ENDED_INSTANCE_STATUSES,
    IN_PLACE_CONF_FIELDS,
    IN_PLACE_SPEC_FIELDS,
    PLACEABLE_INSTANCE_STATUSES,
    ROLLING_CONF_FIELDS,
    ROLLING_SPEC_FIELDS,
    blocks_fit,
)
from analyzer.pipeline.exposure import judge_release, retry_for_no_capacity
from analyzer.pipeline.placement import Queued, Requirement, queued_first, requirement
from analyzer.pipeline.states import (
    latest_submissions,
    replicas_active_now,
    replicas_serving_now,
)

Decision = Literal["approve", "reject", "warn", "unknown"]
ENDPOINTS = ("on_run_apply", "on_fleet_apply", "on_volume_apply", "on_gateway_apply")
# dstack 0.22.5's name rules, checked before a name reaches a URL or a log line:
# core/services/__init__.py `is_valid_dstack_resource_name` (runs, fleets) and
# server/services/projects.py `is_valid_project_name` (fullmatch: `re.match` with `$` would
# let a trailing newline through).
RUN_NAME = re.compile(r"[a-z][a-z0-9-]{1,40}")
PROJECT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,50}")


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str


def _strip_defaults(resources: Any, current: Any) -> Any:
    """The new resources with the server-set defaults the client leaves unset taken from the
    current spec (`set_run_spec_resources_defaults`: gpu vendor; `job_spec_updatable_in_place`:
    an unset cpu arch), so an unchanged configuration is not read as a change."""
    if not isinstance(resources, dict) or not isinstance(current, dict):
        return resources
    new = json.loads(json.dumps(resources))
    for part, key in (("gpu", "vendor"), ("cpu", "arch")):
        mine, theirs = new.get(part), current.get(part)
        known = isinstance(mine, dict) and isinstance(theirs, dict) and key in theirs
        if known and mine.get(key) is None:
            mine[key] = theirs[key]
    return new


def _rolling_changes(current: dict, new: dict) -> list[str]:
    """The fields whose change makes dstack deploy new replicas."""
    old_conf, new_conf = current.get("configuration") or {}, new.get("configuration") or {}
    changed = []
    for name in ROLLING_CONF_FIELDS:
        mine, theirs = new_conf.get(name), old_conf.get(name)
        if name == "resources":
            mine = _strip_defaults(mine, theirs)
        if mine != theirs:
            changed.append(f"configuration.{name}")
    old_groups = {g.get("name"): g for g in old_conf.get("groups") or [] if isinstance(g, dict)}
    for group in new_conf.get("groups") or []:
        if not isinstance(group, dict) or group.get("name") not in old_groups:
            continue
        before = old_groups[group.get("name")]
        for key in set(group) | set(before):
            if key in ("name", "replicas", "scaling"):
                continue
            if group.get(key) != before.get(key):
                changed.append(f"configuration.groups[{group.get('name')}].{key}")
    changed.extend(name for name in ROLLING_SPEC_FIELDS if new.get(name) != current.get(name))
    return changed


def _replacing(current: dict, new: dict) -> list[str]:
    """Fields dstack cannot update in place: `dstack apply` then stops the run and submits a new
    one (`check_can_update_run_spec`), which is the user's explicit choice, not a rollout."""
    fields = set(current) | set(new)
    spec = [
        f
        for f in sorted(fields)
        if f not in IN_PLACE_SPEC_FIELDS + ROLLING_SPEC_FIELDS
        and f not in ("run_name", "merged_profile", "ssh_key_pub", "repo_id", "profile")
        and current.get(f) != new.get(f)
    ]
    old_conf, new_conf = current.get("configuration") or {}, new.get("configuration") or {}
    conf = [
        f"configuration.{f}"
        for f in sorted(set(old_conf) | set(new_conf))
        if f not in ROLLING_CONF_FIELDS + IN_PLACE_CONF_FIELDS
        and old_conf.get(f) != new_conf.get(f)
    ]
    return spec + conf


def _wanted(conf: dict, active: int) -> int:
    """The desired replica count after the update: a fixed count, or the current one kept inside
    the new range (the autoscaler moves it later; `compute_desired_replica_counts`)."""
    groups = conf.get("groups")
    if isinstance(groups, list) and groups:
        return sum(_wanted(g, 0) if isinstance(g, dict) else 0 for g in groups) or active
    replicas = conf.get("replicas", 1)
    if isinstance(replicas, int):
        return replicas
    if isinstance(replicas, str) and replicas.isdigit():
        return int(replicas)
    if isinstance(replicas, dict):
        low, high = replicas.get("min"), replicas.get("max")
        value = active
        if isinstance(low, int):
            value = max(value, low)
        if isinstance(high, int):
            value = min(value, high)
        return value
    return active


def _fits(req: Requirement | None, instance: dict) -> bool | None:
    """Whether the instance's idle blocks hold one replica (dstack's block fit, said once in
    `analyzer.dstack.blocks_fit`); None when the instance's resources are not known."""
    resources = ((instance.get("instance_type") or {}).get("resources")) or {}
    cpus, memory = resources.get("cpus"), resources.get("memory_mib")
    if req is None or cpus is None or memory is None:
        return None
    gpus = resources.get("gpus") or []
    first = gpus[0] if gpus else {}
    return blocks_fit(
        req,
        cpus,
        memory,
        len(gpus),
        first.get("name"),
        first.get("memory_mib"),
        (resources.get("disk") or {}).get("size_mib"),
        instance.get("total_blocks"),
        instance.get("busy_blocks") or 0,
    )


def _alive(fleet: dict) -> list[dict]:
    return [
        i for i in fleet.get("instances") or [] if i.get("status") not in ENDED_INSTANCE_STATUSES
    ]


def _nodes(fleet: dict) -> tuple[int | None, bool]:
    """(nodes.max, ssh) of a fleet: an SSH fleet by its spec's `ssh_config` or by hosts of the
    `remote` backend (what an SSH fleet's instances are)."""
    conf = (fleet.get("spec") or {}).get("configuration") or {}
    nodes = conf.get("nodes")
    high = nodes if isinstance(nodes, int) else (nodes or {}).get("max")
    ssh = conf.get("ssh_config") is not None
    ssh = ssh or any(i.get("backend") == "remote" for i in _alive(fleet))
    return (high if isinstance(high, int) else None), ssh


def room(
    fleets: list[dict], req: Requirement | None, creation: str, pending: int
) -> tuple[float, list[str], int]:
    """(replicas that can be placed, what each fleet offers, idle instances whose fit is
    unknown: each might hold one more)."""
    total: float = 0
    told = []
    unknown = 0
    for fleet in fleets:
        high, ssh = _nodes(fleet)
        alive = _alive(fleet)
        fits = [_fits(req, i) for i in alive if i.get("status") in PLACEABLE_INSTANCE_STATUSES]
        unknown += fits.count(None)
        idle = sum(1 for f in fits if f)
        grow: float = 0
        if not ssh and creation != "reuse":
            grow = float("inf") if high is None else max(0, high - len(alive))
        total += idle + grow
        limit = "an SSH fleet (never provisions)" if ssh else f"nodes.max {high}"
        told.append(
            f"fleet {fleet.get('name')}: {len(alive)} instance(s), {limit}, {idle} idle that fit"
        )
    return total - pending, told, unknown


def _pending(
    others: list[dict], fleets: dict[str, str | None], run_id: str, priority: int
) -> tuple[int, list[str]]:
    """Other runs' queued replicas (SUBMITTED, not provisioned) that dstack places first in
    these fleets (id -> name), by `analyzer.pipeline.placement.queued_first` (issue 22,
    "exposure sees the other runs' queued surge replicas")."""
    queued = []
    for run in others:
        spec = run.get("run_spec") or {}
        conf = spec.get("configuration") or {}
        names = conf.get("fleets") or (spec.get("profile") or {}).get("fleets")
        priority_of = conf.get("priority")
        for job in latest_submissions(run):
            sub = job["sub"]
            if sub.get("status") != "submitted" or sub.get("job_provisioning_data"):
                continue
            queued.append(
                Queued(
                    run_id=str(run.get("id")),
                    run_name=spec.get("run_name"),
                    job_name=job["spec"].get("job_name"),
                    fleet_id=(run.get("fleet") or {}).get("id"),
                    fleet_names=frozenset(str(n).split("/")[-1] for n in names)
                    if isinstance(names, list)
                    else None,
                    priority=priority_of if isinstance(priority_of, int) else 0,
                    requirement=None,
                    since=_time(sub.get("submitted_at")),
                )
            )
    first = queued_first(queued, run_id, fleets, priority)
    counts: dict[str, int] = {}
    for job in first:
        counts[str(job.run_name)] = counts.get(str(job.run_name), 0) + 1
    return len(first), [f"{name} ({count})" for name, count in counts.items()]


def decide(
    spec: dict,
    current: dict | None,
    fleets: list[dict],
    others: list[dict],
    version: str | None,
    now: datetime,
) -> Verdict:
    """approve / reject / unknown for one run spec, from the server's state (pure: the unit
    tests give it hand-built fleets)."""
    conf = spec.get("configuration") or {}
    if conf.get("type") != "service":
        return Verdict("approve", "not a service")
    if current is None or current.get("status") != "running":
        return Verdict("approve", "a new run, not an update of a running service")
    old = current.get("run_spec") or {}
    replaced = _replacing(old, spec)
    if replaced:
        return Verdict(
            "approve",
            f"{', '.join(replaced)} cannot change in place: dstack stops the run and submits a "
            "new one (no rolling deployment)",
        )
    rolling = _rolling_changes(old, spec)
    active = replicas_active_now(current)
    wanted = _wanted(conf, active)
    needed = max(1, wanted + 1 - active) if rolling else max(0, wanted - active)
    name = spec.get("run_name")
    if needed == 0:
        return Verdict("approve", "an in-place update: it starts no replica")
    healthy = replicas_serving_now(current)
    what = f"a rolling deployment ({', '.join(rolling)})" if rolling else "a scale-up"
    if healthy == 0:
        return Verdict("approve", f"{what}, but no healthy replica is at stake")
    exposed, why = judge_release(version)
    if exposed != "yes":
        return Verdict("unknown", f"{what}: {why}")
    run_fleet = (current.get("fleet") or {}).get("id")
    candidates = [f for f in fleets if run_fleet is None or f.get("id") == run_fleet]
    names = conf.get("fleets") or (spec.get("profile") or {}).get("fleets")
    if isinstance(names, list):
        wanted_names = {str(n).split("/")[-1] for n in names}
        candidates = [f for f in candidates if f.get("name") in wanted_names]
    creation = str(_setting(spec, "creation_policy") or "reuse-or-create")
    priority = conf.get("priority") if isinstance(conf.get("priority"), int) else 0
    pending, queued_by = _pending(
        others, {str(f.get("id")): f.get("name") for f in candidates}, current["id"], priority
    )
    # every replica group's requirement: the one with the least room decides
    places, told, unsure = min(
        (room(candidates, req, creation, pending) for req in _requirements(conf)),
        key=lambda found: (found[0], -found[2]),
    )
    submitted = _time(current.get("submitted_at"))
    age = (now - submitted).total_seconds() if submitted else None
    retry_text, at_once = retry_for_no_capacity(_setting(spec, "retry"), age)
    retry_text = retry_text.replace(" at T", " now")
    if places >= needed:
        return Verdict("approve", f"{what} of {name}: room for {needed} new replica(s)")
    if places + unsure >= needed:
        return Verdict(
            "unknown",
            f"{what} of {name}: room only if {unsure} instance(s) of unknown resources fit",
        )
    queued = f"; queued first: {', '.join(queued_by)}" if queued_by else ""
    full = "; ".join(told) or "no fleet the service can use"
    fix = _fix(candidates, needed, queued_by)
    return Verdict(
        "reject",
        f"{what} of service {name} needs {needed} new replica(s) and there is no room "
        f"({full}{queued}): the new replica would fail 'Fleet is at capacity'"
        f"{'' if at_once else ' when its retry ends'} and dstack (#4186, release {version}) "
        f"would stop the {healthy} healthy replica(s) of {name} with it ({retry_text}). "
        f"Fix: {fix}, then apply again.",
    )


def _requirements(conf: dict) -> list[Requirement | None]:
    """What one replica of each replica group needs (dstack 0.22.5 `replica_groups`: a
    service without `groups` is one group of its own `resources`; a group's own `resources`,
    which the server always sends, else unknown: its fit is then never guessed)."""
    groups = [g for g in conf.get("groups") or [] if isinstance(g, dict)]
    if not groups:
        return [requirement("0", conf.get("resources"))]
    return [requirement(str(g.get("name")), g.get("resources")) for g in groups]


def _setting(spec: dict, name: str) -> Any:
    """A profile setting (`retry`, `creation_policy`): the configuration's, else the profile's
    (`RunSpec.merged_profile` lets the configuration override the profile)."""
    conf = spec.get("configuration") or {}
    if conf.get(name) is not None:
        return conf[name]
    for profile in (spec.get("profile"), spec.get("merged_profile")):
        if isinstance(profile, dict) and profile.get(name) is not None:
            return profile[name]
    return None


def _fix(fleets: list[dict], needed: int, queued_by: list[str]) -> str:
    for fleet in fleets:
        high, ssh = _nodes(fleet)
        if ssh:
            return f"add a host to SSH fleet {fleet.get('name')} or free one of its instances"
        if high is not None:
            return (
                f"raise fleet {fleet.get('name')}'s nodes.max to "
                f"{high + needed} (`dstack apply` the fleet) or free an instance"
            )
    if queued_by:
        return "wait for the queued runs to be placed"
    return "create a fleet the service can use"


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
