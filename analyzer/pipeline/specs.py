"""Spec history: what the evidence proves of a run's and a fleet's spec at a moment T, beside
the job states (pipeline/states.py). The tables hold only the final specs; they speak of T
only when nothing says the spec changed after T.

- A run's spec: every `dstack apply` accepted in place is a "Run updated" event naming the
  fields it changed (0.20.8+; services/runs/__init__.py, apply_plan). An update after T that
  changed where a replica can go or how many are wanted means the final spec is not T's.
- A fleet's `nodes`: dstack emits no event when a fleet is edited in place. When it refused a
  placement "Fleet is at capacity" (pipeline_tasks/jobs_submitted.py,
  can_create_new_cloud_instance_in_fleet: fewer active instances than `nodes.max`) while the
  fleet held fewer active instances than the final `nodes.max`, the final spec contradicts
  what dstack did: the fleet was edited later, and its `nodes` at or before that refusal are
  unknown, never the final ones.

`run_spec_at` and `fleet_nodes_at` are the spec history every consumer reads (exposure at T, the
capacity foresight of a finding): nothing else decides what a spec was at T.
"""

from __future__ import annotations

import json

import polars as pl

from analyzer.dstack import FINISHED_RUN_STATUSES, IN_PLACE_CHANGES, REPLICA_COUNT_CHANGES
from analyzer.pipeline.placement import count_at, parse_spec, spans_at

# Run spec fields that decide where a replica goes and how many are wanted (the run's
# `placement_spec`, RUNS_SCHEMA), in the words of "Changed fields".
PLACEMENT_CHANGES = {
    "configuration.resources": "resources",
    "configuration.replicas": "replicas",
    "configuration.groups": "groups",
    "configuration.fleets": "fleets",
    "configuration.retry": "retry",
    "configuration.creation_policy": "creation_policy",
    "configuration.priority": "priority",
}
FLEET_AT_CAPACITY = "Fleet is at capacity"


def changed_after(events: pl.DataFrame, moments: pl.DataFrame) -> pl.DataFrame:
    """Per moment (server, run_id, as_of), the placement fields (PLACEMENT_CHANGES' words) that
    updates after it changed, each once, sorted; moments no later update touched have none."""
    updates = events.filter(pl.col("kind") == "run_updated").select(
        "server",
        "run_id",
        pl.col("time").alias("_at"),
        pl.col("changed_fields").str.split(",").list.eval(pl.element().str.strip_chars()),
    )
    return (
        moments.select("server", "run_id", "as_of")
        .unique()
        .join(updates, on=["server", "run_id"])
        .filter(pl.col("_at") > pl.col("as_of"))
        .explode("changed_fields")
        .filter(pl.col("changed_fields").is_in(list(PLACEMENT_CHANGES)))
        .group_by("server", "run_id", "as_of")
        .agg(
            pl.col("changed_fields")
            .replace_strict(PLACEMENT_CHANGES)
            .unique()
            .sort()
            .alias("changed_later")
        )
    )


# Changed later, these make the final spec say nothing of where a replica could go at T.
WHERE_CHANGES = ("resources", "groups", "fleets", "creation_policy")
# Changed later, these make the final desired replica count not T's.
COUNT_CHANGES = ("replicas", "groups")


