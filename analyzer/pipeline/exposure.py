"""Exposure: which running services the next failed rollout would take down, and whether a
surge replica has room at a given moment.

The state at T is rebuilt from what the tables record, never from a verdict: fleets that exist
at T (created/deleted times, `nodes` from the spec), their instances alive at T (created /
finished times) and the blocks that jobs hold on them at T (job assignment, job stop time).

dstack's rules encoded here (dstackai/dstack, `background/pipeline_tasks/jobs_submitted.py`
and `services/fleets.py` at the mirror HEAD 511c318c8, unchanged in the 0.22.5 wheel):
- candidate fleets (`services/runs/plan.py::get_run_candidate_fleet_models_filters`): the
  run's own fleet once it has one (`runs.fleet_id`), else the project's fleets that are not
  deleted, narrowed by the run's `fleets` names;
- an existing instance is used when it is IDLE or BUSY with enough idle blocks whose share of
  the offer matches the requirements (`services/instances.py::get_shared_instances_with_offers`,
  `services/offers.py::generate_shared_offer`: cpus, memory and GPUs divided by blocks, disk not);
- otherwise a new instance is created only when `can_create_new_cloud_instance_in_fleet`
  holds: not an SSH fleet and fewer active (not TERMINATING/TERMINATED) instances than
  `nodes.max`; else the job fails FAILED_TO_START_DUE_TO_NO_CAPACITY "Fleet is at capacity".
  With `creation_policy: reuse` no instance is created ("Could not reuse any instance").
- other runs' jobs queued at T are placed first (`placement.queued_first`: priority, then age).
Whether the cloud provider then has an offer is not in the evidence: a fleet with room says
`available` only when the provider placed a fitting instance in it before T and refused
nothing since; otherwise `unknown`, with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from analyzer.contract import Finding, LimitationRecord
from analyzer.pipeline.placement import (
    STATIC_SHAPE,
    Queued,
    Requirement,
    fits,
    groups_of,
    parse_spec,
    place_queue,
    queued_at,
    queued_first,
    reachable_idle,
    running_sum,
    spans_at,
)
from analyzer.pipeline.specs import fleet_nodes_at, promised_surges, run_spec_at
from analyzer.pipeline.states import alive_at, healthy_at, probe_state_at, running_services

Exposed = Literal["yes", "no", "unknown"]
Surge = Literal["none", "available", "unknown"]

# Releases with the behaviour: rolling deployments exist from 0.19.14 (reference section 0), and
# the run-level failure rule is deployment-blind through 0.22.5 (dstack issue #4186, open;
# `pipeline_tasks/runs/active.py` is identical in the mirror HEAD and the 0.22.5 wheel).
FIRST_AFFECTED = (0, 19, 14)
LAST_KNOWN_AFFECTED = (0, 22, 5)
BEHAVIOUR_SOURCE = (
    "dstack #4186 (open): a failed replica of a new deployment fails the whole run and stops "
    "the healthy old replicas; present from 0.19.14 (rolling deployments) through 0.22.5"
)
# No-capacity messages that name a fleet-level cause, not the provider (jobs_submitted.py).
FLEET_LEVEL_MESSAGES = (
    "Fleet is at capacity",
    "Could not reuse any instance",
    "Failed to use specified",
    "No matching fleet found",
)
NO_CAPACITY = "failed_to_start_due_to_no_capacity"
BEFORE_UPDATE = timedelta(milliseconds=1)
RETRY_DEFAULT_SECONDS = 3600  # reference 4.1: a retry without duration lasts 3600 s


class _Record(BaseModel):
    # built on first use: an audit imports this module for the foresight, which builds none
    model_config = ConfigDict(extra="forbid", defer_build=True)


class InstanceAtT(_Record):
    instance_id: str
    instance_name: str | None
    state: Literal["busy", "idle", "provisioning"]
    blocks: str  # "busy/total"
    fits: bool | None  # idle blocks enough for one more replica; None: resources unknown
    provenance: str | None


class FleetAtT(_Record):
    fleet_id: str
    fleet_name: str | None
    nodes: str  # "min..max" as the spec says
    ssh: bool
    active_instances: int
    instances: list[InstanceAtT]
    can_add_node: bool
    provenance: str | None


class ServiceExposure(_Record):
    server: str
    run_id: str
    project: str | None
    run_name: str
    as_of: datetime
    exposed: Exposed
    dstack_release: str | None
    surge_capacity: Surge
    healthy_replicas: int
    active_replicas: int
    desired_replicas: int | None
    resources: list[str]  # per replica group: "group: requirements"
    retry: str  # the retry policy for no-capacity, as it applies at T
    fleets: list[FleetAtT]
    reasons: list[str]
    past_incidents: int
    recommendation: str


class ExposureReport(_Record):
    as_of: datetime | None
    services: list[ServiceExposure]
    limitations: list[LimitationRecord] = Field(default_factory=list)


@cache
def judge_release(version: str | None) -> tuple[Exposed, str]:
    """Whether the server's release has the behaviour of #4186, and why (asked per probe,
    of a server or two)."""
    if not version:
        return "unknown", "the dstack release is not in the evidence (" + BEHAVIOUR_SOURCE + ")"
    numbers = re.findall(r"(\d+)\.(\d+)\.(\d+)", version)
    if not numbers or version.startswith("unknown"):
        return "unknown", f"release {version} cannot be judged ({BEHAVIOUR_SOURCE})"
    first = tuple(int(n) for n in numbers[0])
    last = tuple(int(n) for n in numbers[-1])
    if first >= FIRST_AFFECTED and last <= LAST_KNOWN_AFFECTED:
        return "yes", f"release {version}: {BEHAVIOUR_SOURCE}"
    if last < FIRST_AFFECTED:
        return "unknown", f"release {version} predates rolling deployments (0.19.14)"
    return "unknown", f"release {version} is newer than 0.22.5, the last release checked"


def retry_for_no_capacity(retry, run_age: float | None) -> tuple[str, bool]:
    """The no-capacity retry as it applies at T, and whether a placement failure would fail
    the run at once. For a slot never provisioned the window runs from the run's submission
    (reference 6.5), so a service older than the duration gets no retry."""
    if retry in (None, False):
        return "no retry on no-capacity: a placement failure fails the run at once", True
    events, duration = None, RETRY_DEFAULT_SECONDS
    if isinstance(retry, dict):
        events = retry.get("on_events")
        duration = retry.get("duration") or RETRY_DEFAULT_SECONDS
    if events is not None and "no-capacity" not in events:
        return (
            f"retry on {', '.join(events) or 'nothing'}, not on no-capacity: a placement "
            "failure fails the run at once",
            True,
        )
    if run_age is not None and run_age > duration:
        return (
            f"retry on no-capacity for {duration:g} s from the run's submission, already past "
            f"at T (run age {run_age:.0f} s): a placement failure fails the run at once",
            True,
        )
    left = f", {duration - run_age:.0f} s left at T" if run_age is not None else ""
    return f"retry on no-capacity for {duration:g} s from the run's submission{left}", False


@dataclass
class Frames:
    """What the computation reads: the canonical frames and the timeline's submissions."""

    runs: pl.DataFrame
    submissions: pl.DataFrame
    fleets: pl.DataFrame
    instances: pl.DataFrame
    fleet_table_servers: set[str]
    server_versions: dict[str, str]
    narrowed: bool = False  # jobs of some runs not read: an idle-looking instance may be busy
    # per server, the end of its evidence: the final rows (probe streaks, ready) speak of it
    evidence_ends: dict[str, datetime] = field(default_factory=dict)
    # the runs' "Run updated" events: a spec changed after T is not read back into T
    # (specs.run_spec_at); none given, no update is known
    updates: pl.DataFrame | None = None
    placed: pl.DataFrame | None = None  # placement.placed_jobs; none: from `submissions`


