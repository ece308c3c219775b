"""Collect a running dstack server's REST API into a folder the API export source reads.

Only read-only calls (reference sections 8.3 and 10): `server/get_info`, `projects/list`, the
runs list (every page, deleted runs included: `only_active` false), `runs/get` by id for every
listed run (all submissions, deleted runs too), the events list within each project (every
page), and each project's fleets and instances lists (every page, deleted ones included).
Every answer is written byte for byte as the server sent it, one file per page, in the layout
of the bundled API exports (`samples/v0.22.5/seed/api/`), with a manifest: the server, its
version, when, every request and the SHA-256 of every page. Never the token.

The folder appears only when the collection is complete: pages go to a hidden sibling first,
which is renamed at the end and removed on any failure, so a half-collected folder is never
passed off as a snapshot. `httpx` is imported here only, when a server is asked.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from analyzer._version import __version__
from analyzer.errors import AuditInputError

MANIFEST = "manifest.json"
GENERATED_BY = "dstack-audit collect"
PAGE_LIMIT = (
    100  # the runs and events lists' maximum page size (ListRunsRequest, ListEventsRequest)
)
PROJECTS_LIMIT = 2000  # ListProjectsRequest's default and maximum
CONCURRENCY = 4  # requests in flight at once: a shared server is not a benchmark target
TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
ATTEMPTS = 4  # one try and three retries, 0.5 s, 1 s, 2 s apart
BACKOFF_S = 0.5
RETRY_STATUSES = {429, 500, 502, 503, 504}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def display_url(url: str) -> str:
    """The URL as it may be shown and kept: no user, no password, no query, no trailing /."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _reason(error: Exception) -> str:
    """One line saying why a request failed, from httpx's exception chain (never a header)."""
    import ssl

    import httpx

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate not accepted ({cause.verify_message or cause.reason})"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failure ({cause.reason or cause})"
        cause = cause.__cause__ or cause.__context__
    if isinstance(error, httpx.TimeoutException):
        return f"no answer within {TIMEOUT_S:.0f} s ({type(error).__name__})"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "SSL" in text or "TLS" in text:
        return f"TLS failure ({text})"
    return f"cannot reach the server ({text})"


@dataclass
class Page:
    """One answer of the server: where its bytes were written, and what it was."""

    file: str
    path: str
    body: dict[str, Any] | None
    status: int
    bytes: int
    sha256: str
    items: int | None

    def record(self) -> dict[str, Any]:
        return {
            "method": "POST",
            "path": self.path,
            "body": self.body,
            "status": self.status,
            "file": self.file,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "items": self.items,
        }


class Server:
    """A dstack server reached through its REST API with one bearer token (read-only calls)."""

    def __init__(self, url: str, token: str | None, *, timeout: float = TIMEOUT_S) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.label = display_url(url)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # No X-API-VERSION header: the server then answers in its own (latest) shapes, never
        # patched for an old client, and never refuses a client newer than itself.
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(max_connections=CONCURRENCY),
            follow_redirects=False,
        )
        self.requests = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict[str, Any] | None, *, retries: bool = True):
        """POST with retries on connection errors and 5xx (backoff 0.5 s, 1 s, 2 s)."""
        import httpx

        attempts = ATTEMPTS if retries else 1
        for attempt in range(attempts):
            with self._lock:
                self.requests += 1
            try:
                response = self._client.post(self.url + path, json=body)
            except httpx.TransportError as error:
                reason = _reason(error)
                if reason.startswith("TLS"):  # trying again will not change a certificate
                    raise AuditInputError(self.label, f"POST {path}: {reason}") from None
                if attempt + 1 == attempts:
                    raise AuditInputError(
                        self.label,
                        f"POST {path}: {reason}"
                        + (f" after {attempts} tries" if attempts > 1 else ""),
                        "check the URL and that the server is up",
                    ) from None
            else:
                if response.status_code not in RETRY_STATUSES or attempt + 1 == attempts:
                    return response
            time.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def info(self) -> tuple[str | None, Any]:
        """(server_version, the answer's bytes), or (None, why not) when no dstack server
        answered. get_info needs no token, so any refusal here means it is not one."""
        response = self.post("/api/server/get_info", None, retries=False)
        if response.status_code != 200:
            return None, f"POST /api/server/get_info answered HTTP {response.status_code}"
        try:
            doc = response.json()
        except ValueError:
            return None, "POST /api/server/get_info did not answer JSON"
        if not isinstance(doc, dict) or "server_version" not in doc:
            return None, "POST /api/server/get_info answered JSON without server_version"
        return str(doc["server_version"] or "unknown"), response.content

    def call(self, path: str, body: dict[str, Any] | None) -> tuple[bytes, Any]:
        """One authenticated call: the answer's bytes and parsed JSON, or a one-line error."""
        response = self.post(path, body)
        status = response.status_code
        if status in (401, 403):
            raise AuditInputError(
                self.label,
                f"the server refused the token (HTTP {status} on POST {path})",
                "give a valid user token with DSTACK_TOKEN or --token",
            )
        if status == 404:
            raise AuditInputError(
                self.label,
                f"POST {path} answered HTTP 404: not a dstack server API (or the project or "
                "run went away during the collection)",
            )
        if status != 200:
            raise AuditInputError(self.label, f"POST {path} answered HTTP {status}", "try later")
        try:
            return response.content, response.json()
        except ValueError:
            raise AuditInputError(self.label, f"POST {path} did not answer JSON") from None


