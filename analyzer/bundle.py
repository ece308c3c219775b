"""Chain of custody: a bundle holds the report and a manifest from which the same audit can be
re-run later and compared, input hash by input hash and finding by finding."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from analyzer._version import __version__
from analyzer.api import open_sources
from analyzer.contract import Report
from analyzer.errors import AuditInputError
from analyzer.outputs import local_path
from analyzer.redact import Redactor
from analyzer.sources import network_or_stdin, shown
from analyzer.sources.base import Verification, file_facts

MANIFEST = "manifest.json"
REPORT = "report.json"


def _verdicts(report: Report) -> dict[str, Any]:
    """The parts of a report that must not change when the same inputs are audited again."""
    data = report.model_dump(mode="json")
    return {"runs": data["runs"], "findings": data["findings"], "summary": data["summary"]}


class ManifestInput(BaseModel):
    path: str  # as the report shows it (relative to `cwd` when the audit was given one)
    kind: str
    sha256: str | None
    size: int | None = None
    absolute: str | None = None
    from_bundle: str | None = None  # relative to the bundle: found again when both move together


class ManifestOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str | None = None
    run: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    log_tz: str | None = None
    log_date: date | None = None
    server_labels: dict[str, str] | None = None
    partition: tuple[int, int] | None = None

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        """The CLI's --since/--until are UTC times written without a zone."""
        return value.replace(tzinfo=UTC) if value and value.tzinfo is None else value


class Manifest(BaseModel):
    """What `verify` needs to re-run the audit: the sources as given and where from, the options
    and every input's hash."""

    tool: str
    created_at: str
    sources: list[str]  # resolved (absolute) paths, URLs without their password
    given_sources: list[str] | None = None  # as given on the command line
    cwd: str | None = None  # the working directory the given sources are relative to
    cwd_from_bundle: str | None = None
    options: ManifestOptions = Field(default_factory=ManifestOptions)
    inputs: list[ManifestInput]
    schema_version: int


def unverifiable(source: str) -> str | None:
    """Why a source cannot go into a bundle: `verify` reads only local files, so a bundle never
    names a server, a database, a cloud bucket or standard input (None: it can)."""
    what = network_or_stdin(source)
    if what is None:
        return None
    return (
        f"{shown(source)} is {what}, and `verify` reads only local files, never a network "
        "source or standard input"
    )


def write_bundle(
    folder: Path,
    sources: tuple[str, ...],
    options: dict[str, Any],
    report: Report,
    markdown: str,
    *,
    location: Path | None = None,
) -> None:
    """Write the bundle's files into `folder`; `location` is where the bundle will live (when
    `folder` is built elsewhere and moved there), so paths relative to it are right."""
    folder.mkdir(parents=True, exist_ok=True)
    home = Path(location or folder).resolve()
    cwd = Path.cwd().resolve()

    def from_bundle(path: Path) -> str:
        return os.path.relpath(path, home)

    inputs = []
    for item in report.inputs:
        local = not ("://" in item.path or item.path == "-")
        absolute = (cwd / item.path).resolve() if local else None
        inputs.append(
            ManifestInput(
                path=item.path,
                kind=item.kind,
                sha256=item.sha256,
                size=item.size,
                absolute=str(absolute) if absolute else None,
                from_bundle=from_bundle(absolute) if absolute else None,
            )
        )
    manifest = Manifest(
        tool=f"dstack-audit {__version__}",
        created_at=datetime.now(UTC).isoformat(),
        sources=[shown(s) if "://" in s else str(Path(s).resolve()) for s in sources],
        given_sources=[shown(s) for s in sources],
        cwd=str(cwd),
        cwd_from_bundle=from_bundle(cwd),
        options=ManifestOptions.model_validate(options),
        inputs=inputs,
        schema_version=report.schema_version,
    )
    masked = Redactor().apply_data(manifest.model_dump(mode="json"))  # secret shapes too
    (folder / MANIFEST).write_text(json.dumps(masked, indent=2) + "\n", encoding="utf-8")
    (folder / REPORT).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    (folder / "report.md").write_text(markdown, encoding="utf-8")


def _read_manifest(folder: Path) -> tuple[Manifest, Report]:
    """The bundle's manifest and recorded report, or one line saying what is wrong."""
    if not folder.is_dir():
        problem = "not a folder" if folder.exists() else "no such folder"
        raise AuditInputError(str(folder), f"not a dstack-audit bundle ({problem})")
    read = []
    for name, model, what in ((MANIFEST, Manifest, "manifest"), (REPORT, Report, "JSON report")):
        path = folder / name
        if not path.exists():
            raise AuditInputError(str(folder), f"not a dstack-audit bundle (no {name} in it)")
        try:
            read.append(model.model_validate_json(path.read_bytes()))
        except OSError as error:
            raise AuditInputError(str(path), f"cannot read it ({error.strerror})") from None
        except ValidationError as error:
            raise AuditInputError(
                str(path), f"not a dstack-audit bundle {what} ({_first(error)})"
            ) from None
    return read[0], read[1]


