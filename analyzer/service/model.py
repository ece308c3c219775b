"""The guard's live model of a dstack server: the fleets (with their instances) and the active
runs of every project, refreshed in the background, one refresh at a time.

A decision is then a lookup (milliseconds) and a burst of applies costs the server nothing. The
model knows its age: a decision on a model older than the bound is `unknown` and answered per
`--on-unknown`. Only the read-only endpoints of `ENDPOINTS` are ever called, with names checked
against dstack's own rules and every path segment quoted.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from analyzer.service.guard import PROJECT_NAME, decide

# Every path the guard may call, all read-only POSTs of dstack 0.22.5's API (`{project}` is a
# name checked against PROJECT_NAME, then quoted).
ENDPOINTS = (
    "/api/server/get_info",
    "/api/projects/list",
    "/api/project/{project}/fleets/list",
    "/api/runs/list",
)
PAGE = 100  # runs/list's largest page (dstack 0.22.5 `ListRunsRequest.limit`)
CALL_TIMEOUT_S = 10.0
REFRESH_LIMIT_S = 60.0  # a refresh as a whole; a server dripping past it fails the refresh


@dataclass(frozen=True)
class Snapshot:
    """What one refresh read: per project its fleets and its active runs."""

    taken: float  # time.monotonic() when the refresh began
    at: datetime
    version: str | None
    fleets: dict[str, list[dict]] = field(default_factory=dict)
    runs: dict[str, list[dict]] = field(default_factory=dict)
    exposure: dict[tuple[str, str], bool] = field(default_factory=dict)  # see exposure()

    def run(self, project: str, name: str) -> dict | None:
        return next(
            (r for r in self.runs.get(project, []) if _run_name(r) == name),
            None,
        )


def exposure(snapshot: Snapshot) -> dict[tuple[str, str], bool]:
    """(project, service) -> whether any rolling update of that running service would be
    refused now (no room for its surge replica while healthy replicas are at stake). Worked
    out once per refresh, in the refresher's thread, never on a scrape."""
    found = {}
    for project, runs in snapshot.runs.items():
        for run in runs:
            spec = run.get("run_spec") or {}
            if (spec.get("configuration") or {}).get("type") != "service":
                continue
            if run.get("status") != "running":
                continue
            rollout = copy.deepcopy(spec)
            rollout["repo_code_hash"] = f"{spec.get('repo_code_hash')}+rollout"
            others = [r for r in runs if r is not run]
            fleets = snapshot.fleets.get(project, [])
            verdict = decide(rollout, run, fleets, others, snapshot.version, snapshot.at)
            found[(project, str(spec.get("run_name")))] = verdict.decision == "reject"
    return found


def _run_name(run: dict) -> str | None:
    return (run.get("run_spec") or {}).get("run_name")


class ServerModel:
    """The model and its refresher. `refresh()` is serialized by a lock; `start()` runs it
    every `every` seconds in a daemon thread until `stop()`."""

    def __init__(self, url: str, token: str, every: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.every = every
        self.snapshot: Snapshot | None = None
        self.failure: str | None = None  # the last refresh's error (its type and first line)
        self.refreshes = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def age(self) -> float | None:
        """Seconds since the current snapshot's refresh began (None before the first)."""
        return None if self.snapshot is None else time.monotonic() - self.snapshot.taken

    def refresh(self) -> Snapshot:
        """One read of the server through the collector's reader, the one that bounds every
        answer in bytes (decoded ones too), in time, and a refresh as a whole in time."""
        from analyzer.sources.collect import Server

        with self._lock:
            server = Server(
                self.url, self.token, timeout=CALL_TIMEOUT_S, time_limit=REFRESH_LIMIT_S
            )
            try:

                def call(template: str, body: dict | None, project: str = "") -> Any:
                    if template not in ENDPOINTS:
                        raise ValueError(f"{template} is not an endpoint the guard may call")
                    path = template.replace("{project}", quote(project, safe=""))
                    return server.call(path, body, retries=False)[1]  # the next refresh retries

                taken, at = time.monotonic(), datetime.now(UTC)
                version = (call(ENDPOINTS[0], None) or {}).get("server_version")
                names = [str(p.get("project_name")) for p in call(ENDPOINTS[1], {}) or []]
                fleets, runs = {}, {}
                # a name dstack's rules refuse never reaches a URL (its applies are undecided)
                for name in filter(PROJECT_NAME.fullmatch, names):
                    fleets[name] = call(ENDPOINTS[2], {}, name) or []
                    runs[name] = _active_runs(lambda body: call(ENDPOINTS[3], body), name)
            finally:
                server.close()
            snapshot = Snapshot(taken, at, version, fleets, runs)
            self.snapshot = replace(snapshot, exposure=exposure(snapshot))
            self.refreshes += 1
            return self.snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="guard-model", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)  # a daemon: a refresh under way dies with the process

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.refresh()
                self.failure = None
            except Exception as error:  # kept for /healthz and the decisions' reason
                self.failures += 1
                said = (str(error).splitlines() or [""])[0][:200]
                self.failure = f"{type(error).__name__}: {said}"


def _active_runs(call, project: str) -> list[dict]:
    """Every active run of the project with its jobs' latest submission, page by page
    (newest first; the next page starts after the last run of this one)."""
    body: dict[str, Any] = {
        "project_name": project,
        "only_active": True,
        "limit": PAGE,
        "job_submissions_limit": 1,
    }
    runs: list[dict] = []
    seen: set[str] = set()
    while True:
        page = call(body) or []
        fresh = [r for r in page if str(r.get("id")) not in seen]
        runs.extend(fresh)
        seen.update(str(r.get("id")) for r in fresh)
        if len(page) < PAGE or not fresh:
            return runs
        last = page[-1]
        body = body | {"prev_submitted_at": last.get("submitted_at"), "prev_run_id": last["id"]}