def assess_probes(
    frames: Frames, probes: pl.DataFrame, findings: list[Finding], *, detail: bool = True
) -> list[ServiceExposure]:
    """One ServiceExposure per probe row (server, run_id, as_of), each at its own moment
    (`detail` false: each fleet's instances not listed, only their verdict; a fleet's
    instances at T grow with the fleet, and a probe per finding would list them all)."""
    return [a.service() for a in assess_states(frames, probes, findings, detail=detail)]


def assess_states(
    frames: Frames, probes: pl.DataFrame, findings: list[Finding], *, detail: bool
) -> list[_Assessment]:
    """The probes' verdicts, from each fleet's state at each probe's moment worked out as
    joins over the moments (instances alive, blocks held, jobs queued, instances provisioned
    and placements refused by then), not per instance or job in Python."""
    if probes.is_empty():
        return []
    probe = ["server", "run_id", "as_of"]
    # the run's spec in force at T (or at a probe's `spec_as_of`), never the final one read
    # back (specs.run_spec_at)
    spec_at = run_spec_at(frames.runs, frames.submissions, frames.updates, probes)
    probes = probes.select(probe)
    subs = probe_state_at(frames.submissions.join(probes, on=["server", "run_id"]))
    live = alive_at()
    healthy = (
        subs.filter(live & healthy_at(frames.evidence_ends))
        .group_by(probe)
        .agg(pl.col("replica_num").n_unique().alias("_healthy"))
    )
    active = (
        subs.filter(live).group_by(probe).agg(pl.col("replica_num").n_unique().alias("_active"))
    )
    runs = (
        probes.join(
            frames.runs.drop("placement_spec", "desired_replica_count"),
            on=["server", "run_id"],
            how="left",
            maintain_order="left",
        )
        .join(spec_at, on=probe, how="left", maintain_order="left")
        .join(healthy, on=probe, how="left", maintain_order="left")
        .join(active, on=probe, how="left", maintain_order="left")
    )

    fleets_at = (
        runs.select("server", "run_id", "as_of", "project", pl.col("fleet_id").alias("run_fleet"))
        .join(frames.fleets, on=["server", "project"])
        .filter(
            (pl.col("created_at") <= pl.col("as_of"))
            & (pl.col("deleted_at").is_null() | (pl.col("deleted_at") > pl.col("as_of")))
            & (pl.col("run_fleet").is_null() | (pl.col("run_fleet") == pl.col("fleet_id")))
        )
    )
    key = ["server", "fleet_id", "as_of"]
    moments = fleets_at.select(key).unique().sort("as_of")
    instances = frames.instances.with_row_index("_row")
    # each instance's shape (what decides whether it takes a replica, but its busy blocks)
    kinds = instances.select(STATIC_SHAPE).unique(maintain_order=True).with_row_index("_kind")
    instances = instances.join(
        kinds, on=list(STATIC_SHAPE), how="left", nulls_equal=True, maintain_order="left"
    )
    # blocks held on each instance at T: what the jobs placed on it by T and not stopped by
    # T hold, a running sum over the times jobs took and left it (its steps)
    holds = (
        frames.submissions.select(
            "server",
            "instance_id",
            "created_at",
            "stopped_at",
            pl.col("blocks").fill_null(1).alias("held"),
        )
        .filter(
            pl.col("instance_id").is_not_null()
            & pl.col("created_at").is_not_null()
            & (pl.col("stopped_at").is_null() | (pl.col("stopped_at") > pl.col("created_at")))
        )
        .join(instances.select("server", "instance_id", "_row"), on=["server", "instance_id"])
    )
    steps = (
        pl.concat(
            [
                holds.select("_row", pl.col("created_at").alias("at"), "held"),
                holds.drop_nulls("stopped_at").select(
                    "_row", pl.col("stopped_at").alias("at"), -pl.col("held")
                ),
            ]
        )
        .group_by("_row", "at")
        .agg(pl.col("held").sum())
        .sort("_row", "at")
        .select("_row", "at", running_sum("held", "_row").alias("busy_blocks"))
    )
    # the instances alive at each fleet's moments, each moment's in the instances' order: the
    # moments are numbered in time order, so each instance's moments are in time order too,
    # as its steps are, and the step in force at each (the last by T) is found in each
    # instance's own steps, not by ordering every instance alive at every moment by time
    instances_at = (
        spans_at(
            moments,
            instances.select("server", "fleet_id", "_row", "created_at", "ended_at"),
            ("server", "fleet_id"),
            start="created_at",
            end="ended_at",
        )
        .select("_moment", "_row")
        .sort(pl.col("_moment").cast(pl.Int64) * instances.height + pl.col("_row"))
        .with_columns(
            pl.lit(moments["as_of"]).gather(pl.col("_moment")).alias("as_of"),
            pl.lit(instances["_kind"]).gather(pl.col("_row")),
            pl.lit(instances["started_at"]).gather(pl.col("_row")),
            (pl.lit(instances["backend"]).gather(pl.col("_row")) == "remote").alias("remote"),
        )
        .join_asof(
            steps,
            left_on="as_of",
            right_on="at",
            by="_row",
            strategy="backward",
            check_sortedness=False,
        )
        .select(
            "_moment",
            "_row",
            "_kind",
            "remote",
            pl.col("busy_blocks").fill_null(0),
            (pl.col("started_at").is_null() | (pl.col("started_at") > pl.col("as_of"))).alias(
                "provisioning"
            ),
        )
    )
    # the jobs queued at each moment: a shape's instances past the longest queue's length
    # and one more are never reached (placement.reachable_idle), nor kept
    queued = queued_at(frames.runs, frames.submissions, probes)
    reached = 1 + max(map(len, queued.values()), default=0)
    # the instances that place a replica alike, in order of their first one: the first that
    # fits is the first instance that fits
    shapes = (
        instances_at.group_by(
            "_moment", "provisioning", "_kind", "busy_blocks", maintain_order=True
        )
        .agg(pl.col("_row").first().alias("_first"), pl.col("_row").head(reached).alias("rows"))
        .join(kinds, on="_kind", maintain_order="left")
        .join(moments.with_row_index("_moment"), on="_moment", maintain_order="left")
        .with_columns(
            pl.lit(instances["instance_name"]).gather(pl.col("_first")).alias("instance_name")
        )
    )
    alive = (
        instances_at.group_by("_moment")
        .agg(
            pl.len().alias("count"),
            pl.col("remote").any(),
        )
        .join(moments.with_row_index("_moment"), on="_moment")
        .select(*key, "count", "remote")
    )
    listed = (
        instances_at.join(
            moments.with_row_index("_moment"), on="_moment", maintain_order="left"
        ).join(
            instances.select(
                "_row",
                "instance_id",
                "instance_name",
                "started_at",
                *STATIC_SHAPE,
                pl.col("provenance").alias("i_provenance"),
            ),
            on="_row",
            maintain_order="left",
        )
        if detail
        else None
    )
    specs = _Specs()
    latest, refusals = _provider_history(frames, runs, fleets_at, specs, instances, kinds)
    if frames.updates is not None:
        runs = runs.join(
            promised_surges(frames.updates, frames.submissions, frames.runs, probes),
            on=probe,
            how="left",
            maintain_order="left",
        )
    context = _Context(
        frames=frames,
        instances=_group(listed, tuple(key)) if listed is not None else {},
        shapes=_group(shapes, tuple(key)),
        instance_names=instances["instance_name"].to_list(),
        alive={(s, f, t): (n, remote) for s, f, t, n, remote in alive.iter_rows()},
        latest=latest,
        refusals=refusals,
        incidents=_incidents(findings),
        queued=queued,
        specs=specs,
    )
    fleets_of = _group(
        fleet_nodes_at(fleets_at, frames.submissions, frames.runs, frames.fleets, frames.instances),
        ("server", "run_id", "as_of"),
    )
    return [
        _assess_one(row, fleets_of.get((row["server"], row["run_id"], row["as_of"]), []), context)
        for row in runs.iter_rows(named=True)
    ]


