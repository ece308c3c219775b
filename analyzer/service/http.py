"""The guard's HTTP face: an ASGI app under uvicorn, made to sit in the path of every
`dstack apply` (dstack fails closed: while the guard does not answer, no apply passes).

- The caller proves it is the dstack server: dstack's rest_plugin posts with `requests` to
  `{DSTACK_PLUGIN_SERVICE_URI}{endpoint}`, and `requests` sends a URI's user-info as Basic auth,
  so `http://dstack:SECRET@host:port` authenticates it; any other caller gets 401.
- A request is `{user, project, spec}` (`ApplyRequest`), at most `MAX_BODY` bytes, read within
  `BODY_TIMEOUT_S`; headers must arrive within `HEADER_TIMEOUT_S` (`_Protocol`); every bad
  request is one JSON log line and a 4xx JSON answer, never a traceback.
- A decision is a lookup in the live model (`analyzer.service.model`); the answer is the spec
  as received plus an error when refused. No env value, token or secret shape reaches a log
  line or a reason.
- `GET /healthz` (ready only while the model is fresh) and `GET /metrics` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from analyzer.redact import Redactor
from analyzer.service.guard import PROJECT_NAME, RUN_NAME, Verdict, decide
from analyzer.service.model import ServerModel

APPLY_ENDPOINTS = ("on_run_apply", "on_fleet_apply", "on_volume_apply", "on_gateway_apply")
MAX_BODY = 1024 * 1024  # a run spec is kilobytes; a megabyte leaves room for big env lists
BODY_TIMEOUT_S = 5.0
HEADER_TIMEOUT_S = 5.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 4096  # beyond it uvicorn answers 503 (dstack then refuses the apply)
BACKLOG = 4096
MAX_DEPTH = 64  # a dstack run spec nests about ten deep
MAX_NAME = 200  # a user name longer than this is no dstack user name


class ApplyRequest(BaseModel):
    """dstack 0.22.5 `SpecApplyRequest` as `rest_plugin` sends it (`model_dump` of
    `{user, project, spec}`)."""

    model_config = ConfigDict(extra="ignore")
    user: str
    project: str
    spec: dict[str, Any]

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not value or len(value) > MAX_NAME or not value.isprintable():
            raise ValueError("not a dstack user name")
        return value

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not PROJECT_NAME.fullmatch(value):
            raise ValueError("not a dstack project name (^[a-zA-Z0-9-_]{1,50}$)")
        return value

    @field_validator("spec")
    @classmethod
    def _spec(cls, value: dict[str, Any]) -> dict[str, Any]:
        name = value.get("run_name")
        if name is not None and not (isinstance(name, str) and RUN_NAME.fullmatch(name)):
            raise ValueError("run_name is not a dstack resource name (^[a-z][a-z0-9-]{1,40}$)")
        conf = value.get("configuration")
        if conf is not None and not isinstance(conf, dict):
            raise ValueError("configuration is not an object")
        return value


class BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Policy:
    """How the guard answers: --mode, --on-unknown, the bound on the model's age."""

    mode: str = "reject"
    on_unknown: str = "approve"
    max_age: float = 60.0


