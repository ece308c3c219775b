"""The capacity foresight of a finding (its `capacity_foresight`): the surge capacity of
its fleet(s) as of just before the update that started the failing deployment, the same
computation as `dstack-audit exposure --as-of` that moment (analyzer.pipeline.exposure), for
the spec that update put in force (the surge replica's, from the spec history:
analyzer.pipeline.specs)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import polars as pl

from analyzer.contract import CapacityForesight, Finding
from analyzer.pipeline.chain import known
from analyzer.pipeline.exposure import BEFORE_UPDATE, NO_CAPACITY, Frames, assess_states
from analyzer.pipeline.placement import holders_at, placed_jobs

DATELESS = CapacityForesight(
    as_of=None,
    surge_capacity="unknown",
    foreseeable=None,
    reasons=["the update's date is unknown (a rich log alone gives times of day only)"],
)


def wanted_findings(findings: list[Finding]) -> list[Finding]:
    """The findings whose culprit failed for lack of capacity: those the foresight speaks of."""
    return [f for f in findings if any(c.termination_reason == NO_CAPACITY for c in f.culprits)]


def foresight(
    frames: Frames,
    findings: list[Finding],
    deployments: pl.DataFrame,
    dateless: set[tuple[str, str]] = frozenset(),
    holders: dict[tuple, list[str]] | None = None,
) -> list[Finding]:
    """Each finding whose culprit failed for lack of capacity, with the surge capacity as of
    just before the update that started the failing deployment (unknown for the `dateless`
    (server, run id) pairs: no date places the update among the tables' times); who held the
    room, `holders` when given (capacity_holders of these findings or more)."""
    wanted = wanted_findings(findings)
    if not wanted:
        return findings
    asked = [
        (
            finding.server,
            finding.run_id,
            next(c for c in finding.culprits if c.termination_reason == NO_CAPACITY).deployment_num,
        )
        for finding in wanted
        if (finding.server, finding.run_id) not in dateless
    ]
    key = ["server", "run_id", "deployment_num"]
    probes = (
        pl.DataFrame(
            asked,
            schema={
                "server": pl.String,
                "run_id": pl.String,
                "deployment_num": deployments.schema["deployment_num"],
            },
            orient="row",
        )
        .join(
            deployments.select(*key, pl.coalesce("began_at", "first_job_at").alias("began")),
            on=key,
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        .drop_nulls("began")
        .select(
            "server",
            "run_id",
            (pl.col("began") - BEFORE_UPDATE).cast(pl.Datetime("us", "UTC")).alias("as_of"),
            # the surge replica runs the spec the update put in force (specs.run_spec_at)
            pl.col("began").cast(pl.Datetime("us", "UTC")).alias("spec_as_of"),
        )
        .unique(maintain_order=True)
    )
    states = {
        (a.row["server"], a.row["run_id"]): a
        for a in assess_states(frames, probes, [], detail=False)
    }
    if holders is None:
        holders = capacity_holders(wanted, frames)
    updated = []
    for finding in findings:
        state = states.get((finding.server, finding.run_id))
        no_capacity = any(c.termination_reason == NO_CAPACITY for c in finding.culprits)
        if no_capacity and (finding.server, finding.run_id) in dateless:
            updated.append(finding.model_copy(update={"capacity_foresight": DATELESS}))
            continue
        if state is None or not no_capacity:
            updated.append(finding)
            continue
        reasons = [*state.reasons[1:], *holders.get((finding.server, finding.run_id), [])]
        update: dict = {
            "capacity_foresight": CapacityForesight(
                as_of=state.row["as_of"],
                surge_capacity=state.surge,
                foreseeable={"none": True, "available": False}.get(state.surge),
                reasons=reasons,
            )
        }
        root = _root_cause_naming_the_queue(finding, state.surge, reasons)
        if root is not None:
            update["root_cause"] = root
        updated.append(finding.model_copy(update=update))
    return updated


@dataclass
class RowKeys:
    """The rows of a merge's whole frames, their keys as integers, found once for every chunk
    of findings (facts_of): a chunk's rows are picked by integer look-ups, not by joins on the
    texts of every row of every partition. A key's code is that of its (server, value) pair,
    a null value's too (facts_of matches a null with a null), but a null project's: null."""

    runs: pl.DataFrame  # per run: _run, _project (null: no project), _fleet
    submissions: pl.DataFrame  # per job: _run, _instance, _fleet, _unheld (its run not held)
    instances: pl.DataFrame  # per instance: _fleet
    updates: pl.DataFrame | None  # per update: _run
    codes: dict[str, pl.DataFrame]  # "run_id", "project", "fleet_id": server, value, its code

    def code_of(self, column: str, rows: pl.DataFrame) -> pl.Series:
        """The codes of `rows` (server and `column`), those the frames hold."""
        return rows.join(self.codes[column], on=["server", column], how="inner")[_CODE[column]]


def row_keys(frames: Frames) -> RowKeys:
    """`frames`' RowKeys."""
    runs, subs, instances, updates = (
        frames.runs,
        frames.submissions,
        frames.instances,
        frames.updates,
    )
    named = {
        "run_id": [runs, subs, *([updates] if updates is not None else [])],
        "project": [runs],
        "fleet_id": [f for f in (runs, subs, instances, frames.fleets) if "fleet_id" in f.columns],
        "instance_id": [subs, instances],
    }
    # a run of no project is kept for every chunk (facts_of): its project's code is null
    codes = {
        column: pl.concat([f.select("server", column) for f in frames_with])
        .unique()
        .filter(pl.col(column).is_not_null() if column == "project" else pl.lit(True))
        .with_row_index(_CODE[column])
        .with_columns(pl.col(_CODE[column]).cast(pl.Int64))
        for column, frames_with in named.items()
    }

    def coded(frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
        out = frame.select("server", *columns)
        for column in columns:
            out = out.join(
                codes[column],
                on=["server", column],
                how="left",
                nulls_equal=True,
                maintain_order="left",
            )
        return out.select(_CODE[c] for c in columns)

    held = runs.select("server", "run_id").unique().with_columns(pl.lit(False).alias("_unheld"))
    unheld = (
        subs.select("server", "run_id")
        .join(held, on=["server", "run_id"], how="left", maintain_order="left")
        .select(pl.col("_unheld").fill_null(True))
    )
    return RowKeys(
        runs=coded(runs, "run_id", "project", "fleet_id"),
        submissions=pl.concat(
            [
                coded(
                    subs, "run_id", "instance_id", *(["fleet_id"] * ("fleet_id" in subs.columns))
                ),
                unheld,
            ],
            how="horizontal",
        ),
        instances=coded(instances, "instance_id", "fleet_id"),
        updates=coded(updates, "run_id") if updates is not None else None,
        codes={column: codes[column] for column in ("run_id", "project", "fleet_id")},
    )


_CODE = {"run_id": "_run", "project": "_project", "fleet_id": "_fleet", "instance_id": "_instance"}


def facts_of(frames: Frames, findings: list[Finding], keys: RowKeys | None = None) -> Frames:
    """The rows of `frames` that can change the foresight of `findings` (whole runs'
    findings), every other row left out: a merge asks it a chunk of findings at a time, and
    each chunk read every job of every partition. Kept, by what `assess_states` and the
    specs read (a superset: a row that matches nothing is never seen): the fleets of the
    findings' runs' projects (candidate fleets are the project's: plan.py) and their
    instances; the runs of those projects, of no project, or placed in one of those fleets
    or their own (promised surges: specs.promised_surges), and their updates; their jobs,
    the jobs of runs the tables do not hold (a refusal of no known project), and the jobs on
    those instances (blocks held) or in those fleets (refused 'Fleet is at capacity':
    specs.nodes_contradicted), with their runs. Who held the room (`capacity_holders`) is
    read from `frames.placed`, left whole: found once per merge, for every finding. Rows are
    picked by their `keys` (row_keys of `frames`, given when asked again and again)."""
    wanted = wanted_findings(findings)
    if not wanted:
        return frames
    keys = keys or row_keys(frames)
    asked = keys.code_of(
        "run_id",
        pl.DataFrame(
            [(f.server, f.run_id) for f in wanted],
            schema={"server": pl.String, "run_id": pl.String},
            orient="row",
        ),
    )
    runs, subs = frames.runs, frames.submissions
    own = runs.filter(_among(keys.runs["_run"], asked))
    projects = own.select("server", "project").drop_nulls().unique()
    fleets = frames.fleets.join(projects, on=["server", "project"], how="semi")
    fleet_ids = pl.concat(
        [fleets.select("server", "fleet_id"), own.select("server", "fleet_id")]
    ).drop_nulls()
    in_fleets = keys.code_of("fleet_id", fleet_ids)
    in_projects = keys.code_of("project", projects)
    on_instances = _among(keys.instances["_fleet"], in_fleets)
    instances = frames.instances.filter(on_instances)
    by_run = keys.runs
    kept = by_run.filter(
        by_run["_project"].is_null()
        | _among(by_run["_project"], in_projects)
        | _among(by_run["_fleet"], in_fleets)
    )["_run"]
    by_job = keys.submissions
    jobs = (
        _among(by_job["_run"], kept)
        | by_job["_unheld"]
        | _among(by_job["_instance"], keys.instances.filter(on_instances)["_instance"])
    )
    if "_fleet" in by_job.columns:
        jobs = jobs | _among(by_job["_fleet"], in_fleets)
    subs = subs.filter(jobs)
    runs = runs.filter(_among(by_run["_run"], pl.concat([kept, by_job.filter(jobs)["_run"]])))
    updates = frames.updates
    if keys.updates is not None:
        updates = updates.filter(_among(keys.updates["_run"], pl.concat([kept, asked])))
    return replace(
        frames, runs=runs, submissions=subs, fleets=fleets, instances=instances, updates=updates
    )


def _among(codes: pl.Series, wanted: pl.Series) -> pl.Series:
    """Whether each of `codes` is one of `wanted` (null for a null code)."""
    return codes.is_in(wanted.implode())


HOLDERS_NAMED = 3  # per finding: the jobs that held the room, the rest counted


def capacity_holders(findings: list[Finding], frames: Frames) -> dict[tuple, list[str]]:
    """Per finding whose culprit was refused 'Fleet is at capacity': who held the fleet's room
    at that moment (placement.holders_at), named with its run, since when and until when, and
    its final health; this run's own replicas included."""
    failures = pl.DataFrame(
        [
            {
                "i": i,
                "server": f.server,
                "fleet_name": name,
                "as_of": c.failed_at,
                "own": f.run_id,
            }
            for i, f in enumerate(findings)
            for c in f.culprits[:1]
            if c.failed_at is not None
            and "fleet is at capacity" in (c.termination_reason_message or "").lower()
            for name in (f.root_cause.fleets if f.root_cause else [])
        ],
        schema={
            "i": pl.Int64,
            "server": pl.String,
            "fleet_name": pl.String,
            "as_of": pl.Datetime("us", "UTC"),
            "own": pl.String,
        },
    )
    if failures.is_empty():
        return {}
    # a root cause names its fleets by the names of its jobs' fleets (impact.py), and fleet
    # names are unique only within a project (fleets.project_id; a replica is placed in its
    # project's fleets, or one imported into it): each name is the fleet the run's jobs had
    fleets = frames.submissions.select(
        "server", pl.col("run_id").alias("own"), "fleet_name", "fleet_id"
    ).drop_nulls(["fleet_name", "fleet_id"])
    failures = failures.join(
        fleets.unique(maintain_order=True),
        on=["server", "own", "fleet_name"],
        maintain_order="left",
    )
    placed = frames.placed
    if placed is None:
        placed = placed_jobs(frames.submissions, frames.runs)
    held = holders_at(failures, placed, HOLDERS_NAMED)
    # each finding's texts under its run (a run's findings of two categories share them)
    runs = pl.DataFrame(
        {
            "i": range(len(findings)),
            "_server": [f.server for f in findings],
            "_run_id": [f.run_id for f in findings],
        },
        schema={"i": pl.Int64, "_server": pl.String, "_run_id": pl.String},
    )
    said = (
        held.join(runs, on="i", maintain_order="left")
        .select("_server", "_run_id", _holder_text().alias("text"))
        .group_by("_server", "_run_id", maintain_order=True)
        .agg("text")
    )
    return {(server, run_id): texts for server, run_id, texts in said.iter_rows()}


def _holder_text() -> pl.Expr:
    """One holder of the room, in words (each value as an f-string shows it: a missing one
    as "None")."""
    whose = (
        pl.when(pl.col("run_id") == pl.col("own"))
        .then(pl.lit("this run's"))
        .otherwise(pl.format("run {}'s", _shown("run_name")))
    )
    until = (
        pl.when(pl.col("stopped_at").is_not_null())
        .then(pl.format("until {}", _second("stopped_at")))
        .otherwise(pl.lit("still there at the end of the evidence"))
    )
    proof = pl.col("health_proof")
    more = (
        pl.when((pl.col("rank") == HOLDERS_NAMED - 1) & (pl.col("of") > HOLDERS_NAMED))
        .then(pl.format("; and {} more job(s) on its instances", pl.col("of") - HOLDERS_NAMED))
        .otherwise(pl.lit(""))
    )
    return pl.concat_str(
        pl.format(
            "at the failure ({}) fleet {} was at capacity: {} {} (deployment {}) held instance "
            "{} since {}, {} (health: {}",
            _second("as_of"),
            _shown("fleet_name"),
            whose,
            _shown("job_name"),
            _shown("deployment_num"),
            _shown("instance_name"),
            _second("created_at"),
            until,
            _shown("health"),
        ),
        pl.when(known(proof)).then(pl.format(", {}", proof)).otherwise(pl.lit("")),
        pl.lit(")"),
        more,
    )


def _shown(column: str) -> pl.Expr:
    return pl.col(column).cast(pl.String).fill_null("None")


def _second(column: str) -> pl.Expr:
    return pl.col(column).dt.strftime("%Y-%m-%d %H:%M:%S")


_QUEUE_TOOK_IT = "the room left goes to other runs' queued replicas first"
_QUEUED_RUN = r"run (\S+)'s queued (\S+)"


def _root_cause_naming_the_queue(finding: Finding, surge: str, reasons: list[str]):
    """The root cause of a no-capacity failure whose room another run's queued replica took:
    that run named (placement.queued_first: dstack places the queue by priority, then age)."""
    root = finding.root_cause
    if root is None or surge != "none":
        return None
    taken = [found for r in reasons if _QUEUE_TOOK_IT in r for found in re.findall(_QUEUED_RUN, r)]
    if not taken:
        return None
    runs = ", ".join(dict.fromkeys(f"run {run} ({job})" for run, job in taken))
    return root.model_copy(
        update={
            "detail": f"{root.detail}; the room the surge replica needed went first to the "
            f"queued replica of {runs}, which dstack places before it (priority, then age: "
            "jobs_submitted.py)"
        }
    )