def _group(frame: pl.DataFrame, key: tuple[str, ...]) -> dict[tuple, list[dict]]:
    grouped: dict[tuple, list[dict]] = {}
    for item in frame.iter_rows(named=True):
        grouped.setdefault(tuple(item[k] for k in key), []).append(item)
    return grouped


class _Specs:
    """Run specs read once per text: the probes of one service, and services deployed alike,
    share theirs."""

    def __init__(self) -> None:
        self._read: dict[str | None, tuple[dict, list]] = {}
        self.listed: list[Requirement] = []  # the requirements met, by index (`requirements`)

    def of(self, text: str | None) -> tuple[dict, list[tuple[str, int | None, Requirement | None]]]:
        """The spec ({} when unreadable) and its replica groups."""
        if text not in self._read:
            spec = parse_spec(text) or {}
            self._read[text] = (spec, groups_of(spec) if spec else [])
        return self._read[text]

    def requirements(self, texts: pl.Series) -> pl.DataFrame:
        """(placement_spec, requirement's index in `self.listed`) of each group's resources."""
        index: dict[Requirement, int] = {}
        rows = []
        for text in texts.drop_nulls().unique(maintain_order=True):
            for _, _, req in self.of(text)[1]:
                if req is not None:
                    rows.append((text, index.setdefault(req, len(index))))
        self.listed = list(index)
        return pl.DataFrame(
            rows, schema={"placement_spec": pl.String, "req": pl.Int64}, orient="row"
        ).unique()