def _first(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    text = f"{where}: {problem['msg']}" if where else problem["msg"]
    return " ".join(text.split())[:200]


def _base(manifest: Manifest, folder: Path) -> Path | None:
    """The folder the given sources are relative to, now: where the audit ran, or the same place
    relative to the bundle when evidence and bundle moved together. None: neither holds them."""
    if manifest.given_sources is None or manifest.cwd is None:
        return None
    candidates = [Path(manifest.cwd)]
    if manifest.cwd_from_bundle is not None:
        candidates.append(folder.resolve() / manifest.cwd_from_bundle)
    local = [s for s in manifest.given_sources if "://" not in s and s != "-"]
    for base in candidates:
        if base.is_dir() and all((base / s).exists() for s in local):
            return base.resolve()
    return None


def verify_bundle(folder: Path) -> Verification:
    """Check every recorded input's hash, then re-run the audit and compare verdicts and
    findings. The sources are given as they were, from the folder they were given in (for the
    call, then back): the new report names every input and provenance as the recorded one."""
    manifest, recorded = _read_manifest(folder)
    result = Verification()
    if manifest.tool != f"dstack-audit {__version__}":
        result.lines.append(
            f"note: bundle made by {manifest.tool}, verified with dstack-audit {__version__}"
        )
    base = _base(manifest, folder)
    _refuse_foreign_sources(manifest, folder, base)
    for item in manifest.inputs:
        if item.sha256 is None:
            continue
        path = _input_path(item, base, folder)
        if path is None:
            result.differ(f"input missing: {item.absolute or item.path}")
            continue
        now = file_facts(path, item.kind).sha256
        if now != item.sha256:
            result.differ(f"input changed: {path} sha256 {item.sha256} -> {now}")
    if not result.same:
        return result
    options = manifest.options.model_dump(exclude_none=True)
    if base is None:
        again = open_sources(manifest.sources, **options).report
    else:
        back = Path.cwd()
        os.chdir(base)
        try:
            again = open_sources(manifest.given_sources or manifest.sources, **options).report
        finally:
            os.chdir(back)
    before, after = _verdicts(recorded), _verdicts(again)
    if before == after:
        result.lines.append(
            f"verified: {len(manifest.inputs)} input(s) unchanged, the same "
            f"{len(recorded.findings)} finding(s) and {len(recorded.runs)} run verdict(s)"
        )
        return result
    old = {(f["run_id"], f["category"]): f for f in before["findings"]}
    new = {(f["run_id"], f["category"]): f for f in after["findings"]}
    for key in sorted(old.keys() - new.keys()):
        result.differ(f"finding no longer made: {key[1]} in run {key[0]}")
    for key in sorted(new.keys() - old.keys()):
        result.differ(f"new finding: {key[1]} in run {key[0]}")
    for key in sorted(old.keys() & new.keys()):
        if old[key] != new[key]:
            fields = sorted(k for k in old[key] if old[key][k] != new[key].get(k))
            result.differ(f"finding changed: {key[1]} in run {key[0]}: {', '.join(fields)}")
    old_runs = {r["run_id"]: r["verdict"] for r in before["runs"]}
    new_runs = {r["run_id"]: r["verdict"] for r in after["runs"]}
    for run_id in sorted(old_runs.keys() | new_runs.keys()):
        if old_runs.get(run_id) != new_runs.get(run_id):
            result.differ(f"run {run_id}: verdict {old_runs.get(run_id)} -> {new_runs.get(run_id)}")
    if result.same:
        result.differ("the report differs in its summary")
    return result


def _refuse_foreign_sources(manifest: Manifest, folder: Path, base: Path | None) -> None:
    """A bundle's manifest is read as untrusted (it may have been altered): its sources must be
    local files or folders that are, or hold, the inputs it recorded. Never a network source
    (a URL would be sent DSTACK_TOKEN or PGPASSWORD), never standard input, a device or a pipe,
    never a file such as /etc/passwd or a `../../` that is none of the recorded inputs."""
    where = str(folder / MANIFEST)
    for source in [*manifest.sources, *(manifest.given_sources or [])]:
        if (why := unverifiable(source)) is not None:
            raise AuditInputError(
                where, f"names a source it cannot hold: {why} (an altered bundle?)"
            )
    recorded = [
        Path(os.path.realpath(path))
        for item in manifest.inputs
        if item.sha256 is not None and (path := _input_path(item, base, folder)) is not None
    ]
    opened = manifest.sources if base is None else (manifest.given_sources or manifest.sources)
    for source in opened:
        path = Path(local_path(source) or source)
        real = Path(os.path.realpath(base / path if base is not None else path))
        try:
            mode = real.stat().st_mode
        except OSError:
            continue  # missing: the re-run says so, reading nothing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise AuditInputError(
                where,
                f"names {shown(source)} as a source, which is no file or folder (a device, a "
                "pipe or a socket): verify never reads one (an altered bundle?)",
            )
        if not any(r == real or (stat.S_ISDIR(mode) and r.is_relative_to(real)) for r in recorded):
            raise AuditInputError(
                where,
                f"names {shown(source)} as a source, which is none of the inputs it recorded "
                "nor a folder holding one: verify reads only those (an altered bundle?)",
            )


def _input_path(item: ManifestInput, base: Path | None, folder: Path) -> Path | None:
    """Where a recorded input is now: beside the sources as given, at its absolute path, or
    at its place relative to the bundle."""
    candidates = [base / item.path] if base is not None else []
    candidates += [Path(item.absolute)] if item.absolute else [Path(item.path)]
    if item.from_bundle:
        candidates.append(folder.resolve() / item.from_bundle)
    return next((p for p in candidates if p.is_file()), None)
