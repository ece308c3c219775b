"""A running dstack server as a source, and the folders `dstack-audit collect` writes.

`http(s)://HOST[:PORT]` is a dstack server when `POST /api/server/get_info` answers its version
(any other answer leaves the URL to the dataset source, so dataset URLs keep working);
`dstack:` and `dstack:PROJECT` take the URL, the token and the project from the dstack CLI's
configuration (`~/.dstack/config.yml`, written by `dstack project add`). The token comes from
`--token` (see `use_token`), `DSTACK_TOKEN` or that file; it is never stored and is masked in
every output.

A live audit is a collection into a private temporary folder, read by the same loader as an
offline `audit DIR` of a collected folder, so both give the same findings by construction; only
the names differ (pages are named `URL/<page file>`, the layout collect writes).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources.base import (
    InputKind,
    Limitation,
    LoadContext,
    SourceData,
    Verification,
    file_facts,
)
from analyzer.sources.collect import (
    FLEETS_PATH,
    GENERATED_BY,
    INSTANCES_PATH,
    MANIFEST,
    Server,
    collect_into,
    display_url,
)

KIND = "dstack-api-collection"
LIVE_URL = re.compile(r"^(?:https?://|dstack:)")
GIVEN_TOKEN: ContextVar[str | None] = ContextVar("dstack_token", default=None)


def use_token(token: str | None) -> Callable[[], None]:
    """The token given on the command line (`--token`), preferred to DSTACK_TOKEN, until the
    returned function is called (at the end of the command)."""
    given = GIVEN_TOKEN.set(token or None)
    return lambda: GIVEN_TOKEN.reset(given)


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    project: str | None


def _from_config(project: str | None) -> Target:
    """The dstack CLI's own project entry: name, url, token (dstack's ConfigManager format)."""
    import yaml

    path = Path.home() / ".dstack" / "config.yml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise AuditInputError(
            str(path), "no dstack CLI configuration", "run `dstack project add` first"
        ) from None
    except (OSError, yaml.YAMLError) as error:
        problem = str(error).splitlines()[0]
        raise AuditInputError(str(path), f"cannot read the configuration ({problem})") from None
    entries = [e for e in config.get("projects") or [] if isinstance(e, dict)]
    if project is None:
        entry = next((e for e in entries if e.get("default")), entries[0] if entries else None)
    else:
        entry = next((e for e in entries if e.get("name") == project), None)
    if entry is None or not entry.get("url"):
        names = ", ".join(str(e.get("name")) for e in entries) or "none"
        wanted = f"project {project!r}" if project else "a default project"
        raise AuditInputError(str(path), f"no {wanted} (configured: {names})")
    token = GIVEN_TOKEN.get() or os.environ.get("DSTACK_TOKEN") or entry.get("token")
    return Target(str(entry["url"]), token, entry.get("name"))


def target_of(given: str, project: str | None = None) -> Target:
    """Where `given` points: its URL, token and project (`project` when it names none)."""
    if given.startswith("dstack:"):
        return _from_config(given.removeprefix("dstack:") or project)
    token = GIVEN_TOKEN.get() or os.environ.get("DSTACK_TOKEN")
    return Target(given, token, project)


def load_server(given: str, ctx: LoadContext) -> SourceData:
    """Audit a live server (or, for a URL that is no dstack server, the dataset there)."""
    server = ctx.server
    target = target_of(given, ctx.options.project)
    label = display_url(target.url)
    probe = Server(target.url, None)
    try:
        version, why = probe.info()
    finally:
        probe.close()
    if version is None:
        if given.startswith("dstack:"):
            raise AuditInputError(label, f"not a dstack server ({why})")
        from analyzer.sources.dataset import load_location

        try:
            return load_location(given, ctx.options.partition)
        except AuditInputError:
            raise AuditInputError(
                label,
                f"not a dstack server ({why}) and not a dstack-audit dataset",
                "give the dstack server's base URL, e.g. https://dstack.example.com",
            ) from None
    if not target.token:
        raise AuditInputError(
            label,
            f"dstack {version} answers, but no token was given",
            "set DSTACK_TOKEN or give --token (a dstack user token)",
        )
    with tempfile.TemporaryDirectory(prefix="dstack-audit-live-") as private:
        folder = Path(private) / "api"
        result = collect_into(target.url, target.token, folder, project=target.project)
        data = load_collection(folder, server)
        _rename(data, str(folder), label)
    data.secrets.add(target.token)
    pages = len(result.pages)
    for info in data.inputs:
        if info.kind == KIND:
            info.notes.append(
                f"asked live: {pages} pages ({result.bytes} bytes) in {result.seconds:.2f} s "
                f"({pages / max(result.seconds, 1e-9):.0f} pages/s), {result.requests} requests"
            )
            if result.echoed:
                info.notes.append(
                    f"the server put the token back in its answers to {', '.join(result.echoed)}"
                    ": masked before they were read"
                )
    return data


def _rename(data: SourceData, private: str, label: str) -> None:
    """Name pages by the server's URL instead of the temporary folder they passed through."""

    def swap(text: str) -> str:
        return text.replace(private, label)

    for name in ("runs", "jobs", "events"):
        frame: pl.DataFrame = getattr(data, name)
        changes = []
        for column, dtype in frame.schema.items():
            if dtype == pl.String:
                changes.append(pl.col(column).str.replace_all(private, label, literal=True))
            elif dtype == pl.List(pl.String):
                changes.append(
                    pl.col(column).list.eval(
                        pl.element().str.replace_all(private, label, literal=True)
                    )
                )
        setattr(data, name, frame.with_columns(changes) if changes else frame)
    for info in data.inputs:
        info.path = swap(info.path)
        info.mtime = None  # a page held for the moment of the audit, not a file kept
        info.notes = [swap(note) for note in info.notes]
    for limitation in data.limitations:
        limitation.source = swap(limitation.source)
        limitation.message = swap(limitation.message)