SERVER_INFO_FILE = "server_get_info.json"
FLEETS_PATH = "/api/fleets/list"
INSTANCES_PATH = "/api/instances/list"


@dataclass
class Collection:
    """What one collection brought back (the pages are in its folder)."""

    url: str
    server_version: str
    started: datetime
    finished: datetime | None = None
    pages: list[Page] = field(default_factory=list)
    requests: int = 0
    projects: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        end = self.finished or datetime.now(UTC)
        return (end - self.started).total_seconds()

    @property
    def bytes(self) -> int:
        return sum(page.bytes for page in self.pages)


def _runs_body(project: str, limit: int, last: dict | None) -> dict[str, Any]:
    return {
        "project_name": project,
        "only_active": False,  # false keeps finished and deleted runs
        "include_jobs": True,
        "job_submissions_limit": 10,
        "prev_submitted_at": last["submitted_at"] if last else None,
        "prev_run_id": last["id"] if last else None,
        "limit": limit,
        "ascending": False,
    }


def _events_body(project_id: str, limit: int, last: dict | None) -> dict[str, Any]:
    return {
        "within_projects": [project_id],
        "prev_recorded_at": last["recorded_at"] if last else None,
        "prev_id": last["id"] if last else None,
        "limit": limit,
        "ascending": True,
    }


def _list_of(server: Server, path: str, doc: Any) -> list:
    if not isinstance(doc, list):
        raise AuditInputError(server.label, f"POST {path} did not answer a list")
    return doc


class _Collector:
    """Writes each page into `folder` as it arrives (memory holds one page per request)."""

    def __init__(
        self,
        server: Server,
        folder: Path,
        limit: int,
        on_page: Callable[[Page], None] | None,
    ) -> None:
        self.server = server
        self.folder = folder
        self.limit = limit
        self.on_page = on_page
        self.pages: list[Page] = []
        self._lock = threading.Lock()

    def keep(self, file: str, path: str, body: dict | None, content: bytes, doc: Any) -> None:
        target = self.folder / file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        items = len(doc) if isinstance(doc, list) else None
        digest = hashlib.sha256(content).hexdigest()
        page = Page(file, path, body, 200, len(content), digest, items)
        with self._lock:
            self.pages.append(page)
        if self.on_page is not None:
            self.on_page(page)

    def fetch(self, file: str, path: str, body: dict | None) -> Any:
        content, doc = self.server.call(path, body)
        self.keep(file, path, body, content, doc)
        return doc

    def runs(self, project: str) -> list[tuple[str, str]]:
        """(id, name) of every run of the project. A page can come back short (the server skips
        runs whose stored JSON it cannot validate), so only an empty page ends the list."""
        found: list[tuple[str, str]] = []
        last = None
        for number in range(1, 1_000_000):
            file = f"runs_list/{_SAFE.sub('_', project)}/page-{number:03d}.json"
            body = _runs_body(project, self.limit, last)
            doc = _list_of(self.server, "/api/runs/list", self.fetch(file, "/api/runs/list", body))
            if not doc:
                break
            found.extend((r["id"], (r.get("run_spec") or {}).get("run_name") or "run") for r in doc)
            last = doc[-1]
        return found

    def events(self, project: str, project_id: str) -> None:
        """Every event within the project, oldest first (no event is ever skipped by the
        server, so a short page is the last)."""
        last = None
        for number in range(1, 1_000_000):
            file = f"events_list/within_project/{_SAFE.sub('_', project)}/page-{number:03d}.json"
            body = _events_body(project_id, self.limit, last)
            path = "/api/events/list"
            doc = _list_of(self.server, path, self.fetch(file, path, body))
            if len(doc) < self.limit:
                break
            last = doc[-1]

    def paged(self, folder: str, path: str, body: dict[str, Any], project: str) -> None:
        """Every page of a list ordered by (created_at, id), oldest first: `/api/fleets/list`
        (deleted fleets too: `only_active` false) and `/api/instances/list` (deleted instances
        too), whose `prev_created_at`/`prev_id` continue after the last item. The instance
        field is `created`, the fleet's `created_at`; a short page is the last."""
        last = None
        for number in range(1, 1_000_000):
            file = f"{folder}/{_SAFE.sub('_', project)}/page-{number:03d}.json"
            cursor = {
                "prev_created_at": (last.get("created_at") or last.get("created"))
                if last
                else None,
                "prev_id": last["id"] if last else None,
            }
            page = {**body, **cursor, "limit": self.limit, "ascending": True}
            doc = _list_of(self.server, path, self.fetch(file, path, page))
            if len(doc) < self.limit:
                break
            last = doc[-1]

    def fleets(self, project: str) -> None:
        """The project's fleets (spec without SSH keys, instances not deleted) and every
        instance, for the fleets' room at T (exposure)."""
        self.paged(
            "fleets_list",
            FLEETS_PATH,
            {"project_name": project, "only_active": False, "include_imported": False},
            project,
        )
        self.paged(
            "instances_list",
            INSTANCES_PATH,
            {"project_names": [project], "only_active": False, "include_imported": False},
            project,
        )

    def run(self, project: str, run_id: str, name: str) -> None:
        """runs/get by id: every submission of every job, deleted runs included."""
        file = f"runs_get/{_SAFE.sub('_', project)}/{_SAFE.sub('_', name)}-{run_id[:6]}.json"
        self.fetch(file, f"/api/project/{project}/runs/get", {"run_name": None, "id": run_id})