def run_spec_at(
    runs: pl.DataFrame,
    submissions: pl.DataFrame,
    updates: pl.DataFrame | None,
    probes: pl.DataFrame,
) -> pl.DataFrame:
    """The run's spec in force at each probe (server, run_id, as_of), as far as the evidence
    proves it: `placement_spec` (the final one, with the resources of T's deployment where
    an update after T changed them), `where_known` (false: an update after T changed where a
    replica can go, and the final spec's placement is not T's),
    `desired_replica_count` (null where an update after T changed the count), the placement
    fields updates after T changed (`changed_later`) and, where T's resources were read from
    the jobs, whose (`resources_from`). A probe's `spec_as_of`, when given, is the moment
    whose spec is asked instead of its own (the foresight asks, just before an update, the
    spec that update put in force: the surge replica's)."""
    key = ["server", "run_id", "as_of"]
    asked = (
        probes.select(
            "server",
            "run_id",
            pl.col("as_of").alias("_probe"),
            pl.col("spec_as_of" if "spec_as_of" in probes.columns else "as_of").alias("as_of"),
        )
        .unique()
        .join(
            runs.select("server", "run_id", "placement_spec", "desired_replica_count"),
            on=["server", "run_id"],
            how="left",
        )
    )
    if updates is None:
        later = asked.with_columns(pl.lit([], pl.List(pl.String)).alias("changed_later"))
    else:
        later = asked.join(changed_after(updates, asked), on=key, how="left").with_columns(
            pl.col("changed_later").fill_null([])
        )
    changed = pl.col("changed_later")
    only_resources = (
        changed.list.set_intersection(list(WHERE_CHANGES)).list.len() == 1
    ) & changed.list.contains("resources")
    # the probes whose resources only an update after T changed (most often none: then the
    # eight queries of _resources_at are not run)
    asked_resources = later.filter(only_resources) if updates is not None else None
    resolved = (
        _resources_at(asked_resources, submissions, updates)
        if asked_resources is not None and asked_resources.height
        else None
    )
    if resolved is not None and not resolved.is_empty():
        later = later.join(resolved, on=key, how="left").with_columns(
            pl.coalesce("_spec_at", "placement_spec").alias("placement_spec")
        )
    else:
        later = later.with_columns(pl.lit(None, pl.String).alias("resources_from"))
    where_changed = changed.list.set_intersection(list(WHERE_CHANGES)).list.len() > 0
    count_changed = changed.list.set_intersection(list(COUNT_CHANGES)).list.len() > 0
    return later.select(
        "server",
        "run_id",
        pl.col("_probe").alias("as_of"),
        "placement_spec",
        (~where_changed | pl.col("resources_from").is_not_null()).alias("where_known"),
        pl.when(count_changed)
        .then(None)
        .otherwise("desired_replica_count")
        .alias("desired_replica_count"),
        "changed_later",
        "resources_from",
    )


def _resources_at(
    asked: pl.DataFrame, submissions: pl.DataFrame, updates: pl.DataFrame
) -> pl.DataFrame:
    """Per probe whose resources an update after T changed: the final placement spec with
    T's resources (`_spec_at`), read from the job_spec_data of the jobs that run T's spec,
    and whose (`resources_from`). Each accepted update makes deployment n+1
    (services/runs/__init__.py, apply_plan), so T's deployment is the first later update's
    less one; every job from it up to the first later update that changed resources runs
    T's resources (an in-place bump never changes them: IN_PLACE_CHANGES). One distinct
    resources text per replica group, or T's are unknown."""
    key = ["server", "run_id", "as_of"]
    later = (
        asked.select(key)
        .join(
            updates.select("server", "run_id", "time", "deployment_num", "changed_fields"),
            on=["server", "run_id"],
        )
        .filter(pl.col("time") > pl.col("as_of"))
        .group_by(key)
        .agg(
            (pl.col("deployment_num").min() - 1).alias("_from"),
            pl.col("deployment_num")
            .filter(pl.col("changed_fields").str.contains("configuration.resources", literal=True))
            .min()
            .alias("_until"),
        )
    )
    jobs = (
        later.join(
            submissions.select(
                "server", "run_id", "deployment_num", "replica_group", "job_name", "resources"
            ),
            on=["server", "run_id"],
        )
        .filter(
            (pl.col("deployment_num") >= pl.col("_from"))
            & (pl.col("deployment_num") < pl.col("_until"))
            & pl.col("resources").is_not_null()
        )
        .group_by(*key, pl.col("replica_group").fill_null("0"))
        .agg(
            pl.col("resources").unique().alias("_texts"),
            pl.format("{} (deployment {})", "job_name", "deployment_num")
            .unique()
            .sort()
            .alias("_jobs"),
        )
        .filter(pl.col("_texts").list.len() == 1)
    )
    rows: dict[tuple, dict] = {}
    for row in jobs.iter_rows(named=True):
        found = rows.setdefault(tuple(row[k] for k in key), {"groups": {}, "jobs": []})
        found["groups"][row["replica_group"]] = row["_texts"][0]
        found["jobs"] += row["_jobs"]
    finals = {tuple(r[k] for k in key): r["placement_spec"] for r in asked.iter_rows(named=True)}
    out = []
    for probe, found in rows.items():
        spec = _with_resources(finals.get(probe), found["groups"])
        if spec is not None:
            out.append((*probe, spec, "the job_spec_data of " + ", ".join(found["jobs"])))
    return pl.DataFrame(
        out,
        schema={
            "server": pl.String,
            "run_id": pl.String,
            "as_of": asked.schema["as_of"],
            "_spec_at": pl.String,
            "resources_from": pl.String,
        },
        orient="row",
    )