def _provider_history(
    frames: Frames,
    runs: pl.DataFrame,
    fleets_at: pl.DataFrame,
    specs: _Specs,
    instances: pl.DataFrame,
    kinds: pl.DataFrame,
) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
    """What `_provider_room` reads of the provider, for every probe at once: (server,
    fleet_id, as_of, requirement) -> the latest instance that fits the requirement
    provisioned in the fleet by T, and (server, project, as_of) -> the last placement the
    provider refused in the project by T. As-of joins over the instances of each shape that
    fits, and over the refusals, each in order (ties: the later row). `instances` carry
    their row and `_kind`, their row in `kinds` (STATIC_SHAPE)."""
    candidates = (
        runs.select("server", "run_id", "as_of", "placement_spec")
        .join(specs.requirements(runs["placement_spec"]), on="placement_spec")
        .join(
            fleets_at.select("server", "run_id", "as_of", "fleet_id"),
            on=["server", "run_id", "as_of"],
        )
        .select("server", "fleet_id", "as_of", "req")
        .unique()
    )
    # an instance with no creation time (a damaged row) cannot be shown placed before T
    placed = instances.filter(
        pl.col("started_at").is_not_null() & pl.col("created_at").is_not_null()
    ).join(candidates.select("server", "fleet_id").unique(), on=["server", "fleet_id"], how="semi")
    # whether a requirement fits an empty instance of a shape: asked once per pair met
    pairs = (
        candidates.join(
            placed.select("server", "fleet_id", "_kind").unique(), on=["server", "fleet_id"]
        )
        .select("req", "_kind")
        .unique()
    )
    kind = kinds.rows(named=True)
    fitting = pl.DataFrame(
        [
            (req, at)
            for req, at in pairs.iter_rows()
            if fits(specs.listed[req], {**kind[at], "busy_blocks": 0})
        ],
        schema={"req": pl.Int64, "_kind": kinds["_kind"].dtype},
        orient="row",
    )
    found = (
        candidates.join(fitting, on="req")
        .sort("as_of")
        .join_asof(
            placed.select("server", "fleet_id", "_kind", "created_at", "_row", "backend").sort(
                "created_at", maintain_order=True
            ),
            left_on="as_of",
            right_on="created_at",
            by=["server", "fleet_id", "_kind"],
            strategy="backward",
            check_sortedness=False,
        )
        .drop_nulls("_row")
        .sort("created_at", "_row", maintain_order=True)
        .group_by("server", "fleet_id", "as_of", "req")
        .agg(pl.col("created_at").last(), pl.col("backend").last())
    )
    latest = {
        (server, fleet, at, specs.listed[req]): {"created_at": created, "backend": backend}
        for server, fleet, at, req, created, backend in found.iter_rows()
    }
    # a refusal in a run of no known project is one of that "project", as a probe's would be
    project = [
        pl.col("project").fill_null("").alias("_project"),
        pl.col("project").is_null().alias("_unnamed"),
    ]
    message = pl.col("termination_reason_message").fill_null("")
    fleet_level = pl.any_horizontal([message.str.starts_with(m) for m in FLEET_LEVEL_MESSAGES])
    refused = frames.submissions.filter(
        (pl.col("termination_reason") == NO_CAPACITY) & ~fleet_level
    )
    if refused.is_empty():  # the provider refused no placement: none by any T
        return latest, {}
    refused = (
        refused.join(
            frames.runs.select("server", "run_id", "project"),
            on=["server", "run_id"],
            how="left",
            maintain_order="left",
        )
        .drop_nulls("stopped_at")
        .select("server", *project, "stopped_at", "job_name", "termination_reason_message")
        .sort("stopped_at", maintain_order=True)
    )
    last = (
        runs.select("server", "project", "as_of")
        .unique()
        .with_columns(project)
        .sort("as_of")
        .join_asof(
            refused,
            left_on="as_of",
            right_on="stopped_at",
            by=["server", "_project", "_unnamed"],
            strategy="backward",
            check_sortedness=False,
        )
        .drop_nulls("stopped_at")
    )
    refusals = {
        (item["server"], item["project"], item["as_of"]): item
        for item in last.select(
            "server", "project", "as_of", "stopped_at", "job_name", "termination_reason_message"
        ).iter_rows(named=True)
    }
    return latest, refusals


