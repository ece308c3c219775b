"""A canonical dataset written by `dstack-audit ingest` (local folder or any URL polars reads).

The layout is analyzer.dataset's (the writer): one Parquet folder per table, hive-partitioned by
service bucket, and a one-row Parquet manifest.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources.base import InputInfo, InputKind, Limitation, LoadContext, SourceData

DATASET_URL = re.compile(r"^(?:s3|gs|gcs|az|abfs|abfss|https?|file)://")
FORMAT = "dstack-audit-dataset"
MANIFEST = "dataset.parquet"  # parquet, not JSON: polars reads it from any URL it supports
FLEET_TABLES = ("fleets", "instances")  # belong to no run: bucket -1, read by every partition


def read_manifest(location: str) -> dict | None:
    try:
        text = pl.read_parquet(f"{location.rstrip('/')}/{MANIFEST}")["manifest"][0]
        manifest = json.loads(text)
    except Exception:
        return None
    return manifest if manifest.get("format") == FORMAT else None


def scan_table(location: str, table: str, partition: tuple[int, int] | None) -> pl.LazyFrame:
    frame = pl.scan_parquet(f"{location.rstrip('/')}/{table}/**/*.parquet", hive_partitioning=True)
    if table in FLEET_TABLES:
        return frame.drop("bucket")
    if partition is not None:
        index, count = partition
        keep = (pl.col("bucket") >= 0) & (pl.col("bucket") % count == index)
        if index == 0:
            keep = keep | (pl.col("bucket") < 0)  # rows of no known run: audited once, in 0
        frame = frame.filter(keep)
    return frame.drop("bucket")


def _sniff(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file() and read_manifest(str(path)) is not None


def load_location(location: str, partition: tuple[int, int] | None = None) -> SourceData:
    manifest = read_manifest(location)
    if manifest is None:
        raise AuditInputError(location, "not a dstack-audit dataset (no readable dataset.parquet)")
    data = SourceData(has_tables=True)
    try:
        data.runs = scan_table(location, "runs", partition).collect()
        data.jobs = scan_table(location, "jobs", partition).collect()
        data.events = scan_table(location, "events", partition).collect()
        if manifest.get("fleet_table_servers") is not None:  # written with fleets/instances
            data.fleets = scan_table(location, "fleets", partition).collect()
            data.instances = scan_table(location, "instances", partition).collect()
            data.has_fleet_tables = bool(manifest["fleet_table_servers"])
    except Exception as error:
        raise AuditInputError(location, f"cannot read the dataset ({error})") from None
    for item in manifest["inputs"]:
        info = InputInfo(**item)
        info.notes = [*info.notes, f"read from the dataset {location}"]
        data.inputs.append(info)
    data.inputs.append(
        InputInfo(
            path=location,
            kind="dataset" + (f" (partition {partition[0]}/{partition[1]})" if partition else ""),
            sha256=None,
            size=None,
            mtime=None,
            records=data.runs.height + data.jobs.height + data.events.height,
            notes=[f"written by {manifest['tool']} at {manifest['created_at']}"],
        )
    )
    data.limitations = [Limitation(**item) for item in manifest["limitations"]]
    servers = manifest.get("events_table_servers") or []
    data.events_table_of = set(servers)
    versions = manifest.get("server_versions") or {}
    if len(versions) == 1:
        data.server_version = next(iter(versions.values()))
    ends = manifest.get("ends_by_server") or {}
    data.latest_time = {name: datetime.fromisoformat(value) for name, value in ends.items()}
    return data


def _claims(given: str) -> bool:
    return DATASET_URL.match(given) is not None


def _load(given: str, ctx: LoadContext) -> SourceData:
    return load_location(given, ctx.options.partition)


SOURCE = InputKind(kind="dataset", load=_load, sniff=_sniff, claims=_claims)