def collect_into(
    url: str,
    token: str | None,
    folder: Path,
    *,
    project: str | None = None,
    page_size: int = PAGE_LIMIT,
    concurrency: int = CONCURRENCY,
    on_page: Callable[[Page], None] | None = None,
) -> Collection:
    """Ask the server everything an audit needs and write it into `folder` (a new, private
    folder: on failure the caller removes it); the manifest is written last."""
    server = Server(url, token)
    try:
        version, info = server.info()
        if version is None:
            raise AuditInputError(
                server.label, f"not a dstack server ({info})", "give the server's base URL"
            )
        result = Collection(server.label, version, datetime.now(UTC))
        folder.mkdir(parents=True, exist_ok=True)
        collector = _Collector(server, folder, page_size, on_page)
        collector.keep(SERVER_INFO_FILE, "/api/server/get_info", None, info, None)
        path = "/api/projects/list"
        projects = _list_of(
            server, path, collector.fetch("projects_list.json", path, {"include_not_joined": True})
        )
        if len(projects) >= PROJECTS_LIMIT:
            raise AuditInputError(
                server.label,
                f"the token sees {len(projects)} projects, more than one projects page",
                "audit them one at a time with --project",
            )
        chosen = [p for p in projects if project is None or p.get("project_name") == project]
        if project is not None and not chosen:
            seen = ", ".join(sorted(str(p.get("project_name")) for p in projects)) or "none"
            raise AuditInputError(
                server.label, f"no project {project!r} for this token (it sees: {seen})"
            )
        result.projects = [p["project_name"] for p in chosen]
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            listed = {
                p["project_name"]: pool.submit(collector.runs, p["project_name"]) for p in chosen
            }
            waits = [
                pool.submit(collector.events, p["project_name"], p["project_id"]) for p in chosen
            ]
            waits.extend(pool.submit(collector.fleets, p["project_name"]) for p in chosen)
            for name, future in listed.items():
                waits.extend(pool.submit(collector.run, name, *run) for run in future.result())
            for future in waits:
                future.result()
        result.pages = sorted(collector.pages, key=lambda p: _page_order(p.file))
        result.requests = server.requests
        result.finished = datetime.now(UTC)
        text = json.dumps(manifest(result, page_size=page_size, project=project), indent=1)
        (folder / MANIFEST).write_text(text + "\n", encoding="utf-8")
        return result
    finally:
        server.close()


def _page_order(file: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", file))


def manifest(result: Collection, *, page_size: int, project: str | None) -> dict[str, Any]:
    import httpx

    endpoints: dict[str, int] = {}
    for page in result.pages:
        key = "/api/project/{project}/runs/get" if page.path.endswith("/runs/get") else page.path
        endpoints[key] = endpoints.get(key, 0) + 1
    return {
        "generated_by": GENERATED_BY,
        "tool": f"dstack-audit {__version__}",
        "client": f"httpx {httpx.__version__}",
        "server": result.url,
        "dstack_version": result.server_version,
        "collected_at": result.started.isoformat(),
        "finished_at": result.finished.isoformat() if result.finished else None,
        "elapsed_s": round(result.seconds, 3),
        "auth": "a bearer user token (DSTACK_TOKEN, --token or ~/.dstack/config.yml); not stored",
        "options": {"project": project, "page_size": page_size},
        "projects": result.projects,
        "endpoints": endpoints,
        "requests_sent": result.requests,
        "complete": True,
        "pages": [{"seq": seq, **page.record()} for seq, page in enumerate(result.pages, 1)],
    }


def collect(
    url: str,
    target: Path,
    token: str | None,
    *,
    project: str | None = None,
    page_size: int = PAGE_LIMIT,
    concurrency: int = CONCURRENCY,
    on_page: Callable[[Page], None] | None = None,
) -> Collection:
    """Collect into `target`, which appears only once complete (see the module's docstring)."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise AuditInputError(
            str(target), "already exists and is not empty", "collect into a new folder"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        result = collect_into(
            url,
            token,
            staging / "pages",
            project=project,
            page_size=page_size,
            concurrency=concurrency,
            on_page=on_page,
        )
        if target.exists():
            target.rmdir()
        (staging / "pages").rename(target)
    except AuditInputError as error:
        raise AuditInputError(
            error.source, f"{error.problem}; nothing was written to {target}", error.hint
        ) from None
    except OSError as error:
        raise AuditInputError(
            str(target), f"cannot write the collection ({error.strerror or error})"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result
