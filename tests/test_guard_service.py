"""The guard as a service (issue 35): its HTTP face under uvicorn, on loopback, answering from a
live model of a recording fake dstack server (tests/fake_dstack.py) that serves the shapes of
dstack 0.22.5's API. Real sockets and a real HTTP client: only the server's answers are made up.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
import zlib
from datetime import UTC, datetime

import httpx
import pytest
from fake_dstack import FakeDstack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_guard import OLD, RUN, changed, fleet, instance

from analyzer.errors import AuditInputError
from analyzer.redact import Redactor
from analyzer.service.guard import decide
from analyzer.service.http import MAX_BODY, Guard, Policy, listening, server
from analyzer.service.model import ServerModel

SECRET = "s3cret-for-the-guard-0123456789"
TOKEN = "tok-0123456789abcdefghij"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"dstack:{SECRET}".encode()).decode()}
ROLLING = changed(commands=["serve --v2"])
# every path the model may call of the fake (project `main`), nothing else
ALLOWED = {
    "/api/server/get_info",
    "/api/projects/list",
    "/api/project/main/fleets/list",
    "/api/runs/list",
}


class Lines(io.StringIO):
    """The guard's log, thread-safe enough for the tests (writes under the guard's lock)."""

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


def served(fake: FakeDstack, **policy) -> tuple[Guard, str, callable]:
    """(the guard, its URL, stop) of a guard in a thread of this process."""
    model = ServerModel(fake.url, TOKEN, every=0.2)
    model.refresh()
    model.start()
    redactor = Redactor()
    redactor.add({TOKEN, SECRET})
    guard = Guard(model, Policy(**policy), SECRET, redactor, out=Lines())
    sock = listening("127.0.0.1", 0)
    service = server(guard, sock)
    thread = threading.Thread(target=service.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not service.started and time.monotonic() < deadline:
        time.sleep(0.01)

    def stop() -> None:
        service.should_exit = True
        thread.join(timeout=10)
        model.stop()
        sock.close()

    return guard, f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def answers(runs, fleets):
    return {
        "/api/project/main/fleets/list": lambda r: r.json(fleets),
        "/api/runs/list": lambda r: r.json(runs),
    }


@pytest.fixture(scope="module")
def service():
    """`web` RUNNING with one healthy replica on the only instance of cpu-fleet (nodes.max 1)."""
    with FakeDstack(answers([RUN], [fleet([instance()])])) as fake:
        guard, url, stop = served(fake)
        try:
            yield guard, url, fake
        finally:
            stop()


CLIENT = httpx.Client(timeout=10)  # one client: each new one builds an SSL context (~0.1 s)


def apply(url: str, spec: dict, headers=AUTH, **body) -> httpx.Response:
    doc = {"user": "ann", "project": "main", "spec": spec, **body}
    return CLIENT.post(f"{url}/apply_policies/on_run_apply", json=doc, headers=headers)


def test_an_exposed_update_is_refused_and_a_harmless_one_passes(service):
    guard, url, _ = service
    refused = apply(url, ROLLING)
    assert refused.status_code == 200 and refused.json()["spec"] == ROLLING
    assert "nodes.max to 2" in refused.json()["error"]
    passed = apply(url, changed(priority=5))
    assert passed.json() == {"spec": changed(priority=5), "error": None}
    logged = guard.out.records()[-2:]
    assert [r["decision"] for r in logged] == ["reject", "approve"]
    assert logged[0]["reason"] == refused.json()["error"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic " + base64.b64encode(b"dstack:wrong-secret-0123").decode()},
        {"Authorization": f"Bearer {SECRET}"},
        {"Authorization": "Basic !!!not-base64"},
    ],
)
def test_a_caller_without_the_secret_gets_401_and_one_line(service, headers):
    guard, url, _ = service
    before = len(guard.out.records())
    response = apply(url, ROLLING, headers=headers)
    assert response.status_code == 401 and "error" in response.json()
    assert response.headers["www-authenticate"].startswith("Basic")
    (line,) = guard.out.records()[before:]
    assert line["event"] == "bad_request" and line["status"] == 401


HOSTILE = [
    (b"[]", 422),
    (b'"x"', 422),
    (b'{"spec": "x"}', 422),
    (b'{"user": "ann", "project": "main", "spec": "x"}', 422),
    (b"[" * 100_000 + b"]" * 100_000, 400),
    (b'{"user": "ann", "project": "main", "spec": {"n": NaN}}', 400),
    (b'{"user": "ann", "project": "main", "spec": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}", 400),
    (b"not json", 400),
    (b"", 400),
    (b'{"user": "ann", "project": "../projects/delete", "spec": {}}', 422),
    (b'{"user": "ann", "project": "main#", "spec": {}}', 422),
    (b'{"user": "ann", "project": "main?x=1", "spec": {}}', 422),
    (b'{"user": "ann", "project": "main\\n", "spec": {}}', 422),
    (b'{"user": "ann", "project": "main", "spec": {"run_name": "../../users/get_my_user"}}', 422),
    (b'{"user": "ann", "project": "main", "spec": {"run_name": "web", "configuration": 1}}', 422),
    (b'{"user": "", "project": "main", "spec": {}}', 422),
]


@pytest.mark.parametrize(("body", "status"), HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_body_is_a_4xx_json_answer_and_one_line(service, body, status):
    guard, url, fake = service
    before = len(guard.out.records())
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(
        f"{url}/apply_policies/on_run_apply", content=body, headers=headers, timeout=10
    )
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}
    (line,) = guard.out.records()[before:]
    assert line["event"] == "bad_request" and line["status"] == status
    assert set(fake.paths()) <= ALLOWED  # no body makes the guard call another path


def test_inner_shapes_dstack_never_sends_are_undecided_not_a_traceback(service):
    guard, url, _ = service
    odd = {**ROLLING, "configuration": {**ROLLING["configuration"], "groups": "x", "env": 3}}
    response = apply(url, {**odd, "repo_data": ["x"]})
    assert response.status_code == 200
    (line,) = guard.out.records()[-1:]
    assert line["decision"] in ("approve", "reject") and "Traceback" not in guard.out.getvalue()


def raw(url: str, head: bytes, body: bytes = b"", wait: float = 5) -> bytes:
    """A request written by hand on a socket; the answer's first bytes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(head + body)
        return sock.recv(4096)


