"""Which dstack server each input belongs to.

Each database (with its table exports: they share its run ids) is a server of its own, with its
own ids, end of the evidence and summary. A log or an API export joins the database it agrees
with (shared run/job ids, or the 6-hex id prefixes and names a log shows); one that agrees with
none is a server of its own, and a limitation says so. Labels given with `--server-label` are
never changed.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePath

import polars as pl

from analyzer.sources.base import Limitation, SourceData


def _identities(part: SourceData) -> set[tuple[str, str, str]]:
    """(entity type, 6-hex id prefix, name) of every run and job the input names."""
    short = pl.col("id").str.replace_all("-", "").str.slice(0, 6)
    frames = [  # one query
        part.runs.lazy().select(
            pl.lit("run").alias("type"),
            pl.col("run_id").alias("id"),
            pl.col("run_name").alias("name"),
        ),
        part.jobs.lazy().select(
            pl.lit("job").alias("type"),
            pl.col("job_id").alias("id"),
            pl.col("job_name").alias("name"),
        ),
        part.events.lazy().select(
            pl.col("entity_type").alias("type"),
            pl.col("entity_id").alias("id"),
            pl.col("entity_name").alias("name"),
        ),
    ]
    keys = pl.concat(frames).drop_nulls().select("type", short.alias("id"), "name").unique()
    return set(keys.collect().iter_rows())


def _run_ids(part: SourceData) -> set[str]:
    return set(part.runs["run_id"].drop_nulls().to_list())


def _version_range(text: str | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """'0.22.5', '0.20.14-0.20.15', '>=0.21.1' -> (lowest, highest) release."""
    if not text:
        return None
    numbers = [tuple(int(n) for n in v.split(".")) for v in re.findall(r"\d+\.\d+\.\d+", text)]
    if not numbers:
        return None
    if text.startswith(">="):
        return numbers[0], (99, 99, 99)
    return min(numbers), max(numbers)


def _version(part: SourceData) -> str | None:
    return next((i.server_version for i in part.inputs if i.server_version), None)


def _home(group: list[SourceData]) -> SourceData:
    """The part that names a server: its database, else its table export, else its first
    input."""

    def rank(part: SourceData) -> int:
        kind = part.inputs[0].kind if part.inputs else ""
        return 0 if kind in ("sqlite", "postgresql") else 1 if kind == "table-export" else 2

    return min(group, key=rank)


def _place(part: SourceData) -> str:
    """Where a server's evidence sits: its database file or URL, or its table-export folder
    (never one of the tables, `.../tables/backends.csv`)."""
    if not part.inputs:
        return "?"
    first = part.inputs[0]
    return str(PurePath(first.path).parent) if first.kind == "table-export" else first.path


def _labels(groups: list[list[SourceData]]) -> list[str]:
    """Each server named by the source the user gave for it (a database file, a folder), or,
    for several servers inside one given folder, by where each sits in it: the shortest
    trailing part of those that tells the servers apart."""
    homes = [_home(group) for group in groups]
    given = [home.given for home in homes]
    return distinct_labels(
        [
            name if name is not None and given.count(name) == 1 else _place(home)
            for name, home in zip(given, homes, strict=True)
        ]
    )


def distinct_labels(names: list[str]) -> list[str]:
    """Servers named by where their evidence sits (a path or a URL): the shortest trailing part
    of those names that tells the servers apart."""
    paths = [
        PurePath(name if "://" in name else os.path.abspath(name)).parts if name != "?" else ("?",)
        for name in names
    ]
    for depth in range(1, max(len(p) for p in paths) + 1):
        labels = ["/".join(p[-depth:]).replace("//", "/", 1) for p in paths]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{name}#{i}" for i, name in enumerate(names)]


def _relabel(part: SourceData, loaded_as: str, server: str) -> None:
    """Rows loaded under the default label get their server's; rows that already name a
    server (an ingested dataset of several) keep it."""
    if server == loaded_as:
        return
    relabel = (
        pl.when(pl.col("server") == loaded_as)
        .then(pl.lit(server))
        .otherwise(pl.col("server"))
        .alias("server")
    )
    part.runs = part.runs.with_columns(relabel)
    part.jobs = part.jobs.with_columns(relabel)
    part.events = part.events.with_columns(relabel)
    part.fleets = part.fleets.with_columns(relabel)
    part.instances = part.instances.with_columns(relabel)
    if loaded_as in part.latest_time:
        part.latest_time[server] = part.latest_time.pop(loaded_as)
    if loaded_as in part.events_table_of:
        part.events_table_of = (part.events_table_of - {loaded_as}) | {server}


def _folder(part: SourceData) -> str:
    """Where a database sits (a table export: the folder holding its tables folder)."""
    if not part.inputs:
        return "?"
    path = PurePath(part.inputs[0].path)
    return str(path.parent.parent if part.inputs[0].kind == "table-export" else path.parent)


def _union(groups: list[list[SourceData]], keys: list[set], part: SourceData, key: set) -> None:
    """Put `part` into every group it shares a key with (merging those groups), or a new one."""
    hits = [i for i, known in enumerate(keys) if known & key]
    if not hits:
        groups.append([part])
        keys.append(set(key))
        return
    first = hits[0]
    for i in reversed(hits[1:]):
        groups[first].extend(groups.pop(i))
        keys[first] |= keys.pop(i)
    groups[first].append(part)
    keys[first] |= key


def assign_servers(
    loaded: list[tuple[list[SourceData], str | None]], default: str, *, partitioned: bool = False
) -> list[SourceData]:
    """The parts of every given path, each labelled with its server (see the module doc).

    A database that holds no run of this partition still counts as its server (labels are
    the same in every partition); it joins a database of the same folder, if any."""
    fixed = [part for parts, label in loaded if label is not None for part in parts]
    free = [part for parts, label in loaded if label is None for part in parts]
    databases = [p for p in free if p.has_tables]
    if not databases:
        return fixed + free
    groups: list[list[SourceData]] = []
    run_keys: list[set] = []
    for part in sorted(databases, key=lambda p: not p.runs.height):
        key = _run_ids(part)
        if not key:
            same = [i for i, g in enumerate(groups) if _folder(part) in {_folder(p) for p in g}]
            if same:
                groups[same[0]].append(part)
                continue
            key = {("folder", _folder(part))}
        _union(groups, run_keys, part, key)
    in_databases = {id(p) for p in databases}
    logs = [part for part in free if id(part) not in in_databases]
    # the databases' ids and names only when there are logs to match them with
    identities = [set().union(*(_identities(p) for p in group)) for group in groups if logs]
    versions = [next((v for p in group if (v := _version(p))), None) for group in groups]

    alone: list[list[SourceData]] = []
    alone_keys: list[set] = []
    empty: list[SourceData] = []
    for part in logs:
        key = _identities(part)
        if not key:
            empty.append(part)
            continue
        scores = [len(key & known) for known in identities]
        best = max(range(len(groups)), key=lambda i: scores[i])
        if scores[best] > 0 or (partitioned and len(groups) == 1):
            groups[best].append(part)
            _say_if_newer(part, versions[best])
        else:
            _union(alone, alone_keys, part, key)
    for group in alone:
        for part in group:
            part.limitations.append(
                Limitation(
                    "log_matches_no_database",
                    "this input shares no run or job id (nor a log's id prefix and name) with "
                    "any database in the audit: it is audited as a server of its own, with its "
                    "own end of the evidence; --server-label NAME=SOURCE says otherwise",
                    part.inputs[0].path if part.inputs else "?",
                )
            )
    servers = groups + alone
    labels = [default] if len(servers) == 1 else _labels(servers)
    for group, label in zip(servers, labels, strict=True):
        for part in group:
            _relabel(part, default, label)
    for part in empty:
        _relabel(part, default, labels[0])
    return fixed + [part for group in servers for part in group] + empty


def _say_if_newer(part: SourceData, database_version: str | None) -> None:
    """A log written by a newer release than its database's schema is from a later state of
    the server (the database is an older copy, or the server was upgraded after it)."""
    own, theirs = _version_range(_version(part)), _version_range(database_version)
    if own is None or theirs is None or own[0] <= theirs[1]:
        return
    part.limitations.append(
        Limitation(
            "log_from_different_server_state",
            f"written by dstack {_version(part)}, newer than its database ({database_version}): "
            "it is from a different server state than the database (an older copy of it, or a "
            "server upgraded since); where they disagree, the database row is kept",
            part.inputs[0].path if part.inputs else "?",
        )
    )