@dataclass
class _Context:
    """Facts shared by every probe, indexed once; fleet states cached per moment."""

    frames: Frames
    # (server, fleet_id, as_of) -> instances alive then (empty unless `detail`)
    instances: dict[tuple, list[dict]]
    # (server, fleet_id, as_of) -> their distinct SHAPEs, each with the `rows` of its first
    # instances: as many as the longest queue of any moment can reach, and one more
    shapes: dict[tuple, list[dict]]
    instance_names: list[str | None]  # by row of the instances frame
    alive: dict[tuple, tuple[int, bool]]  # (server, fleet_id, as_of) -> (count, any remote)
    # (server, fleet_id, as_of, requirement) -> the latest fitting instance provisioned by T
    latest: dict[tuple, dict]
    refusals: dict[tuple, dict]  # (server, project, as_of) -> the provider's last refusal by T
    incidents: dict[tuple, list[datetime]]  # (server, project, run_name) -> incident times
    queued: dict[tuple, list[Queued]]  # (server, project, as_of) -> jobs queued then
    specs: _Specs
    fleet_cache: dict[tuple, _FleetState] = field(default_factory=dict)


@dataclass
class _FleetState:
    """A fleet at T as the verdict reads it; a FleetAtT only when a report shows it."""

    fleet_id: str
    fleet_name: str | None
    nodes: str  # "min..max" as the spec says
    ssh: bool
    active_instances: int
    instances: list[dict]  # InstanceAtT's fields, when listed
    can_add_node: bool
    provenance: str | None
    nodes_known: bool = True  # false: the final spec is contradicted at T (specs.fleet_nodes_at)
    _shown: FleetAtT | None = None

    def record(self) -> FleetAtT:
        if self._shown is None:
            self._shown = FleetAtT(
                fleet_id=self.fleet_id,
                fleet_name=self.fleet_name,
                nodes=self.nodes,
                ssh=self.ssh,
                active_instances=self.active_instances,
                instances=[InstanceAtT(**each) for each in self.instances],
                can_add_node=self.can_add_node,
                provenance=self.provenance,
            )
        return self._shown


@dataclass
class _Assessment:
    """One probe's verdict; a ServiceExposure only when a report shows it (the foresight
    reads the verdict and its reasons alone)."""

    row: dict  # the probe's run, with its healthy and active replicas at T
    exposed: Exposed
    version: str | None
    surge: Surge
    groups: list[tuple[str, int | None, Requirement | None]]
    retry: str
    fleets: list[_FleetState]
    reasons: list[str]
    past_incidents: int
    recommendation: str

    def service(self) -> ServiceExposure:
        row = self.row
        return ServiceExposure(
            server=row["server"],
            run_id=row["run_id"],
            project=row.get("project"),
            run_name=row.get("run_name") or "",
            as_of=row["as_of"],
            exposed=self.exposed,
            dstack_release=self.version,
            surge_capacity=self.surge,
            healthy_replicas=row.get("_healthy") or 0,
            active_replicas=row.get("_active") or 0,
            desired_replicas=row.get("desired_replica_count"),
            resources=[req.text() for _, _, req in self.groups if req is not None],
            retry=self.retry,
            fleets=[f.record() for f in self.fleets],
            reasons=self.reasons,
            past_incidents=self.past_incidents,
            recommendation=self.recommendation,
        )


