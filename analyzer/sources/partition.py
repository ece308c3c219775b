"""Partitions of an audit: whole services (all runs of one project and run name), so every
verdict and every recovery ("a later run of the same service served again") is decided inside
one partition. The bucket of a service is a stable hash: the same on every machine and with
every library version, so partitions audited apart can be merged."""

from __future__ import annotations

import hashlib

import polars as pl


def service_hash(project: str | None, run_name: str | None) -> int:
    """The first 60 bits of md5("<project>/<run name>"): a database computes the same
    (PostgreSQL: `('x' || substr(md5(key), 1, 15))::bit(60)::bigint`)."""
    key = f"{project or ''}/{run_name or ''}".encode()
    return int(hashlib.md5(key, usedforsecurity=False).hexdigest()[:15], 16)


def service_bucket(project: str | None, run_name: str | None, count: int) -> int:
    """The partition of a service among `count`: its `service_hash` modulo `count`."""
    return service_hash(project, run_name) % count


def sql_service_bucket(project_sql: str, run_name_sql: str) -> str:
    """PostgreSQL expression of `service_bucket` before the modulo."""
    key = f"coalesce({project_sql}, '') || '/' || coalesce({run_name_sql}, '')"
    return f"('x' || substr(md5({key}), 1, 15))::bit(60)::bigint"


def service_hashes(frame: pl.DataFrame, project: str, run_name: str) -> pl.Series:
    """The `service_hash` of each row's service; hashed once per distinct service, not per
    row (the same for any number of partitions: `% count` gives the bucket)."""
    services = frame.select(project, run_name).unique()
    hashes = services.with_columns(
        pl.Series("_hash", [service_hash(p, r) for p, r in services.iter_rows()], dtype=pl.Int64)
    )
    joined = frame.select(project, run_name).join(
        hashes, on=[project, run_name], how="left", nulls_equal=True, maintain_order="left"
    )
    return joined["_hash"]


def service_buckets(frame: pl.DataFrame, project: str, run_name: str, count: int) -> pl.Series:
    """The bucket of each row's service among `count`."""
    return service_hashes(frame, project, run_name) % count
