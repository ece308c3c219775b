"""Where a replica fits, and who is placed before it: the part of dstack's placement
(`background/pipeline_tasks/jobs_submitted.py`, `services/offers.py`) that both the exposure
forecast and the guard decide with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from analyzer.dstack import blocks_fit


@dataclass(frozen=True)
class Requirement:
    """One replica group's resources (dstack's ResourcesSpec: ranges with min/max)."""

    group: str
    cpu: tuple[float | None, float | None]
    memory_gb: tuple[float | None, float | None]
    gpus: tuple[float | None, float | None]
    gpu_names: tuple[str, ...]
    gpu_memory_gb: tuple[float | None, float | None]
    disk_gb: tuple[float | None, float | None]

    def text(self) -> str:
        def rng(name: str, pair: tuple[float | None, float | None], unit: str = "") -> str:
            low, high = pair
            if low is None and high is None:
                return ""
            show = [f"{v:g}{unit}" if v is not None else "" for v in (low, high)]
            return f"{name} {show[0]}..{show[1]}"

        names = f" {'/'.join(self.gpu_names)}" if self.gpu_names else ""
        parts = [
            rng("cpu", self.cpu),
            rng("memory", self.memory_gb, "GB"),
            rng("gpu" + names, self.gpus) if self.gpus != (0, None) else "",
            rng("gpu memory", self.gpu_memory_gb, "GB"),
            rng("disk", self.disk_gb, "GB"),
        ]
        return f"{self.group}: " + (", ".join(p for p in parts if p) or "any")

    def matches(self, cpus: int, memory_mib: int, gpus: int, gpu_name, gpu_mib, disk_mib) -> bool:
        def inside(value: float, pair: tuple[float | None, float | None]) -> bool:
            low, high = pair
            return (low is None or value >= low) and (high is None or value <= high)

        if not (inside(cpus, self.cpu) and inside(memory_mib / 1024, self.memory_gb)):
            return False
        if not inside(gpus, self.gpus):
            return False
        if disk_mib is not None and not inside(disk_mib / 1024, self.disk_gb):
            return False
        if gpus and self.gpu_names and (gpu_name or "").lower() not in self.gpu_names:
            return False
        return not gpus or gpu_mib is None or inside(gpu_mib / 1024, self.gpu_memory_gb)


def _range(value) -> tuple[float | None, float | None]:
    if value is None:
        return (None, None)
    if isinstance(value, int | float):
        return (float(value), float(value))
    if isinstance(value, dict):
        if "count" in value or "size" in value:
            return _range(value.get("count", value.get("size")))
        low, high = value.get("min"), value.get("max")
        return (
            float(low) if isinstance(low, int | float) else None,
            float(high) if isinstance(high, int | float) else None,
        )
    return (None, None)


def requirement(group: str, resources: dict | None) -> Requirement | None:
    if not isinstance(resources, dict):
        return None
    gpu = resources.get("gpu") if isinstance(resources.get("gpu"), dict) else {}
    names = gpu.get("name") or ()
    if isinstance(names, str):
        names = (names,)
    gpus = _range(gpu.get("count")) if gpu else (0.0, None)
    return Requirement(
        group=group,
        cpu=_range(resources.get("cpu")),
        memory_gb=_range(resources.get("memory")),
        gpus=gpus,
        gpu_names=tuple(str(n).lower() for n in names),
        gpu_memory_gb=_range(gpu.get("memory")),
        disk_gb=_range(resources.get("disk")),
    )


def groups_of(spec: dict) -> list[tuple[str, int | None, Requirement | None]]:
    """(group name, replicas wanted, resources) per replica group (reference 6.6): `groups`
    (0.22.x), a list under `replicas` (0.20.7-0.21.x), else the one implicit group "0"."""
    listed = spec.get("groups")
    if not isinstance(listed, list) and isinstance(spec.get("replicas"), list):
        listed = spec["replicas"]
    base = spec.get("resources")
    if isinstance(listed, list) and listed:
        found = []
        for index, item in enumerate(g for g in listed if isinstance(g, dict)):
            name = str(item.get("name") or index)
            wanted = _range(item.get("replicas") if "replicas" in item else item.get("count"))[0]
            found.append(
                (
                    name,
                    int(wanted) if wanted is not None else None,
                    requirement(name, item.get("resources") or base),
                )
            )
        return found
    replicas = spec.get("replicas")
    wanted = _range(replicas)[0] if replicas is not None else 1.0
    return [("0", int(wanted) if wanted is not None else None, requirement("0", base))]


def parse_spec(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# What decides whether an instance takes one more replica at T (`_fits`, `_provisioning`).
SHAPE = (
    "cpus",
    "memory_mib",
    "gpus",
    "gpu_name",
    "gpu_memory_mib",
    "disk_mib",
    "total_blocks",
    "busy_blocks",
)
STATIC_SHAPE = SHAPE[:-1]  # all but the busy blocks: what an instance is, not what it holds


def running_sum(column: str, by: str) -> pl.Expr:
    """`column`'s running sum within each run of equal `by` values (rows ordered by `by`):
    the running sum of every row less its value before the run's first row (a window
    `over(by)` hashes every row of the group again)."""
    total = pl.col(column).cum_sum()
    first = (pl.col(by) != pl.col(by).shift(1)).fill_null(True)
    return total - pl.when(first).then(total - pl.col(column)).forward_fill()


def spans_at(
    moments: pl.DataFrame, spans: pl.DataFrame, by: tuple[str, ...], start: str, end: str
) -> pl.DataFrame:
    """Each moment (`by` and `as_of`; `_moment`, its row) with every span of the same `by`
    that holds then: begun by `as_of` (a span with no start never holds) and ended after it,
    or not ended. One inequality join (polars' IEJoin) on keys that order by group, then by
    time, so its rows are only those alive then, not every span of the group per moment.
    Rows (`_moment` and the spans' columns but `by`) in no order. Few moments and spans (at
    most SMALL_JOIN pairs): each moment joined with its group's spans and filtered, which
    costs a tenth of ranking the times."""
    if _pairs(moments, spans, by) <= SMALL_JOIN:
        return _spans_joined(moments, spans, by, start, end)
    groups = moments.lazy().select(by).unique(maintain_order=True).with_row_index("_group")
    moments_of, spans_of = (
        moments.lazy()
        .select(*by, "as_of")
        .with_row_index("_moment")
        .join(groups, on=list(by))
        .select("_moment", "_group", "as_of"),
        spans.lazy().filter(pl.col(start).is_not_null()).join(groups, on=list(by)).drop(by),
    )
    # times ranked: comparing ranks is comparing times, and each group's ranks lie in a block
    # of their own above the previous group's (an open end is the top of its block)
    times = (
        pl.concat(
            [
                moments_of.select(pl.col("as_of").alias("t")),
                spans_of.select(pl.col(start).alias("t")),
                spans_of.select(pl.col(end).alias("t")),
            ]
        )
        .drop_nulls()
        .unique()
        .sort("t")
        .collect()["t"]
    )
    width = times.len() + 1

    def key(column: str) -> pl.Expr:
        rank = pl.lit(times).search_sorted(pl.col(column)).cast(pl.Int64)
        return pl.col("_group").cast(pl.Int64) * width + pl.when(pl.col(column).is_null()).then(
            times.len()
        ).otherwise(rank)

    return (
        moments_of.select("_moment", key("as_of").alias("_at"))
        .join_where(
            spans_of.with_columns(key(start).alias("_from"), key(end).alias("_until")).drop(
                "_group"
            ),
            pl.col("_from") <= pl.col("_at"),
            pl.col("_until") > pl.col("_at"),
        )
        .drop("_at", "_from", "_until")
        .collect()
    )


SMALL_JOIN = 100_000  # moments x spans: at most this many pairs are compared directly


def _spans_joined(
    moments: pl.DataFrame, spans: pl.DataFrame, by: tuple[str, ...], start: str, end: str
) -> pl.DataFrame:
    """`spans_at` as a join on `by` and a filter (its rows in the same columns), step by step:
    on frames this small, each eager step costs less than planning one lazy query."""
    at = "\x00as_of"  # beside the spans' own columns
    return (
        moments.select(*by, pl.col("as_of").alias(at))
        .with_row_index("_moment")
        .join(spans.filter(pl.col(start).is_not_null()), on=list(by))
        .filter(
            (pl.col(start) <= pl.col(at)) & (pl.col(end).is_null() | (pl.col(end) > pl.col(at)))
        )
        .drop(*by, at)
    )


def queued_at(
    runs: pl.DataFrame, submissions: pl.DataFrame, probes: pl.DataFrame
) -> dict[tuple, list[Queued]]:
    """Per (server, project, as_of) of the probes: the jobs of the project waiting in dstack's
    queue then, in timeline order: created by T, and SUBMITTED at T (they left it after T, or
    are still in it at the end of the evidence), not stopped by T."""
    moments = (
        probes.join(runs.select("server", "run_id", "project"), on=["server", "run_id"], how="left")
        .select("server", "project", "as_of")
        .unique()
    )
    # a job waits from its creation until it leaves the queue or stops, whichever is first;
    # one that left it at no known time waits only while it is still SUBMITTED
    jobs = (
        submissions.with_row_index("_row")
        .filter(pl.col("left_queue_at").is_not_null() | (pl.col("status") == "submitted"))
        .select(
            "server",
            "run_id",
            "job_name",
            "replica_group",
            "created_at",
            "_row",
            pl.min_horizontal("stopped_at", "left_queue_at").alias("_waits_until"),
        )
        .join(
            runs.select("server", "run_id", "project", "run_name", "fleet_id", "placement_spec"),
            on=["server", "run_id"],
        )
    )
    waiting = (
        spans_at(moments, jobs, ("server", "project"), start="created_at", end="_waits_until")
        .sort("_moment", "_row")
        .join(moments.with_row_index("_moment"), on="_moment", maintain_order="left")
    )
    queued: dict[tuple, list[Queued]] = {}
    shapes: dict[str | None, tuple] = {}  # a run's placement, read once per run spec
    for job in waiting.iter_rows(named=True):
        text = job["placement_spec"]
        if text not in shapes:
            spec = parse_spec(text) or {}
            names = spec.get("fleets")
            priority = spec.get("priority")
            shapes[text] = (
                {group: req for group, _, req in groups_of(spec)} if spec else {},
                frozenset(str(n).split("/")[-1] for n in names)
                if isinstance(names, list)
                else None,
                priority if isinstance(priority, int) else 0,
            )
        groups, fleet_names, priority = shapes[text]
        queued.setdefault((job["server"], job["project"], job["as_of"]), []).append(
            Queued(
                run_id=job["run_id"],
                run_name=job["run_name"],
                job_name=job["job_name"],
                fleet_id=job["fleet_id"],
                fleet_names=fleet_names,
                priority=priority,
                requirement=groups.get(job["replica_group"] or "0")
                or next(iter(groups.values()), None),
                since=job["created_at"],
            )
        )
    return queued


def fits(req: Requirement | None, inst: dict) -> bool | None:
    """Whether the instance's idle blocks hold one replica of `req` (dstack takes the smallest
    share of blocks that matches, and uses it when that many blocks are idle)."""
    if req is None or inst["cpus"] is None or inst["memory_mib"] is None:
        return None
    return blocks_fit(req, *(inst[name] for name in SHAPE))


@dataclass(frozen=True)
class Queued:
    """A job waiting in dstack's queue at T: SUBMITTED, not yet placed on an instance."""

    run_id: str
    run_name: str | None
    job_name: str | None
    fleet_id: str | None  # its run's fleet (`runs.fleet_id`), None while the run has none
    fleet_names: frozenset[str] | None  # the run spec's `fleets` (None: any fleet)
    priority: int
    requirement: Requirement | None
    since: datetime | None