def _assess_one(row: dict, fleets: list[dict], context: _Context) -> _Assessment:
    as_of: datetime = row["as_of"]
    server = row["server"]
    spec, groups = context.specs.of(row.get("placement_spec"))
    frames = context.frames
    version = frames.server_versions.get(server)
    exposed, exposed_why = judge_release(version)
    reasons = [exposed_why]
    submitted = row.get("submitted_at")
    age = (as_of - submitted).total_seconds() if submitted else None
    retry_text, fails_at_once = (
        retry_for_no_capacity(spec.get("retry"), age) if spec else ("retry policy unknown", False)
    )
    names = spec.get("fleets")
    if isinstance(names, list):
        wanted = {str(n).split("/")[-1] for n in names}
        fleets = [f for f in fleets if f["fleet_name"] in wanted]
    creation = str(spec.get("creation_policy") or "reuse-or-create")

    first = groups[0][2] if groups else None
    fleet_records = [_fleet_at(fleet, as_of, creation, first, context) for fleet in fleets]
    group_verdicts = [
        _group_surge(name, req, fleets, fleet_records, context, row, spec)
        for name, _wanted, req in groups or [("0", None, None)]
    ]

    if server not in frames.fleet_table_servers:
        surge: Surge = "unknown"
        reasons.append(
            "the sources hold no fleets and instances tables (an API export or a partial "
            "export): the fleet's room at T cannot be rebuilt"
        )
    elif not fleets:
        if row.get("fleet_id") is not None:
            surge = "unknown"
            reasons.append("the run's fleet is not in the fleets table")
        else:
            surge = "none"
            reasons.append(
                "no fleet the service can use exists at T: a new replica fails with "
                "'No matching fleet found'"
            )
    else:
        states = [v for v, _ in group_verdicts]
        surge = "none" if "none" in states else ("unknown" if "unknown" in states else "available")
        reasons.extend(text for _, text in group_verdicts)
    if row.get("fleet_id") is not None and fleets:
        reasons.append(
            "the run is placed in fleet "
            f"{fleets[0]['fleet_name']}: dstack places its new replicas only there"
        )
    reasons.append(retry_text)
    if spec and not groups:
        reasons.append("the run spec holds no resources: the fit of an idle instance is unknown")
    later = row.get("changed_later") or []
    if later:
        reasons.append(
            f"'Run updated' changed {', '.join(later)} after T: the run's final spec is not T's"
            + (
                f"; T's resources are those in {row['resources_from']}"
                if row.get("resources_from")
                else ""
            )
        )
        if not row["where_known"]:
            surge = "unknown"
    for promise in row.get("promised") or []:
        reasons.append(f"{promise}: it goes into the same fleet's room, maybe first")
        surge = "unknown" if surge == "available" else surge
    past = sum(
        1
        for when in context.incidents.get((server, row.get("project"), row.get("run_name")), [])
        if when <= as_of
    )
    healthy = row.get("_healthy") or 0
    return _Assessment(
        row=row,
        exposed=exposed,
        version=version,
        surge=surge,
        groups=groups,
        retry=retry_text,
        fleets=fleet_records,
        reasons=reasons,
        past_incidents=past,
        recommendation=_recommend(exposed, surge, healthy, fleet_records, fails_at_once),
    )