# ---------------------------------------------------------------------------------------------
# A collected folder


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The collection's manifest, or None when `folder` is not one `collect` wrote."""
    path = folder / MANIFEST
    try:
        if not path.is_file() or path.stat().st_size > 64 * 1024 * 1024:
            return None
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("generated_by") != GENERATED_BY:
        return None
    return manifest if isinstance(manifest.get("pages"), list) else None


def _sniff(path: Path) -> bool:
    return path.is_dir() and read_manifest(path) is not None


def check_pages(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """Every difference between the folder and its manifest (empty: every page as collected)."""
    problems = []
    listed = {}
    for page in manifest["pages"]:
        listed[page["file"]] = page
        path = folder / page["file"]
        if not path.is_file():
            problems.append(f"page missing: {page['file']}")
            continue
        sha = file_facts(path, KIND).sha256
        if sha != page["sha256"]:
            problems.append(f"page changed: {page['file']} sha256 {page['sha256']} -> {sha}")
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and relative != MANIFEST and relative not in listed:
            problems.append(f"file not collected: {relative}")
    if not manifest.get("complete"):
        problems.append("the manifest does not say the collection completed")
    return problems


def load_collection(folder: Path, server: str) -> SourceData:
    """A collected folder: the API export source reads the pages; the manifest adds the
    server's version, the moment of collection and a check of every page's SHA-256. Every
    file in the folder is read as a page (one collect did not write is named by the check)."""
    from analyzer.sources import api  # pydantic models: only when a collection is read

    manifest = read_manifest(folder)
    if manifest is None:
        raise AuditInputError(str(folder), "not a folder written by dstack-audit collect")
    data = api.load_folder(folder, server)
    data.server_version = manifest.get("dstack_version") or data.server_version
    server_url = manifest.get("server")
    for info in data.inputs:
        if Path(info.path) == folder / MANIFEST:
            info.kind = KIND
            info.server_version = data.server_version
            info.records = len(manifest["pages"])
            info.notes = [
                f"collected by {manifest.get('tool')} from {server_url} (dstack "
                f"{data.server_version}) at {manifest.get('collected_at')}: "
                f"{len(manifest['pages'])} pages, every page's SHA-256 in this manifest"
            ]
    listed = {page.get("path") for page in manifest["pages"]}
    if {FLEETS_PATH, INSTANCES_PATH} <= listed:  # asked, even if every page came back empty
        data.has_fleet_tables = True
        data.limitations = [
            lim for lim in data.limitations if lim.code != "api_instances_list_missing"
        ]
    problems = check_pages(folder, manifest)
    if problems:
        data.limitations.append(
            Limitation(
                "collection_altered",
                f"{len(problems)} difference(s) from the collection's manifest, e.g. "
                f"{problems[0]}: the folder is not the snapshot collect wrote "
                "(`dstack-audit verify` lists them)",
                str(folder),
            )
        )
    data.limitations.append(
        Limitation(
            "api_live_snapshot",
            f"asked from {server_url} (dstack {data.server_version}) at "
            f"{manifest.get('collected_at')}: the API shows the server's state at that moment "
            "(runs still active may change later; events can be committed after their "
            "recorded_at and show up later); runs whose stored JSON the server cannot validate "
            "are left out of the runs list by the server itself; events older than the "
            "server's events TTL are gone",
            str(folder),
        )
    )
    return data


def _claims(given: str) -> bool:
    return LIVE_URL.match(given) is not None


def _load(given: str, ctx: LoadContext) -> SourceData:
    """A live URL claimed, or a collected folder sniffed."""
    if _claims(given):
        return load_server(given, ctx)
    return load_collection(Path(given), ctx.server)


SOURCE = InputKind(kind=KIND, load=_load, sniff=_sniff, claims=_claims)


def verify_collection(folder: Path) -> Verification:
    """`dstack-audit verify DIR` for a collected folder: every page as its manifest recorded
    it, nothing missing, nothing added (then the folder is the snapshot collect wrote)."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise AuditInputError(str(folder), "not a folder written by dstack-audit collect")
    result = Verification()
    for problem in check_pages(folder, manifest):
        result.differ(problem)
    if result.same:
        result.lines.append(
            f"verified: {len(manifest['pages'])} page(s) unchanged, as collected from "
            f"{manifest.get('server')} (dstack {manifest.get('dstack_version')}) at "
            f"{manifest.get('collected_at')}"
        )
    return result
