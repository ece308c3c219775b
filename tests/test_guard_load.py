"""The guard under load and hostile callers on loopback (issue 35), bounded in count and time:
the real `dstack-audit guard` command in a subprocess, its model fed by a recording fake dstack
server (tests/fake_dstack.py) holding one exposed service (`web`: one healthy replica on the only
instance of cpu-fleet, nodes.max 1).

Figures dstack sets: rest_plugin waits `PLUGIN_REQUEST_TIMEOUT_SEC` = 8 s for an answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fake_dstack import FakeDstack
from test_guard import RUN, changed, fleet, instance
from test_live_server import free_port

SECRET = "load-caller-secret-0123456789"
TOKEN = "tok-load-0123456789abcdef"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"dstack:{SECRET}".encode()).decode()}
DSTACK_WAIT_S = 8  # rest_plugin's PLUGIN_REQUEST_TIMEOUT_SEC
IDLE = 1000
BURST = 200
MEMORY_MB = 200
ROLLING = changed(commands=["serve --v2"])
ALLOWED = {
    "/api/server/get_info",
    "/api/users/get_my_user",  # the token's check at start
    "/api/projects/list",
    "/api/project/main/fleets/list",
    "/api/runs/list",
}


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    """(the guard's URL, its process, the fake server, the guard's stderr file)."""
    answers = {
        "/api/users/get_my_user": lambda r: r.json({"username": "admin"}),
        "/api/project/main/fleets/list": lambda r: r.json([fleet([instance()])]),
        "/api/runs/list": lambda r: r.json([RUN]),
    }
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 200:  # this test's own idle sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    err = tmp_path_factory.mktemp("guard") / "guard.err"
    with FakeDstack(answers) as fake:
        port = free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(err.parent),
            "DSTACK_TOKEN": TOKEN,
            "DSTACK_AUDIT_GUARD_SECRET": SECRET,
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
        }
        command = [sys.executable, "-m", "analyzer", "guard", "--server", fake.url]
        with err.open("wb") as stderr:
            process = subprocess.Popen(
                [*command, "--port", str(port), "--refresh", "1"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while "checks applies" not in err.read_text():
                assert process.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}", process, fake, err
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=15)


def apply(url: str, timeout: float = DSTACK_WAIT_S) -> httpx.Response:
    body = {"user": "ann", "project": "main", "spec": ROLLING}
    return httpx.post(
        f"{url}/apply_policies/on_run_apply", json=body, headers=AUTH, timeout=timeout
    )


def peak_mb(process: subprocess.Popen) -> float:
    """The guard's peak resident memory (VmHWM)."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_idle_connections_do_not_stop_a_real_apply(guard):
    url, _, _, _ = guard
    port = int(url.rsplit(":", 1)[1])
    idle = []
    try:
        for _ in range(IDLE):  # each a head that never ends
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /apply_policies/on_run_apply HTTP/1.1\r\nHost: x\r\n")
            idle.append(sock)
        began = time.monotonic()
        response = apply(url, timeout=2)
        took = time.monotonic() - began
    finally:
        for sock in idle:
            sock.close()
    assert response.status_code == 200 and response.json()["error"], response.text
    assert took < 2, f"{took:.2f} s with {IDLE} idle connections"


def test_a_burst_of_exposed_updates_is_refused_every_time_within_dstacks_wait(guard):
    url, _, _, _ = guard
    body = {"user": "ann", "project": "main", "spec": ROLLING}

    async def one(client: httpx.AsyncClient) -> tuple[float, int, str | None]:
        began = time.monotonic()
        response = await client.post(f"{url}/apply_policies/on_run_apply", json=body)
        return time.monotonic() - began, response.status_code, response.json()["error"]

    async def burst():
        limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=0)
        async with httpx.AsyncClient(headers=AUTH, limits=limits, timeout=30) as client:
            return await asyncio.gather(*(one(client) for _ in range(BURST)))

    results = asyncio.run(burst())
    slowest = max(took for took, _, _ in results)
    assert all(status == 200 for _, status, _ in results)
    assert all(error and "no room" in error for _, _, error in results)
    assert slowest < DSTACK_WAIT_S, f"slowest answer {slowest:.2f} s"


def test_huge_bodies_are_refused_at_once_and_memory_stays_bounded(guard):
    url, process, _, _ = guard
    port = int(url.rsplit(":", 1)[1])
    head = (
        b"POST /apply_policies/on_run_apply HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + AUTH["Authorization"].encode()
    )
    megabyte = b"x" * (1 << 20)

    def send(declared: bool) -> tuple[bytes, float]:
        """100 MB offered (declared, or chunked with no length) until the guard answers."""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            framing = b"Content-Length: 104857600" if declared else b"Transfer-Encoding: chunked"
            began = time.monotonic()
            sock.sendall(head + b"\r\n" + framing + b"\r\n\r\n")
            chunk = megabyte if declared else b"100000\r\n" + megabyte + b"\r\n"
            try:
                for _ in range(100):
                    sock.sendall(chunk)
            except OSError:
                pass  # the guard answered and closed: the rest was never read
            return sock.recv(200), time.monotonic() - began

    for declared in (True, False, False, True):
        answer, took = send(declared)
        assert answer.split(b" ")[1] == b"413", answer
        assert took < 2, f"{took:.2f} s to refuse 100 MB"
    assert peak_mb(process) < MEMORY_MB, f"peak {peak_mb(process):.0f} MB"


def test_the_guard_called_only_its_paths_and_logged_json(guard):
    url, _, fake, err = guard
    for project in ("../projects/delete", "main#x", "main?x", "x/../../users"):
        body = {"user": "ann", "project": project, "spec": ROLLING}
        httpx.post(f"{url}/apply_policies/on_run_apply", json=body, headers=AUTH, timeout=5)
    assert set(fake.paths()) <= ALLOWED, sorted(set(fake.paths()) - ALLOWED)
    lines = err.read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]  # after the one start line
    assert records and all("time" in r for r in records)
    assert TOKEN not in err.read_text() and SECRET not in err.read_text()
