"""A canonical dataset written by `dstack-audit ingest` (local folder or any URL polars reads)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from analyzer.dataset import MANIFEST, read_manifest, scan_table
from analyzer.errors import AuditInputError
from analyzer.sources import InputInfo, Limitation, Source, SourceData, read_options


def _sniff(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file() and read_manifest(str(path)) is not None


def load_location(location: str, server: str) -> SourceData:
    manifest = read_manifest(location)
    if manifest is None:
        raise AuditInputError(location, "not a dstack-audit dataset (no readable dataset.parquet)")
    partition = read_options().partition
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


def _load(path: Path, server: str) -> SourceData:
    return load_location(str(path), server)


SOURCE = Source(kind="dataset", sniff=_sniff, load=_load)