def test_lengths_h11_or_the_cap_refuse_at_once(service):
    guard, url, _ = service
    auth = AUTH["Authorization"].encode()
    start = b"POST /apply_policies/on_run_apply HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth
    for length, status in (
        (b"-1", b"400"),
        (b"99999999999999999999", b"413"),
        (b"104857600", b"413"),
    ):
        began = time.monotonic()
        answer = raw(url, start + b"\r\nContent-Length: " + length + b"\r\n\r\n", b"{")
        assert answer.split(b" ")[1] == status, answer
        assert b"application/json" in answer and time.monotonic() - began < 1
    assert guard.out.records()[-1]["event"] == "bad_request"
    # a chunked body with no length is cut at the cap
    chunk = b"x" * 65536
    pieces = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * (MAX_BODY // len(chunk) + 2)
    answer = raw(url, start + b"\r\nTransfer-Encoding: chunked\r\n\r\n", pieces)
    assert answer.split(b" ")[1] == b"413", answer


def test_a_head_or_a_body_that_never_ends_is_cut_off(service, monkeypatch):
    _, url, _ = service
    monkeypatch.setattr("analyzer.service.http.HEADER_TIMEOUT_S", 0.5)
    monkeypatch.setattr("analyzer.service.http.BODY_TIMEOUT_S", 0.5)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /apply_policies/on_run_apply HTTP/1.1\r\nHost: x\r\n")
        began = time.monotonic()
        assert sock.recv(100) == b""  # closed by the guard, not by this test
        assert time.monotonic() - began < 3
    head = b"POST /apply_policies/on_run_apply HTTP/1.1\r\nHost: x\r\nAuthorization: "
    head += AUTH["Authorization"].encode() + b"\r\nContent-Length: 100\r\n\r\n"
    answer = raw(url, head, b'{"user":')  # 8 of the 100 bytes, then nothing
    assert answer.split(b" ")[1] == b"408", answer


def test_no_env_value_token_or_secret_shaped_name_in_a_line_or_an_answer(service):
    guard, url, _ = service
    hf = "hf_aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3k"
    key = "sk-proj-Zq8Wm2Xr4Tn6Yp8Lk0Jh2Gf4Ds6Aa8Ss"
    github = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    aws = "AKIAZ2QW3ER4TY5UI6OP"  # a valid project name, shaped as an AWS access key id
    spec = {
        **ROLLING,
        "configuration": {
            **ROLLING["configuration"],
            "env": {"HF_TOKEN": hf, "OPENAI_API_KEY": key},
            "groups": [{"name": "g", "env": [f"OTHER={hf}x"]}],
        },
    }
    before = len(guard.out.records())
    responses = [
        apply(url, spec, user=github),
        apply(url, spec, user="ann", project=f"{TOKEN}"[:50].replace("-", "_")),
    ]
    text = guard.out.getvalue().splitlines()[before:]
    assert len(text) == 2
    for secret in (hf, key, github, aws, SECRET, TOKEN):
        assert all(secret not in line for line in text), secret
        for response in responses:
            assert secret not in (response.json().get("error") or "")
    assert responses[0].json()["spec"] == spec  # dstack takes the answered spec as the new one


def test_healthz_and_metrics(service):
    guard, url, _ = service
    health = httpx.get(f"{url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["ready"] is True
    assert httpx.get(f"{url}/metrics", timeout=5).status_code == 401
    metrics = httpx.get(f"{url}/metrics", headers=AUTH, timeout=5)
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    assert 'dstack_audit_guard_service_exposed{project="main",service="web"} 1' in text
    assert (
        f'dstack_audit_guard_decisions_total{{decision="reject"}} {guard.decisions["reject"]}'
        in text
    )
    age = next(x for x in text.splitlines() if x.startswith("dstack_audit_guard_model_age_seconds"))
    assert 0 <= float(age.split()[1]) < 5


def test_a_model_older_than_max_age_is_unhealthy_and_answers_per_on_unknown():
    failing = {"/api/runs/list": lambda r: r.json({"detail": "down"}, status=500)}
    with FakeDstack(answers([RUN], [fleet([instance()], high=2)])) as fake:
        _, url, stop = served(fake, on_unknown="reject", max_age=1)
        try:
            assert apply(url, ROLLING).json()["error"] is None  # room: approved
            fake.answers.update(failing)  # every refresh from now on fails
            time.sleep(1.5)
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 503
            refused = apply(url, ROLLING).json()["error"]
            assert refused.startswith("undecided, answered reject per --on-unknown: the model is")
            assert "AuditInputError" in refused and "HTTP 500" in refused
            metrics = httpx.get(f"{url}/metrics", headers=AUTH, timeout=5).text.splitlines()
            assert "dstack_audit_guard_undecided_total 1" in metrics
        finally:
            stop()


def test_every_replica_group_and_the_profiles_settings_count():
    at = datetime(2026, 1, 1, 1, tzinfo=UTC)
    small = {"name": "small", "replicas": 1, "resources": {"cpu": {"min": 1}}}
    big = {"name": "big", "replicas": 0, "resources": {"cpu": {"min": 8}}}

    def grouped(*groups):
        old = {**OLD, "configuration": {**OLD["configuration"], "groups": list(groups)}}
        spec = {**old, "configuration": {**old["configuration"], "commands": ["v2"]}}
        return spec, {**RUN, "run_spec": old}

    # one idle 2-CPU instance and no growth (2 alive of nodes.max 2): it fits `small` only
    idle_small = fleet([instance(), instance("idle", 0, cpus=2)], high=2)
    spec, current = grouped(small)
    assert decide(spec, current, [idle_small], [], "0.22.5", at).decision == "approve"
    spec, current = grouped(small, big)  # the second group, not only the first, is placed
    assert decide(spec, current, [idle_small], [], "0.22.5", at).decision == "reject"
    # creation_policy and retry from the profile, not only the configuration
    growing = [fleet([instance()], high=5)]
    assert decide(ROLLING, RUN, growing, [], "0.22.5", at).decision == "approve"
    reuse = {**ROLLING, "profile": {"creation_policy": "reuse"}}
    assert decide(reuse, RUN, growing, [], "0.22.5", at).decision == "reject"
    retry = {"on_events": ["no-capacity"], "duration": 7200}
    waits = {**ROLLING, "profile": {"creation_policy": "reuse", "retry": retry}}
    assert "retry on no-capacity for 7200 s" in decide(waits, RUN, growing, [], "0.22.5", at).reason


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    user=st.text(max_size=60),
    project=st.text(max_size=60),
    run_name=st.one_of(st.none(), st.text(max_size=60)),
)
def test_no_request_body_makes_the_guard_call_another_path(service, user, project, run_name):
    """Whatever names a caller sends, the recording fake sees only the model's own paths."""
    _, url, fake = service
    spec = {**ROLLING, "run_name": run_name}
    response = apply(url, spec, user=user, project=project)
    assert response.status_code in (200, 422), response.text
    assert set(fake.paths()) <= ALLOWED


def test_the_models_refresh_reads_through_the_bounded_reader():
    """The guard's refresh is read like `collect`'s pages (issue 36): a nested coding is
    refused by name before a byte is inflated, and the model keeps its last snapshot."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    inner = squeeze.compress(b"[" + b" " * 2**24) + squeeze.flush()
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = squeeze.compress(inner) + squeeze.flush()
    with FakeDstack(answers([RUN], [fleet([instance()])])) as fake:
        model = ServerModel(fake.url, TOKEN, every=60)
        before = model.refresh()
        fake.answers["/api/runs/list"] = lambda r: r.raw(
            bomb, headers={"Content-Encoding": "gzip, gzip"}
        )
        with pytest.raises(AuditInputError, match="more than one coding"):
            model.refresh()
        assert model.snapshot is before