def _fleet_at(
    fleet: dict, as_of: datetime, creation: str, req: Requirement | None, context: _Context
) -> _FleetState:
    """One fleet at T: its instances alive then, busy or idle, and whether it can add a node
    (`can_create_new_cloud_instance_in_fleet`); fits shown for `req`."""
    key = (fleet["server"], fleet["fleet_id"], as_of, creation, req)
    if key in context.fleet_cache:
        return context.fleet_cache[key]
    mine = context.instances.get((fleet["server"], fleet["fleet_id"], as_of), [])
    count, remote = context.alive.get((fleet["server"], fleet["fleet_id"], as_of), (0, False))
    ssh = bool(fleet["ssh"]) or remote
    nodes_max = fleet["nodes_max"]
    low = fleet["nodes_min"] if fleet["nodes_min"] is not None else ""
    nodes = "ssh hosts" if ssh else f"{low}..{nodes_max if nodes_max is not None else ''}"
    if not fleet["nodes_known"]:
        nodes = (
            f"unknown at T: dstack refused a placement 'Fleet is at capacity' at "
            f"{fleet['nodes_refused_at']:%Y-%m-%d %H:%M:%S} with "
            f"{fleet['nodes_refused_active']} active instance(s), which the final nodes "
            f"{nodes} had room for (edited later, no event)"
        )
    record = _FleetState(
        fleet_id=fleet["fleet_id"],
        fleet_name=fleet["fleet_name"],
        nodes=nodes,
        nodes_known=fleet["nodes_known"],
        ssh=ssh,
        active_instances=count,
        instances=[
            {
                "instance_id": i["instance_id"],
                "instance_name": i["instance_name"],
                "state": "provisioning"
                if _provisioning(i, as_of)
                else ("busy" if i["busy_blocks"] >= (i["total_blocks"] or 1) else "idle"),
                "blocks": f"{i['busy_blocks']}/{i['total_blocks'] or 1}",
                "fits": False if _provisioning(i, as_of) else fits(req, i),
                "provenance": i["i_provenance"],
            }
            for i in mine
        ],
        can_add_node=not ssh
        and creation != "reuse"
        and (nodes_max is None or count < nodes_max)
        and fleet["nodes_known"],
        provenance=fleet["provenance"],
    )
    context.fleet_cache[key] = record
    return record


def _provisioning(instance: dict, as_of: datetime) -> bool:
    return instance["started_at"] is None or instance["started_at"] > as_of


def _incidents(findings: list[Finding]) -> dict[tuple, list[datetime]]:
    """Collateral findings by service (server, project, name): when each happened (the
    culprit's failure, else the first victim's stop)."""
    found: dict[tuple, list[datetime]] = {}
    for finding in findings:
        times = [c.failed_at for c in finding.culprits if c.failed_at] + [
            v.terminated_at for v in finding.victims if v.terminated_at
        ]
        if times:
            key = (finding.server, finding.project, finding.run_name)
            found.setdefault(key, []).append(min(times))
    return found


def _group_surge(
    name: str,
    req: Requirement | None,
    fleets: list[dict],
    fleet_records: list[_FleetState],
    context: _Context,
    row: dict,
    spec: dict,
) -> tuple[Surge, str]:
    """One replica group: an idle instance that fits, a fleet that can grow, or neither,
    once the other runs' queued jobs that dstack places first have taken theirs."""
    as_of = row["as_of"]
    names = {f["fleet_id"]: f["fleet_name"] for f in fleets}
    queue = queued_first(
        context.queued.get((row["server"], row.get("project"), as_of), []),
        row["run_id"],
        names,
        _priority(spec),
    )
    idle = reachable_idle(fleets, context.shapes, context.instance_names, as_of, len(queue))
    growth = {
        r.fleet_id: _headroom(r, fleet["nodes_max"])
        for r, fleet in zip(fleet_records, fleets, strict=True)
    }
    taken = place_queue(queue, idle, growth, names)
    before = f" ({'; '.join(taken)})" if taken else ""
    fits_unknown = False
    for inst in idle:
        fit = fits(req, inst)
        if fit and context.frames.narrowed:
            return "unknown", (
                f"group {name}: instance {inst['instance_name']} of fleet "
                f"{inst['fleet_name']} looks idle, but this audit read the jobs of some "
                "runs only (--partition, --project or --since): others may hold it"
            )
        if fit:
            return "available", (
                f"group {name}: instance {inst['instance_name']} of fleet "
                f"{inst['fleet_name']} has idle blocks that fit one more replica{before}"
            )
        fits_unknown = fits_unknown or fit is None
    unknown = None
    for record in (r for r in fleet_records if r.can_add_node and growth[r.fleet_id] > 0):
        verdict, text = _provider_room(name, req, record, context, row)
        if verdict == "available":
            return verdict, text + before
        unknown = unknown or (verdict, text + before)
    if unknown is not None:
        return unknown
    edited = [r for r in fleet_records if not r.nodes_known]
    if edited:
        return "unknown", f"group {name}: fleet {edited[0].fleet_name}'s nodes {edited[0].nodes}"
    if fits_unknown:
        return (
            "unknown",
            f"group {name}: idle instances exist but the service's resources are unknown" + before,
        )
    full = "; ".join(
        f"fleet {r.fleet_name}: "
        + (
            "an SSH fleet never provisions"
            if r.ssh
            else f"{r.active_instances} instance(s), nodes {r.nodes}"
        )
        for r in fleet_records
    )
    if taken:
        return "none", (
            f"group {name}: the room left goes to other runs' queued replicas first "
            f"({'; '.join(taken)}; {full}): the surge replica would fail with 'Fleet is at "
            "capacity'"
        )
    return "none", (
        f"group {name}: no idle instance fits one more replica and no fleet can add a node "
        f"({full}): the surge replica would fail with 'Fleet is at capacity'"
    )


def _priority(spec: dict) -> int:
    value = spec.get("priority")
    return value if isinstance(value, int) else 0  # RunModel.priority's default