def _with_resources(text: str | None, groups: dict[str, str]) -> str | None:
    """The placement spec `text` with each replica group's resources (JSON texts by group
    name) put in; None when a group of the spec has no jobs to read them from."""
    spec = parse_spec(text)
    if spec is None:
        return None
    listed = spec.get("groups")
    if isinstance(listed, list) and listed:
        for index, group in enumerate(g for g in listed if isinstance(g, dict)):
            name = str(group.get("name") or index)
            if name not in groups:
                return None
            group["resources"] = json.loads(groups[name])
    elif list(groups) == ["0"]:
        spec["resources"] = json.loads(groups["0"])
    else:
        return None
    return json.dumps(spec)


def fleet_nodes_at(
    moments: pl.DataFrame,
    submissions: pl.DataFrame,
    runs: pl.DataFrame,
    fleets: pl.DataFrame,
    instances: pl.DataFrame,
) -> pl.DataFrame:
    """Each fleet at its moment (server, fleet_id, as_of rows, the fleets' columns) with what
    the evidence proves of its `nodes` then: where a later refusal "Fleet is at capacity"
    contradicts the final `nodes.max` (`nodes_contradicted`), `nodes_refused_at` and
    `nodes_refused_active` name it, and `nodes_known` is false: the final `nodes` are not
    T's (nodes_min and nodes_max stay the final ones, to be shown as such, never used)."""
    contradicted = nodes_contradicted(submissions, runs, fleets, instances).select(
        "server",
        "fleet_id",
        pl.col("refused_at").alias("nodes_refused_at"),
        pl.col("active").alias("nodes_refused_active"),
    )
    at = moments.join(contradicted, on=["server", "fleet_id"], how="left", maintain_order="left")
    later = pl.col("as_of") <= pl.col("nodes_refused_at")
    return at.with_columns(
        *(
            pl.when(later).then(pl.col(c)).alias(c)
            for c in ("nodes_refused_at", "nodes_refused_active")
        ),
        (~later).fill_null(True).alias("nodes_known"),
    )


def nodes_contradicted(
    submissions: pl.DataFrame, runs: pl.DataFrame, fleets: pl.DataFrame, instances: pl.DataFrame
) -> pl.DataFrame:
    """Per fleet (server, fleet_id), the last time dstack refused a placement in it "Fleet is
    at capacity" while it held fewer active instances than its final `nodes.max`
    (`refused_at`), with that count and maximum: its `nodes` at or before then are unknown."""
    refused = (
        submissions.filter(
            (pl.col("termination_reason") == "failed_to_start_due_to_no_capacity")
            & pl.col("termination_reason_message").str.contains(FLEET_AT_CAPACITY, literal=True)
        )
        .join(
            runs.select("server", "run_id", pl.col("fleet_id").alias("_run_fleet")),
            on=["server", "run_id"],
            how="left",
        )
        .select(
            "server",
            pl.coalesce("fleet_id", "_run_fleet").alias("fleet_id"),
            pl.coalesce("stopped_at", "last_processed_at").alias("as_of"),
        )
        .drop_nulls()
        .unique()
    )
    schema = {
        "server": pl.String(),
        "fleet_id": pl.String(),
        "refused_at": pl.Datetime("us", "UTC"),
        "active": pl.UInt32(),
        "nodes_max": pl.Int64(),
    }
    if refused.is_empty():
        return pl.DataFrame(schema=schema)
    alive = instances.select(
        "server", "fleet_id", "instance_id", pl.col("created_at").alias("_from"), "ended_at"
    )
    active = count_at(refused, alive, ("server", "fleet_id"), "_from", "ended_at")
    return (
        refused.with_columns(active.alias("active"))
        .join(
            fleets.filter(~pl.col("ssh").fill_null(False)).select(
                "server", "fleet_id", "nodes_max"
            ),
            on=["server", "fleet_id"],
        )
        .filter(pl.col("nodes_max").is_not_null() & (pl.col("active") < pl.col("nodes_max")))
        .sort("as_of")
        .group_by("server", "fleet_id")
        .agg(pl.all().last())
        .rename({"as_of": "refused_at"})
        .select(list(schema))
        .cast(schema)
    )


