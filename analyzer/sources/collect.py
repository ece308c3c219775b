"""Collect a running dstack server's REST API into a folder the API export source reads.

Only read-only calls (reference sections 8.3 and 10): `server/get_info`, `projects/list`, the
runs list (every page, deleted runs included: `only_active` false), `runs/get` by id for every
listed run (all submissions, deleted runs too), the events list within each project (every
page), and each project's fleets and instances lists (every page, deleted ones included).
Every answer is written byte for byte as the server sent it, one file per page, in the layout
of the bundled API exports (`samples/v0.22.5/seed/api/`), with a manifest: the server, its
version, when, every request and the SHA-256 of every page. Never the token.

The folder appears only when the collection is complete: pages go to a hidden sibling first,
which is renamed at the end and removed on any failure (the CLI turns SIGTERM and SIGHUP into an
exception, so a killed run removes it too), so a half-collected folder is never passed off as a
snapshot. `httpx` is imported here only, when a server is asked.

The server is a peer that may be hostile (docs/threat-model.md): every answer is read as a
stream and refused past MAX_ANSWER_BYTES (decoded, each inflate call bounded:
sources/inflate.py), each must arrive whole within ANSWER_DEADLINE_S and the whole collection
within its time limit and its size on disk (SIZE_LIMIT_BYTES), a list is followed for at most
MAX_PAGES pages and never past a page whose cursor it has already seen, every listed item must
be an object with the fields the cursor needs, and the token is refused before it is sent when
it is not one line of visible ASCII (an error could otherwise quote it). A token the server
echoes is masked in the pages before they are written or hashed, and the manifest says so.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from analyzer._version import __version__
from analyzer.errors import AuditInputError
from analyzer.interrupts import STOPS
from analyzer.sources.inflate import ACCEPTED, CodingError, Inflater

MANIFEST = "manifest.json"
GENERATED_BY = "dstack-audit collect"
PAGE_LIMIT = (
    100  # the runs and events lists' maximum page size (ListRunsRequest, ListEventsRequest)
)
PROJECTS_LIMIT = 2000  # ListProjectsRequest's default and maximum
CONCURRENCY = 4  # requests in flight at once: a shared server is not a benchmark target
TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
ANSWER_DEADLINE_S = 300.0  # one answer, whole, even when every byte comes before the read timeout
TIME_LIMIT_S = 3600.0  # the whole collection (collect --time-limit)
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # one page of 100 runs is far smaller; never held past this
MAX_PAGES = 100_000  # of one list (10 million runs or events at 100 a page)
# the whole collection on disk (collect --size-limit): a run of a dstack 0.22 server is ~17 KB
# (its runs-list item and its runs/get answer), so this holds some 400,000 runs with events
SIZE_LIMIT_BYTES = 8192 * 2**20  # collect --size-limit 8192 (MiB)
ATTEMPTS = 4  # one try and three retries, 0.5 s, 1 s, 2 s apart
BACKOFF_S = 0.5
RETRY_STATUSES = {429, 500, 502, 503, 504}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
PROJECT_NAME = re.compile(r"[a-zA-Z0-9-_]{1,50}")  # dstack services/projects.is_valid_project_name
_TOKEN_CHARACTERS = re.compile(r"[!-~]+")  # visible ASCII: what an HTTP header may carry as is
ECHO_MASK = b"***"


def check_token(label: str, token: str) -> None:
    """Refuse a token that cannot be sent as a header, naming what is wrong and where, but
    never the token or any part of it (httpx's own error would quote the header)."""
    if _TOKEN_CHARACTERS.fullmatch(token):
        return
    place, character = next(
        (i, c) for i, c in enumerate(token, 1) if not _TOKEN_CHARACTERS.fullmatch(c)
    )
    if character in "\r\n":
        kind = "a line break"
    elif character.isspace():
        kind = "a space"
    elif ord(character) < 32 or ord(character) == 127:
        kind = "a control character"
    else:
        kind = "a non-ASCII character"
    raise AuditInputError(
        label,
        f"the token has {kind} at character {place} of {len(token)}: a dstack token is one "
        "line of visible ASCII (a UUID)",
        "give the token alone, e.g. DSTACK_TOKEN=$(cat token-file)",
    )


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


class Stopped(Exception):
    """The collection was stopped (a signal, another request's failure): no more requests."""


@dataclass
class Answer:
    """One HTTP answer, read whole within the limits."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


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
    """A dstack server reached through its REST API with one bearer token (read-only calls),
    read as a peer that may be hostile: see the module's docstring for the limits."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = TIMEOUT_S,
        time_limit: float = TIME_LIMIT_S,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.label = display_url(url)
        headers = {"Accept": "application/json", "Accept-Encoding": ACCEPTED}
        if token:
            check_token(self.label, token)
            headers["Authorization"] = f"Bearer {token}"
        self.token = token
        # No X-API-VERSION header: the server then answers in its own (latest) shapes, never
        # patched for an old client, and never refuses a client newer than itself.
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(max_connections=CONCURRENCY),
            follow_redirects=False,  # a redirect to another host never gets the token
        )
        self.timeout = timeout
        self.time_limit = time_limit
        self.deadline = time.monotonic() + time_limit
        self.max_bytes = max_bytes
        self.requests = 0
        self.echoed: set[str] = set()  # what was asked where the answer held the token
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()  # every connection opened

    def close(self) -> None:
        self._client.close()

    def stop(self) -> None:
        """No further request, and every request on its way ends now: its connection is shut
        down, which wakes a thread waiting on it. Closing it would not: a read already waiting
        on a closed socket waits out its read timeout, 30 s after a Ctrl-C (seen: a peer that
        had not answered yet held the process that long)."""
        self._stopped.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            _shut_down(stream)

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace extension: each new connection's stream is kept (weakly), for
        `stop`, and its TLS stream, which replaces it; one made after the stop is shut down at
        once."""
        if event not in _CONNECTED or info.get("return_value") is None:
            return
        stream = info["return_value"]
        with self._lock:
            self._streams.add(stream)
        if self.stopped:
            _shut_down(stream)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _over_time(self, path: str) -> AuditInputError:
        return AuditInputError(
            self.label,
            f"POST {path}: the collection did not finish within its time limit of "
            f"{self.time_limit:g} s",
            "give a longer --time-limit, or --project to collect one project",
        )

    def _read(self, path: str, body: dict[str, Any] | None) -> Answer:
        """Send one request and read its answer as a stream, within the byte and time limits
        (a peer sending one byte every few seconds never holds it past the deadlines)."""
        import httpx

        started = time.monotonic()
        until = min(self.deadline, started + ANSWER_DEADLINE_S)
        wait = max(0.001, min(self.timeout, until - started))
        request = self._client.build_request(
            "POST",
            self.url + path,
            json=body,
            timeout=httpx.Timeout(wait, connect=min(wait, CONNECT_TIMEOUT_S)),
            extensions={"trace": self._trace},
        )
        response = self._client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise self._too_big(path, int(declared))
            inflater = Inflater(response.headers.get("content-encoding", ""))
            content = bytearray()
            for chunk in response.iter_raw():  # decoded here, each call bounded (inflate.py)
                for piece in inflater.feed(chunk):
                    if self.stopped:
                        raise Stopped(path)
                    content += piece
                    if len(content) > self.max_bytes:
                        raise self._too_big(path)
                    if time.monotonic() > until:
                        raise self._too_slow(path)
            if self.stopped:  # an answer the stop cut short is never taken as whole
                raise Stopped(path)
            inflater.end()
            return Answer(response.status_code, self._unechoed(path, bytes(content)))
        except CodingError as error:
            raise AuditInputError(self.label, f"POST {path} {error}") from None
        except httpx.TimeoutException:
            if time.monotonic() >= until - 0.01:
                raise self._too_slow(path) from None
            raise
        finally:
            response.close()

    def _too_big(self, path: str, announced: int | None = None) -> AuditInputError:
        cap = (
            f"the {self.max_bytes / 2**20:g} MiB an answer may hold (a dstack page is far smaller)"
        )
        if announced is not None:
            problem = f"announced an answer of {announced} bytes, more than {cap}: refused unread"
        else:
            problem = f"sent more than {cap}: refused, not read further"
        return AuditInputError(self.label, f"POST {path} {problem}")

    def _too_slow(self, path: str) -> AuditInputError:
        if time.monotonic() >= self.deadline - 0.01:
            return self._over_time(path)
        return AuditInputError(
            self.label,
            f"POST {path}: the answer did not arrive whole within {ANSWER_DEADLINE_S:g} s",
            "the server or the network is too slow, or the server is not a dstack server",
        )

    def _unechoed(self, path: str, content: bytes) -> bytes:
        """The answer with the token masked, where a server put it back (never on disk)."""
        if not self.token:
            return content
        forms = {self.token.encode(), json.dumps(self.token)[1:-1].encode()}
        if not any(form in content for form in forms):
            return content
        self.echoed.add(path)
        for form in sorted(forms, key=len, reverse=True):
            content = content.replace(form, ECHO_MASK)
        return content

    def post(self, path: str, body: dict[str, Any] | None, *, retries: bool = True) -> Answer:
        """POST with retries on connection errors and 5xx (backoff 0.5 s, 1 s, 2 s)."""
        import httpx

        attempts = ATTEMPTS if retries else 1
        for attempt in range(attempts):
            if self.stopped:
                raise Stopped(path)
            if time.monotonic() >= self.deadline:
                raise self._over_time(path)
            with self._lock:
                self.requests += 1
            try:
                response = self._read(path, body)
            except httpx.HTTPError as error:
                if self.stopped:  # its connection was shut down by the stop
                    raise Stopped(path) from None
                reason = _reason(error)
                if reason.startswith("TLS"):  # trying again will not change a certificate
                    raise AuditInputError(self.label, f"POST {path}: {reason}") from None
                if attempt + 1 == attempts or not isinstance(error, httpx.TransportError):
                    raise AuditInputError(
                        self.label,
                        f"POST {path}: {reason}"
                        + (f" after {attempt + 1} tries" if attempt else ""),
                        "check the URL and that the server is up",
                    ) from None
            else:
                if response.status_code not in RETRY_STATUSES or attempt + 1 == attempts:
                    return response
            self._stopped.wait(
                max(0.0, min(BACKOFF_S * 2**attempt, self.deadline - time.monotonic()))
            )
        raise AssertionError("unreachable")

    def info(self) -> tuple[str | None, Any]:
        """(server_version, the answer's bytes), or (None, why not) when no dstack server
        answered. get_info needs no token, so any refusal here means it is not one."""
        response = self.post("/api/server/get_info", None, retries=False)
        if response.status_code != 200:
            return None, f"POST /api/server/get_info answered HTTP {response.status_code}"
        try:
            doc = response.json()
        except (ValueError, RecursionError):
            return None, "POST /api/server/get_info did not answer JSON"
        if not isinstance(doc, dict) or "server_version" not in doc:
            return None, "POST /api/server/get_info answered JSON without server_version"
        version = doc["server_version"]
        if not isinstance(version, str | None) or not re.fullmatch(r"[\w.+-]{0,64}", version or ""):
            return None, "POST /api/server/get_info answered a server_version that is no version"
        return str(version or "unknown"), response.content

    def call(
        self, path: str, body: dict[str, Any] | None, *, retries: bool = True
    ) -> tuple[bytes, Any]:
        """One authenticated call: the answer's bytes and parsed JSON, or a one-line error."""
        response = self.post(path, body, retries=retries)
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
        except RecursionError:
            raise AuditInputError(
                self.label, f"POST {path} answered JSON nested too deep to read"
            ) from None
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
    echoed: list[str] = field(default_factory=list)  # calls whose answers held the token

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


def _objects(server: Server, path: str, page: int, doc: Any, fields: tuple[str, ...]) -> list:
    """A list page whose every item is an object holding `fields` as text (what the next
    page's cursor and the files' names are made of), or one line naming the first that is not."""
    for number, item in enumerate(_list_of(server, path, doc), 1):
        missing = (
            "is not an object"
            if not isinstance(item, dict)
            else next(
                (f"has no text {name!r}" for name in fields if not isinstance(item.get(name), str)),
                None,
            )
        )
        if missing:
            raise AuditInputError(server.label, f"POST {path} page {page}: item {number} {missing}")
    return doc


class _Pages:
    """The pages of one list: at most MAX_PAGES, and never a cursor seen before (a server that
    ignores the cursor would otherwise be followed for ever)."""

    def __init__(self, server: Server, path: str, limit: int) -> None:
        self.server = server
        self.path = path
        self.limit = limit
        self.cursors: set[tuple[str, ...]] = set()

    def numbers(self):
        yield from range(1, self.limit + 1)
        raise AuditInputError(
            self.server.label,
            f"POST {self.path} has more than {self.limit} pages: stopped (no dstack server "
            "holds that many; the server may be paging for ever)",
            "collect one project at a time with --project",
        )

    def advance(self, page: int, cursor: tuple[str, ...]) -> None:
        if cursor in self.cursors:
            raise AuditInputError(
                self.server.label,
                f"POST {self.path} page {page} ends where an earlier page ended: the server "
                "repeats its pages instead of following the cursor; stopped",
            )
        self.cursors.add(cursor)


class _Collector:
    """Writes each page into `folder` as it arrives (memory holds one page per request)."""

    def __init__(
        self,
        server: Server,
        folder: Path,
        limit: int,
        on_page: Callable[[Page], None] | None,
        max_pages: int = MAX_PAGES,
        size_limit: int = SIZE_LIMIT_BYTES,
    ) -> None:
        self.server = server
        self.folder = folder
        self.limit = limit
        self.on_page = on_page
        self.max_pages = max_pages
        self.size_limit = size_limit
        self.written = 0
        self.pages: list[Page] = []
        self._lock = threading.Lock()

    def name(self, text: str) -> str:
        """A server's name as part of a file name: safe characters only, never the token."""
        if self.server.token:
            text = text.replace(self.server.token, ECHO_MASK.decode())
        return _SAFE.sub("_", text)

    def keep(self, file: str, path: str, body: dict | None, content: bytes, doc: Any) -> None:
        """Write one page; none once the collection is stopped (the lock lets a stop wait
        for the page being written, so nothing lands in a folder being removed), and none that
        would take the collection past its size limit (a server answering for ever)."""
        target = self.folder / file
        items = len(doc) if isinstance(doc, list) else None
        digest = hashlib.sha256(content).hexdigest()
        page = Page(file, path, body, 200, len(content), digest, items)
        with self._lock:
            if self.server.stopped:
                raise Stopped(path)
            if self.written + len(content) > self.size_limit:
                raise AuditInputError(
                    self.server.label,
                    f"POST {path}: the collection would pass its size limit of "
                    f"{self.size_limit} bytes ({self.written} written): stopped",
                    "give `dstack-audit collect` a larger --size-limit, or --project to collect "
                    "one project",
                )
            self.written += len(content)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            self.pages.append(page)
        if self.on_page is not None:
            self.on_page(page)

    def fetch(self, file: str, path: str, body: dict | None) -> Any:
        content, doc = self.server.call(path, body)
        self.keep(file, path, body, content, doc)
        return doc

    def stop(self) -> None:
        """Stop the server's requests and wait for a page being written."""
        self.server.stop()
        with self._lock:
            pass

    def runs(self, project: str) -> list[tuple[str, str]]:
        """(id, name) of every run of the project. A page can come back short (the server skips
        runs whose stored JSON it cannot validate), so only an empty page ends the list."""
        found: list[tuple[str, str]] = []
        last = None
        path = "/api/runs/list"
        pages = _Pages(self.server, path, self.max_pages)
        for number in pages.numbers():
            file = f"runs_list/{self.name(project)}/page-{number:03d}.json"
            body = _runs_body(project, self.limit, last)
            doc = self.fetch(file, path, body)
            doc = _objects(self.server, path, number, doc, ("id", "submitted_at"))
            if not doc:
                break
            for run in doc:
                spec = run.get("run_spec")
                name = spec.get("run_name") if isinstance(spec, dict) else None
                found.append((run["id"], name if isinstance(name, str) and name else "run"))
            last = doc[-1]
            pages.advance(number, (last["submitted_at"], last["id"]))
        return found

    def events(self, project: str, project_id: str) -> None:
        """Every event within the project, oldest first (no event is ever skipped by the
        server, so a short page is the last)."""
        last = None
        path = "/api/events/list"
        pages = _Pages(self.server, path, self.max_pages)
        for number in pages.numbers():
            file = f"events_list/within_project/{self.name(project)}/page-{number:03d}.json"
            body = _events_body(project_id, self.limit, last)
            doc = self.fetch(file, path, body)
            doc = _objects(self.server, path, number, doc, ("id", "recorded_at"))
            if len(doc) < self.limit:
                break
            last = doc[-1]
            pages.advance(number, (last["recorded_at"], last["id"]))

    def paged(self, folder: str, path: str, body: dict[str, Any], project: str) -> None:
        """Every page of a list ordered by (created_at, id), oldest first: `/api/fleets/list`
        (deleted fleets too: `only_active` false) and `/api/instances/list` (deleted instances
        too), whose `prev_created_at`/`prev_id` continue after the last item. The instance
        field is `created`, the fleet's `created_at`; a short page is the last."""
        last = None
        pages = _Pages(self.server, path, self.max_pages)
        for number in pages.numbers():
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
            if not isinstance(last, dict) or "id" not in last:
                raise AuditInputError(
                    self.server.label,
                    f"POST {path} page {number}: its last item has no id to continue after",
                )
            created = last.get("created_at") or last.get("created")
            pages.advance(number, (str(created), str(last["id"])))

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
        file = f"runs_get/{self.name(project)}/{self.name(name)}-{self.name(run_id[:6])}.json"
        self.fetch(file, f"/api/project/{project}/runs/get", {"run_name": None, "id": run_id})


_CONNECTED = ("connection.connect_tcp.complete", "connection.start_tls.complete")


def _shut_down(stream: Any) -> None:
    """Shut a connection down both ways (the socket's own shutdown, under TLS too: the TLS
    object is left to its reader), so that a read or write waiting on it returns now."""
    sock = stream.get_extra_info("socket")
    if sock is None:
        return
    with suppress(OSError):  # closed already, or never connected
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _request_thread() -> None:
    """A request thread never takes a stopping signal (`STOPS`): the kernel gives them to the
    main thread, whose wait on a page it interrupts (a signal taken by another thread would
    leave that wait asleep)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name) for name in STOPS})


@contextmanager
def _workers(collector: _Collector, concurrency: int) -> Iterator[ThreadPoolExecutor]:
    """A pool of requests that, when anything fails (a page, a signal), stops at once: queued
    requests are dropped, the requests on their way end (`Server.stop`) and nothing more is
    written. Their threads are waited for before the connections are closed, so none is
    closed under a thread still reading it."""
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), initializer=_request_thread)
    try:
        yield pool
    except BaseException:
        collector.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def collect_into(
    url: str,
    token: str | None,
    folder: Path,
    *,
    project: str | None = None,
    page_size: int = PAGE_LIMIT,
    concurrency: int = CONCURRENCY,
    on_page: Callable[[Page], None] | None = None,
    time_limit: float = TIME_LIMIT_S,
    max_pages: int = MAX_PAGES,
    size_limit: int = SIZE_LIMIT_BYTES,
) -> Collection:
    """Ask the server everything an audit needs and write it into `folder` (a new, private
    folder: on failure the caller removes it); the manifest is written last."""
    server = Server(url, token, time_limit=time_limit)
    try:
        version, info = server.info()
        if version is None:
            raise AuditInputError(
                server.label, f"not a dstack server ({info})", "give the server's base URL"
            )
        result = Collection(server.label, version, datetime.now(UTC))
        folder.mkdir(parents=True, exist_ok=True)
        collector = _Collector(server, folder, page_size, on_page, max_pages, size_limit)
        collector.keep(SERVER_INFO_FILE, "/api/server/get_info", None, info, None)
        path = "/api/projects/list"
        projects = _objects(
            server,
            path,
            1,
            collector.fetch("projects_list.json", path, {"include_not_joined": True}),
            ("project_name", "project_id"),
        )
        named = next((p for p in projects if not PROJECT_NAME.fullmatch(p["project_name"])), None)
        if named is not None:
            raise AuditInputError(
                server.label,
                f"POST {path} answered a project name dstack never gives "
                f"({_SAFE.sub('?', named['project_name'][:60])!r}): not collected",
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
        with _workers(collector, concurrency) as pool:
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
        result.echoed = sorted(server.echoed)
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
        **(
            {
                "token_echoed": f"the server put the token back in its answers to "
                f"{', '.join(result.echoed)}: masked as *** in those pages before they were "
                "written and hashed"
            }
            if result.echoed
            else {}
        ),
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
    time_limit: float = TIME_LIMIT_S,
    max_pages: int = MAX_PAGES,
    size_limit: int = SIZE_LIMIT_BYTES,
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
            time_limit=time_limit,
            max_pages=max_pages,
            size_limit=size_limit,
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