def queued_first(
    queued: list[Queued], run_id: str, fleets: dict[str, str | None], priority: int
) -> list[Queued]:
    """The other runs' queued jobs that dstack places before a replica submitted at T, in the
    order it places them, among those that can go to one of `fleets` (id -> name).

    `JobSubmittedFetcher.fetch` (`pipeline_tasks/jobs_submitted.py`) takes SUBMITTED jobs by
    run priority, highest first, then by `last_processed_at`, oldest first: a job queued
    before T of a run with the same or a higher priority goes first. It can use its run's
    fleet, or, while its run has none, the project's fleets its `fleets` names allow
    (`services/runs/plan.py::get_run_candidate_fleet_models_filters`)."""

    def can_use(job: Queued) -> bool:
        if job.fleet_id is not None:
            return job.fleet_id in fleets
        return job.fleet_names is None or any(n in job.fleet_names for n in fleets.values())

    chosen = [q for q in queued if q.run_id != run_id and q.priority >= priority and can_use(q)]
    return sorted(chosen, key=lambda q: (-q.priority, q.since or datetime.min.replace(tzinfo=UTC)))


def blocks_needed(req: Requirement | None, inst: dict) -> int:
    """The blocks of `inst` one job of `req` takes (the smallest share that matches; one
    when its resources are unknown)."""
    total = max(inst["total_blocks"] or 1, 1)
    if req is None or inst["cpus"] is None or inst["memory_mib"] is None:
        return 1
    share = (inst["cpus"] // total, inst["memory_mib"] // total, (inst["gpus"] or 0) // total)
    for blocks in range(1, total + 1):
        parts = (part * blocks for part in share)
        if req.matches(*parts, inst["gpu_name"], inst["gpu_memory_mib"], inst["disk_mib"]):
            return blocks
    return total + 1


def reachable_idle(
    fleets: list[dict],
    shapes: dict[tuple, list[dict]],
    names: list[str | None],
    as_of: datetime,
    queued: int,
) -> list[dict]:
    """The idle instances of `fleets` at `as_of` (`shapes`: each fleet's distinct instance
    shapes then, each with its instances' `rows`; `names`: the instances' names by row) that
    the `queued` jobs placed first and then a surge replica may take, in the order dstack tries
    them. The instances of one shape (kind and busy blocks at T) are alike but for their name,
    and a queued job takes at most one instance, the first it fits (`place_queue`): of a shape's
    instances, only the first `queued + 1` can be reached, since one of them is left untaken
    and stands for every one after it, so only those are listed (at 100k runs, a probe listed
    every instance of its fleets again). With no queue, one a shape, named by its first."""
    return [
        {**inst, "fleet_name": fleet["fleet_name"], "fleet_id": fleet["fleet_id"]}
        | ({"instance_name": names[each]} if queued else {})
        for fleet in fleets
        for inst in shapes.get((fleet["server"], fleet["fleet_id"], as_of), [])
        if not inst["provisioning"]
        for each in inst["rows"][: queued + 1]
    ]


def place_queue(
    queue: list[Queued], idle: list[dict], growth: dict[str, float], names: dict[str, str | None]
) -> list[str]:
    """Place each queued job as dstack would, before the surge replica: the first idle
    instance it fits (`get_shared_instances_with_offers`), else a new node in a fleet that
    can grow. `idle` and `growth` are updated; one text per job that took something."""
    taken = []
    for job in queue:
        mine = [i for i in idle if job.fleet_id in (None, i["fleet_id"])]
        where = next((i for i in mine if fits(job.requirement, i) is not False), None)
        who = f"run {job.run_name}'s queued {job.job_name or 'job'}"
        if job.since is not None:
            who += f" (SUBMITTED since {job.since:%Y-%m-%d %H:%M:%S})"
        if where is not None:
            where["busy_blocks"] += blocks_needed(job.requirement, where)
            if where["busy_blocks"] >= max(where["total_blocks"] or 1, 1):
                idle.remove(where)
            taken.append(f"{who} takes instance {where['instance_name']} first")
            continue
        grows = [f for f in growth if growth[f] > 0 and job.fleet_id in (None, f)]
        if grows:
            growth[grows[0]] -= 1
            taken.append(f"{who} takes a new node of fleet {names.get(grows[0])} first")
    return taken


PLACED_COLUMNS = (
    "server",
    "fleet_id",
    "run_id",
    "job_id",
    "job_name",
    "deployment_num",
    "instance_name",
    "created_at",
    "stopped_at",
    "health",
    "health_proof",
)
"""What `placed_jobs` says of each job placed, beside its place (`_job`) and its run's name."""


def placed_jobs(subs: pl.DataFrame, runs: pl.DataFrame, ties: Sequence[str] = ()) -> pl.DataFrame:
    """The jobs placed on an instance (`instance_id` kept after release:
    jobs.used_instance_id), in the order they were placed (`_job`), each with its fleet
    (`fleet_id`: jobs.fleet_id, else its instance's) and its run's name: who can have held a
    fleet's room (`holders_at`). `ties`: columns of `subs` that order jobs placed at once as
    `subs` sorted by them would (the merge of partitions holds its jobs unsorted)."""
    # read to pick or order the rows, not said: dropped once they have
    helpers = [c for c in dict.fromkeys((*ties, "instance_id")) if c not in PLACED_COLUMNS]
    # the columns picked before the rows: a filter of the whole frame copies every column
    # (the merge of 100k runs' partitions: 154 MB of RSS for this frame of 43 MB, now 93 MB)
    return (
        subs.select(*PLACED_COLUMNS, *helpers)
        .filter(pl.col("instance_id").is_not_null() & pl.col("created_at").is_not_null())
        .sort("created_at", "job_id", *ties)
        .drop(helpers)
        .with_row_index("_job")
        .join(
            runs.select("server", "run_id", "run_name"),
            on=["server", "run_id"],
            how="left",
            maintain_order="left",
        )
    )


def holders_at(failures: pl.DataFrame, placed: pl.DataFrame, first: int) -> pl.DataFrame:
    """Who held the room when a placement was refused for lack of it: per failure `i` (its
    rows: `server`, `fleet_id`, `as_of`, `own`, the failing run's id, and any other
    columns), the `first` of the `placed` jobs (placed_jobs) on an instance of that fleet
    and not yet stopped then, other runs' first (the neighbour that held the room), then the
    earliest placed; each with its run, since when it held it, until when, its final health,
    its `rank` and `of`, how many held the room. dstack places a replica only on idle blocks
    or a new instance below `nodes.max` (jobs_submitted.py); these held the rest. A busy
    fleet's holders at a failure grow with the fleet's traffic, and failures with the runs:
    the holders are counted (placed by T less stopped by T) and only the named ones found
    (`_first_alive`), never listed per failure."""
    moments = failures.with_row_index("_moment")
    ranked = _ranked(moments, placed, first)
    return (
        ranked.join(moments.drop("i"), on="_moment")
        .join(placed.drop("server", "fleet_id"), on="_job")
        .sort("i", "rank")
        .drop("_moment", "_job")
    )


def _ranked(moments: pl.DataFrame, held: pl.DataFrame, first: int) -> pl.DataFrame:
    """holders_at's ranking of the failures (`moments`, each with its `_moment`): per failure
    `i`, its first holders (other runs' first, then by placement: `_job`), each's `rank`, and
    `of`, how many held the room (`count_at`)."""
    # a fleet by its identity: names repeat across projects (unique only in one project)
    by = ("server", "fleet_id")
    if _pairs(moments, held, by) <= SMALL_JOIN:
        return _ranked_joined(moments, held, first)
    groups = moments.select(by).unique(maintain_order=True).with_row_index("_group")
    spans = held.join(groups, on=by).sort("_group", "_job")
    asked = moments.join(groups, on=by, maintain_order="left")
    clock = _Clock(spans["created_at"], asked["as_of"], spans["stopped_at"])
    placed = clock.key(spans["_group"], spans["created_at"])  # sorted: in placement order
    at = clock.key(asked["_group"], asked["as_of"])
    begin = clock.key(asked["_group"])
    # an open end (never stopped) is above every time: the top of the ranks
    until = clock.key(pl.Series([0] * spans.height), spans["stopped_at"])
    found = _first_alive(
        until.fill_null(clock.width),
        spans["run_id"],
        pl.DataFrame(
            {
                "_moment": asked["_moment"],
                "at": at - begin,
                "run": asked["own"],
                "start": placed.search_sorted(begin, side="left").cast(pl.Int64),
                "bound": placed.search_sorted(at, side="right").cast(pl.Int64),
            }
        ),
        first,
    )
    counted = moments.select(
        "i", "_moment", of=count_at(moments, held, by, "created_at", "stopped_at")
    )
    return (
        found.sort("_moment", "own", "_pos")
        .group_by("_moment", maintain_order=True)
        .head(first)
        .join(counted, on="_moment", maintain_order="left")
        .select(
            "i",
            "of",
            pl.int_range(pl.len()).over("_moment").alias("rank"),
            "_moment",
            pl.lit(spans["_job"]).gather(pl.col("_pos")).cast(pl.UInt32).alias("_job"),
        )
        .sort("i", "rank")
    )


def _pairs(moments: pl.DataFrame, spans: pl.DataFrame, by: tuple[str, ...]) -> int:
    """How many (moment, span) pairs share their `by`: the rows a join on it makes (at most
    moments x spans; counted by group only when that bound is above SMALL_JOIN)."""
    bound = moments.height * spans.height
    if bound <= SMALL_JOIN:
        return bound
    return (
        moments.group_by(by)
        .len()
        .join(spans.group_by(by).len(), on=list(by))
        .select((pl.col("len").cast(pl.Int64) * pl.col("len_right")).sum())
        .item()
    )


def _ranked_joined(moments: pl.DataFrame, held: pl.DataFrame, first: int) -> pl.DataFrame:
    """`_ranked` of few pairs (at most SMALL_JOIN moments x jobs of one fleet), its rows in
    the same order: each moment joined with its fleet's jobs alive then (placed by T and not
    stopped by T), other runs' first, each in placement order; six eager steps where the
    descent runs a hundred queries (a job's `_job` is its placement order, as its position
    is in the descent)."""
    at = pl.col("as_of")
    alive = (
        moments.select("i", "_moment", "server", "fleet_id", "as_of", "own")
        .join(
            held.select("server", "fleet_id", "_job", "run_id", "created_at", "stopped_at"),
            on=["server", "fleet_id"],
        )
        .filter(
            (pl.col("created_at") <= at)
            & (pl.col("stopped_at").is_null() | (pl.col("stopped_at") > at))
        )
        .select(
            "i",
            "_moment",
            "_job",
            (pl.col("run_id") == pl.col("own")).fill_null(False).alias("own"),
        )
    )
    return (
        alive.sort("_moment", "own", "_job")
        .group_by("_moment", maintain_order=True)
        .head(first)
        .join(
            alive.group_by("_moment").agg(pl.len().alias("of")), on="_moment", maintain_order="left"
        )
        .select(
            "i",
            "of",
            pl.int_range(pl.len()).over("_moment").alias("rank"),
            "_moment",
            pl.col("_job").cast(pl.UInt32),
        )
        .sort("i", "rank")
    )


class _Clock:
    """Times as their ranks among every time asked about (as spans_at compares them), each
    group's in a block of its own above the previous group's: comparing two keys is
    comparing (group, time), and a group's spans are one sorted run of keys."""

    def __init__(self, start: pl.Series, *times: pl.Series) -> None:
        self.times = (
            pl.concat([start, *(t.cast(start.dtype) for t in times)]).drop_nulls().unique().sort()
        )
        self.width = self.times.len() + 1

    def key(self, groups: pl.Series, when: pl.Series | None = None) -> pl.Series:
        """Each (group, time)'s key (null for a null time); with no time, where the group's
        block begins."""
        base = groups.cast(pl.Int64) * self.width
        if when is None:
            return base
        rank = self.times.search_sorted(when.cast(self.times.dtype)).cast(pl.Int64)
        return pl.select(pl.when(when.is_not_null()).then(base + rank)).to_series()


def count_at(
    moments: pl.DataFrame, spans: pl.DataFrame, by: tuple[str, ...], start: str, end: str
) -> pl.Series:
    """How many of the spans of each moment's `by` hold at its `as_of` (as spans_at finds
    them), in the moments' order: those begun by then less those also ended by then, by two
    sorted searches per moment, never a row per (moment, span). A span that ends before it
    begins never holds: it ends as it begins. Few pairs (at most SMALL_JOIN): counted of a
    join (0.7 ms against 2.1 ms for a 20-run server's refusals, 2.4-3.5 ms against 3.6 ms for
    a 2k-run server's 88k pairs)."""
    if _pairs(moments, spans, by) <= SMALL_JOIN:
        return _count_joined(moments, spans, by, start, end)
    groups = moments.select(by).unique(maintain_order=True).with_row_index("_group")
    asked = moments.select(*by, "as_of").join(groups, on=by, how="left", maintain_order="left")
    spans = spans.filter(pl.col(start).is_not_null()).join(groups, on=by)
    clock = _Clock(spans[start], asked["as_of"], spans[end])
    ended = spans.filter(pl.col(end).is_not_null())
    begun = clock.key(spans["_group"], spans[start]).sort()
    gone = clock.key(ended["_group"], ended.select(pl.max_horizontal(end, start)).to_series())
    gone = gone.sort()
    # a moment of no group or no time: its keys below every span's, nothing held
    at = clock.key(asked["_group"], asked["as_of"])
    begin = pl.select(pl.when(at.is_not_null()).then(clock.key(asked["_group"]))).to_series()
    at, begin = at.fill_null(-1), begin.fill_null(0)

    def held(keys: pl.Series) -> pl.Series:
        return keys.search_sorted(at, side="right").cast(pl.Int64) - keys.search_sorted(
            begin, side="left"
        ).cast(pl.Int64)

    return (held(begun) - held(gone)).cast(pl.UInt32).alias("count")


def _count_joined(
    moments: pl.DataFrame, spans: pl.DataFrame, by: tuple[str, ...], start: str, end: str
) -> pl.Series:
    """`count_at` as a join on `by`, a filter and a count per moment (a moment of no group
    or no time holds nothing)."""
    at = "\x00as_of"  # beside the spans' own columns
    asked = moments.select(*by, pl.col("as_of").alias(at)).with_row_index("_moment")
    held = (
        asked.join(spans.select(*by, start, end), on=list(by))
        .filter(
            (pl.col(start) <= pl.col(at)) & (pl.col(end).is_null() | (pl.col(end) > pl.col(at)))
        )
        .group_by("_moment")
        .len()
    )
    counted = asked.select("_moment").join(held, on="_moment", how="left", maintain_order="left")
    return counted["len"].fill_null(0).cast(pl.UInt32).alias("count")


def _first_alive(
    until: pl.Series, run_ids: pl.Series, asked: pl.DataFrame, first: int
) -> pl.DataFrame:
    """Per failure (`asked`: its `_moment`, its time `at`, its `run`, and the positions
    [`start`, `bound`) of its fleet's jobs placed by then), the positions of the jobs alive
    then (ended `until` after `at`), in placement order, until `first` of other runs are
    found (the failing run's own come after them all). Each next one by a binary descent
    over the maxima of `until` in blocks of 2, 4, 8... positions: a few steps per holder
    named, whatever the fleet's traffic."""
    size = until.len()
    maxima = [until]
    while (1 << len(maxima)) <= size:
        step = 1 << (len(maxima) - 1)
        last = maxima[-1]
        maxima.append(
            pl.select(pl.max_horizontal(last, last.shift(-step, fill_value=last.min()))).to_series()
        )
    found = [pl.DataFrame(schema={"_moment": pl.UInt32, "own": pl.Boolean, "_pos": pl.Int64})]
    # a fleet with no job placed by T: no holder, none to look for
    active = asked.filter(pl.col("start") < pl.col("bound")).with_columns(
        others=pl.lit(0, pl.Int64)
    )
    while not active.is_empty():
        at, pos = active["at"], active["start"]
        for level in reversed(range(len(maxima))):
            # past the end: the last block (Series.clip would run a query per level)
            inside = pos < size
            block = maxima[level].gather(pos.zip_with(inside, pos * 0 + (size - 1)))
            pos = pos + (inside & (block <= at)).cast(pl.Int64) * (1 << level)
        active = active.with_columns(_pos=pos).filter(pl.col("_pos") < pl.col("bound"))
        own = (
            pl.lit(run_ids).gather(pl.col("_pos")).eq_missing(pl.col("run"))
            & pl.col("run").is_not_null()
        )
        active = active.with_columns(own=own, others=pl.col("others") + (~own).cast(pl.Int64))
        found.append(active.select("_moment", "own", "_pos"))
        active = active.filter(pl.col("others") < first).with_columns(start=pl.col("_pos") + 1)
    return pl.concat(found)