def _headroom(record: _FleetState, nodes_max: int | None) -> float:
    """New nodes the fleet can still take (`can_create_new_cloud_instance_in_fleet`)."""
    if not record.can_add_node:
        return 0
    return float("inf") if nodes_max is None else nodes_max - record.active_instances


def _provider_room(
    name: str,
    req: Requirement | None,
    record: _FleetState,
    context: _Context,
    row: dict,
) -> tuple[Surge, str]:
    """A cloud fleet below its maximum: dstack asks the provider for a new node. `available`
    when the provider placed a fitting instance in this fleet before T and no placement was
    refused since; otherwise `unknown`."""
    as_of = row["as_of"]
    latest = context.latest.get((row["server"], record.fleet_id, as_of, req))
    since = latest["created_at"] if latest else None
    last = context.refusals.get((row["server"], row.get("project"), as_of))
    refused = last is not None and (since is None or last["stopped_at"] > since)
    room = f"fleet {record.fleet_name} can add a node ({record.active_instances} "
    room += f"instance(s), nodes {record.nodes})"
    if latest and not refused:
        return "available", (
            f"group {name}: {room}; {latest['backend']} placed a fitting instance in it at "
            f"{since:%Y-%m-%d %H:%M:%S} and refused nothing since (the provider's capacity "
            "at T itself is not in the evidence)"
        )
    if refused:
        message = last["termination_reason_message"]
        why = (
            f"the provider had no capacity for {last['job_name']} at "
            f"{last['stopped_at']:%Y-%m-%d %H:%M:%S}" + (f" ({message})" if message else "")
        )
    else:
        why = "no fitting instance was ever provisioned in it: the offers are unknown"
    return "unknown", f"group {name}: {room}, but a new node depends on the provider: {why}"


def _recommend(
    exposed: Exposed, surge: Surge, healthy: int, fleets: list[_FleetState], fails_at_once: bool
) -> str:
    if healthy == 0:
        return "no healthy replica at stake at T"
    if surge == "none":
        # a fleet at its limit, else one whose room other runs' queued jobs take first
        full = next((f for f in fleets if not f.can_add_node), None) or next(iter(fleets), None)
        if full is not None and full.ssh:
            return f"add a host to SSH fleet {full.fleet_name} (or free one) before the next apply"
        if full is not None:
            top = full.nodes.split("..")[-1]
            bigger = int(top) + 1 if top.isdigit() else None
            return (
                f"raise fleet {full.fleet_name}'s nodes maximum to {bigger} before the next apply"
                if bigger is not None
                else f"make room in fleet {full.fleet_name} before the next apply"
            )
        return "create a fleet the service can use before the next apply"
    if surge == "unknown":
        return "keep an idle instance that fits in the service's fleet before the next apply" + (
            "; a placement failure fails the run at once" if fails_at_once else ""
        )
    if exposed == "yes":
        return (
            f"room for the surge replica exists; a crashing new replica would still stop the "
            f"{healthy} healthy replica(s) (dstack #4186): watch the next apply"
        )
    return "room for the surge replica exists"


def exposure_report(audit, as_of: datetime | None = None) -> ExposureReport:
    """Every service running at `as_of` (default: the end of the evidence), assessed."""
    moment = as_of or audit.end_of_evidence
    limitations = [
        LimitationRecord(
            code="fleet_spec_as_last_recorded",
            message="fleet specs (nodes) are read as last recorded: an edit of a fleet's nodes "
            "range is not dated in the tables (unknown at T where a refusal 'Fleet is at "
            "capacity' contradicts the last recorded range)",
            source="exposure",
        )
    ]
    if moment is None:
        return ExposureReport(as_of=None, services=[], limitations=limitations)
    frames = frames_of(audit)
    missing = {s for s in set(audit.runs["server"]) if s not in frames.fleet_table_servers}
    for server in sorted(missing):
        limitations.append(
            LimitationRecord(
                code="no_fleet_tables",
                message="no fleets and instances tables for this server: surge capacity is "
                "unknown for its services",
                source=server,
            )
        )
    probes = running_services(audit.runs, audit.submissions, moment)
    services = assess_probes(frames, probes, audit.findings)
    services.sort(key=lambda s: (s.server, s.project or "", s.run_name, s.run_id))
    return ExposureReport(as_of=moment, services=services, limitations=limitations)


def frames_of(audit) -> Frames:
    evidence = audit.evidence
    return Frames(
        runs=audit.runs,
        submissions=audit.submissions,
        fleets=evidence.fleets,
        instances=evidence.instances,
        fleet_table_servers=evidence.fleet_table_servers,
        server_versions=evidence.server_versions,
        narrowed=evidence.narrowed,
        evidence_ends=audit._ends,  # worked out once per audit (Audit._ends)
        updates=audit.events.filter(pl.col("kind") == "run_updated"),
    )