def promised_surges(
    updates: pl.DataFrame, submissions: pl.DataFrame, runs: pl.DataFrame, moments: pl.DataFrame
) -> pl.DataFrame:
    """Room promised but not yet taken: per moment (server, run_id, as_of), the other runs of
    its fleet whose update dstack accepted by then, that changed a rolling field (so their
    next run pass creates a surge replica: pipeline_tasks/runs/active.py, rolling
    deployment), whose surge job is not created yet at T. That replica goes into the same
    fleet's room: `promised`, one text per such run (in the order their updates came).

    A run's latest such update promises room from its acceptance until the run's next one,
    its first job created after it, or the run finishing, whichever comes first: a span in
    time, met by the moments it holds at (placement.spans_at), never every run of the
    fleet per moment."""
    # a field neither in-place nor a replica count: a rolling change
    rolling = (
        pl.col("changed_fields")
        .str.split(",")
        .list.eval(
            pl.element()
            .str.strip_chars()
            .is_in(list(IN_PLACE_CHANGES | REPLICA_COUNT_CHANGES))
            .not_()
        )
        .list.any()
    )
    fleet = runs.select("server", "run_id", "fleet_id", "run_name", "status", "last_processed_at")
    created = (
        submissions.select(
            "server", pl.col("run_id").alias("other"), pl.col("created_at").alias("_created")
        )
        .drop_nulls("_created")
        .sort("_created")
    )
    promises = (
        updates.filter(rolling.fill_null(False))
        .select(
            "server",
            pl.col("run_id").alias("other"),
            pl.col("time").alias("_accepted"),
            "deployment_num",
        )
        .drop_nulls("_accepted")
        # two updates of a run at one time: the later one read is its latest
        .unique(["server", "other", "_accepted"], keep="last", maintain_order=True)
        .sort("_accepted", maintain_order=True)
        .with_columns(pl.col("_accepted").shift(-1).over("server", "other").alias("_next"))
        # the first job the run created after the update: its surge replica
        .join_asof(
            created,
            left_on="_accepted",
            right_on="_created",
            by=["server", "other"],
            strategy="forward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .join(fleet.rename({"run_id": "other"}), on=["server", "other"])
        .with_columns(
            pl.min_horizontal(
                "_next",
                "_created",
                # a run finished creates nothing more
                pl.when(pl.col("status").is_in(FINISHED_RUN_STATUSES)).then("last_processed_at"),
            ).alias("_ends")
        )
    )
    asked = (
        moments.select("server", "run_id", "as_of")
        .unique(maintain_order=True)
        .join(fleet.select("server", "run_id", "fleet_id"), on=["server", "run_id"])
    )
    pending = spans_at(asked, promises, ("server", "fleet_id"), start="_accepted", end="_ends")
    return (
        asked.with_row_index("_moment")
        .join(pending, on="_moment")
        .filter(pl.col("other") != pl.col("run_id"))
        .sort("_moment", "_accepted", "other")
        .group_by("server", "run_id", "as_of", maintain_order=True)
        .agg(
            pl.format(
                "run {}'s update to deployment {} (accepted at {}) has not created its surge "
                "replica yet",
                "run_name",
                "deployment_num",
                pl.col("_accepted").dt.strftime("%Y-%m-%d %H:%M:%S"),
            ).alias("promised")
        )
    )