@dataclass
class Guard:
    """The state the app answers from: the model, the policy, the secret, the counters."""

    model: ServerModel
    policy: Policy
    secret: str
    redactor: Redactor
    decisions: Counter = field(default_factory=Counter)
    bad_requests: Counter = field(default_factory=Counter)
    undecided: int = 0  # of the decisions, those answered per --on-unknown
    out: Any = None  # where the JSON lines go (None: stderr)
    _log_lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, record: dict) -> None:
        line = json.dumps({"time": datetime.now(UTC).isoformat(), **record}, default=str)
        out = self.out or sys.stderr
        with self._log_lock:
            out.write(line + "\n")
            out.flush()

    def authentic(self, headers: dict[bytes, bytes]) -> bool:
        """Basic auth whose password is the secret (any user name: dstack sends the URI's)."""
        value = headers.get(b"authorization", b"")
        scheme, _, encoded = value.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            _, _, password = base64.b64decode(encoded, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(password, self.secret.encode())

    def answer(self, endpoint: str, request: ApplyRequest) -> dict:
        """One rest_plugin request -> `{spec, error}`; one JSON log line."""
        spec = request.spec
        redactor = Redactor(values=set(self.redactor.values))
        redactor.add(_env_values(spec))
        verdict = self._verdict(endpoint, request)
        decision, reason, error = _answered(verdict, self.policy)
        self.decisions[decision] += 1
        self.undecided += verdict.decision == "unknown"
        user, project, run, reason = redactor.apply_series(
            _series([request.user, request.project, str(spec.get("run_name")), reason])
        ).to_list()
        self.log(
            {
                "user": user,
                "project": project,
                "endpoint": endpoint,
                "run": run if spec.get("run_name") is not None else None,
                "decision": decision,
                "reason": reason,
            }
        )
        return {"spec": spec, "error": reason if error else None}

    def _verdict(self, endpoint: str, request: ApplyRequest) -> Verdict:
        spec = request.spec
        if endpoint != "on_run_apply":
            return Verdict("approve", f"{endpoint}: not a run")
        conf = spec.get("configuration") or {}
        if not spec.get("run_name") or conf.get("type") != "service":
            return Verdict("approve", "not an update of a named service")
        snapshot, age = self.model.snapshot, self.model.age()
        if snapshot is None or age is None or age > self.policy.max_age:
            said = "no model yet" if age is None else f"the model is {age:.0f} s old"
            why = f" (last refresh: {self.model.failure})" if self.model.failure else ""
            return Verdict("unknown", f"{said}, over --max-age {self.policy.max_age:g} s{why}")
        if request.project not in snapshot.runs:
            return Verdict(
                "unknown",
                f"project {request.project} is not in the model (the token cannot read it, or "
                "it is newer than the last refresh)",
            )
        current = snapshot.run(request.project, spec["run_name"])
        others = [r for r in snapshot.runs[request.project] if r is not current]
        try:
            return decide(
                spec,
                current,
                snapshot.fleets.get(request.project, []),
                others,
                snapshot.version,
                datetime.now(UTC),
            )
        except (AttributeError, TypeError, ValueError, KeyError) as error:
            # a spec whose inner shapes are not dstack's: undecided, per --on-unknown
            return Verdict("unknown", f"the spec has a shape dstack never sends ({error!r:.80})")

    def metrics(self) -> str:
        """Prometheus' text exposition format 0.0.4."""
        age = self.model.age()
        lines = [
            "# HELP dstack_audit_guard_decisions_total Answers given, by decision.",
            "# TYPE dstack_audit_guard_decisions_total counter",
            *(
                f'dstack_audit_guard_decisions_total{{decision="{d}"}} {self.decisions[d]}'
                for d in ("approve", "reject", "warn")
            ),
            "# HELP dstack_audit_guard_undecided_total Of those, answered per --on-unknown.",
            "# TYPE dstack_audit_guard_undecided_total counter",
            f"dstack_audit_guard_undecided_total {self.undecided}",
            "# HELP dstack_audit_guard_bad_requests_total Requests refused with a 4xx.",
            "# TYPE dstack_audit_guard_bad_requests_total counter",
            *(
                f'dstack_audit_guard_bad_requests_total{{status="{s}"}} {n}'
                for s, n in sorted(self.bad_requests.items())
            ),
            "# HELP dstack_audit_guard_model_age_seconds Age of the server model (-1: none).",
            "# TYPE dstack_audit_guard_model_age_seconds gauge",
            f"dstack_audit_guard_model_age_seconds {-1 if age is None else round(age, 3)}",
            "# HELP dstack_audit_guard_model_refreshes_total Refreshes of the model.",
            "# TYPE dstack_audit_guard_model_refreshes_total counter",
            f"dstack_audit_guard_model_refreshes_total {self.model.refreshes}",
            "# HELP dstack_audit_guard_model_refresh_failures_total Failed refreshes.",
            "# TYPE dstack_audit_guard_model_refresh_failures_total counter",
            f"dstack_audit_guard_model_refresh_failures_total {self.model.failures}",
            "# HELP dstack_audit_guard_service_exposed 1 when a rolling update of the running "
            "service would be refused now (no room; healthy replicas at stake, dstack #4186).",
            "# TYPE dstack_audit_guard_service_exposed gauge",
        ]
        snapshot = self.model.snapshot
        exposed = snapshot.exposure if snapshot is not None else {}
        names = self.redactor.apply_series(
            _series([text for key in exposed for text in key])
        ).to_list()
        for i, value in enumerate(exposed.values()):
            project, service = _label(names[2 * i]), _label(names[2 * i + 1])
            lines.append(
                f'dstack_audit_guard_service_exposed{{project="{project}",service="{service}"}} '
                f"{int(value)}"
            )
        return "\n".join(lines) + "\n"


def _series(texts: list[str]) -> pl.Series:
    return pl.Series(texts, dtype=pl.String)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _answered(verdict: Verdict, policy: Policy) -> tuple[str, str, bool]:
    """(decision logged, reason, whether the answer carries it as the error)."""
    if verdict.decision == "unknown":
        decision = "reject" if policy.on_unknown == "reject" else "approve"
        reason = f"undecided, answered {decision} per --on-unknown: {verdict.reason}"
        return decision, reason, decision == "reject"
    if verdict.decision == "reject" and policy.mode == "warn":
        return "warn", verdict.reason, False
    return verdict.decision, verdict.reason, verdict.decision == "reject"


def _env_values(spec: dict) -> list[str]:
    """Every env value of the spec and its replica groups (`env` is a mapping or `K=V` list;
    dstack's CLI fills a valueless entry from the user's shell): secrets, never logged."""
    conf = spec.get("configuration") if isinstance(spec.get("configuration"), dict) else {}
    groups = [g for g in conf.get("groups") or [] if isinstance(g, dict)]
    values: list[str] = []
    for env in [conf.get("env"), *(g.get("env") for g in groups)]:
        if isinstance(env, dict):
            values.extend(str(v) for v in env.values() if v is not None)
        elif isinstance(env, list):
            values.extend(str(e).partition("=")[2] for e in env if "=" in str(e))
    return [v for v in values if v]


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether the JSON nests deeper than `limit` (walked without recursion, so a spec deep
    enough to break `json.dumps` of the answer is refused here instead)."""
    level: list[Any] = [data]
    for _ in range(limit + 1):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def parse(body: bytes) -> ApplyRequest:
    """The request body, or BadRequest (400 not JSON, 422 not `{user, project, spec}`)."""
    try:
        data = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as error:
        kind = "nested too deeply" if isinstance(error, RecursionError) else "not JSON"
        raise BadRequest(400, f"the body is {kind}") from None
    if not isinstance(data, dict):
        raise BadRequest(422, f"the body is a JSON {type(data).__name__}, not an object")
    if _deeper_than(data, MAX_DEPTH):
        raise BadRequest(400, "the body is nested too deeply")
    try:
        return ApplyRequest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadRequest(422, f"{where}: {first['msg']}") from None
    except RecursionError:
        raise BadRequest(400, "the body is nested too deeply") from None


def app(guard: Guard):
    """The ASGI application."""

    async def send_json(send, status: int, data: Any, extra: tuple = ()) -> None:
        body = json.dumps(data, allow_nan=False).encode()
        await _send(send, status, body, b"application/json", extra)

    async def application(scope, receive, send) -> None:
        headers = dict(scope["headers"])
        path, method = scope["path"], scope["method"]
        try:
            if path == "/healthz" and method == "GET":
                age = guard.model.age()
                fresh = age is not None and age <= guard.policy.max_age
                state = {"ready": fresh, "model_age_s": None if age is None else round(age, 3)}
                await send_json(send, 200 if fresh else 503, state)
                return
            if not guard.authentic(headers):
                raise BadRequest(401, "no valid credentials (Basic auth with the secret)")
            if path == "/metrics" and method == "GET":
                text = guard.metrics().encode()
                await _send(send, 200, text, b"text/plain; version=0.0.4; charset=utf-8")
                return
            endpoint = path.removeprefix("/apply_policies/")
            if endpoint == path or endpoint not in APPLY_ENDPOINTS:
                raise BadRequest(404, "no such endpoint")
            if method != "POST":
                raise BadRequest(405, "only POST")
            request = parse(await _body(headers, receive))
            await send_json(send, 200, guard.answer(endpoint, request))
        except BadRequest as bad:
            guard.bad_requests[bad.status] += 1
            client = (scope.get("client") or ("?",))[0]
            guard.log(
                {
                    "event": "bad_request",
                    "status": bad.status,
                    "reason": bad.reason,
                    "method": method[:10],
                    "path": guard.redactor.apply(path[:100]),
                    "client": client,
                }
            )
            extra = ((b"www-authenticate", b'Basic realm="dstack-audit guard"'),)
            await send_json(
                send, bad.status, {"error": bad.reason}, extra if bad.status == 401 else ()
            )

    return application


async def _body(headers: dict[bytes, bytes], receive) -> bytes:
    """The body, at most MAX_BODY bytes within BODY_TIMEOUT_S: a declared length over the cap
    is refused before a byte is read."""
    declared = headers.get(b"content-length")
    if declared is not None and int(declared) > MAX_BODY:  # h11 checked it is a number
        raise BadRequest(413, f"the body is over {MAX_BODY} bytes")
    chunks, size = [], 0
    deadline = time.monotonic() + BODY_TIMEOUT_S
    more = True
    while more:
        left = deadline - time.monotonic()
        try:
            message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
        except TimeoutError:
            raise BadRequest(408, f"the body took over {BODY_TIMEOUT_S:g} s") from None
        if message["type"] == "http.disconnect":
            raise BadRequest(400, "the client left before the body ended")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(413, f"the body is over {MAX_BODY} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _send(send, status: int, body: bytes, kind: bytes, extra: tuple = ()) -> None:
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode()), *extra]
    if status >= 400 and status != 401:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def listening(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a taken port is an error at start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def server(guard: Guard, sock: socket.socket):
    """A uvicorn server of the app on `sock` (`.run(sockets=[sock])` serves until a signal)."""
    import logging

    import h11
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol with a header timeout: a connection that has not sent a
        whole request head within HEADER_TIMEOUT_S (of its start or of its last answer) is
        closed, so idle connections cannot hold the guard's file descriptors."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self.loop.call_later(HEADER_TIMEOUT_S, self._late, self.cycle)

        def _late(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """A request h11 cannot parse (a negative Content-Length, a broken head): the
            same JSON answer as every bad request (uvicorn's warning is its log line)."""
            body = json.dumps({"error": msg}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    class JsonLines(logging.Handler):
        """uvicorn's own warnings ("Invalid HTTP request received.", "Exceeded concurrency
        limit.") as the guard's JSON lines."""

        def emit(self, record: logging.LogRecord) -> None:
            said = guard.redactor.apply(record.getMessage())
            if said.startswith("Invalid HTTP request"):
                guard.bad_requests[400] += 1
                guard.log({"event": "bad_request", "status": 400, "reason": said})
            else:
                guard.log({"event": "server", "reason": said})

    logger = logging.getLogger("uvicorn.error")
    logger.handlers[:] = [JsonLines(logging.WARNING)]
    logger.propagate = False
    config = uvicorn.Config(
        app(guard),
        http=Protocol,
        lifespan="off",
        log_config=None,
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        backlog=BACKLOG,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=3,
        server_header=False,
    )
    return uvicorn.Server(config)


def raise_fd_limit() -> None:
    """Idle connections each hold a file descriptor: take the hard limit (up to 65,536)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard if hard != resource.RLIM_INFINITY else 65536, 65536)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
