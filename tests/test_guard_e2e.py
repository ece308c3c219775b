"""`dstack-audit guard` called by a real dstack 0.22.5 server (issue 25), never a mock.

Each capture's database is copied under a `dstack server` (test_live_server's DstackServer) whose
server/config.yml enables the builtin `rest_plugin` and whose DSTACK_PLUGIN_SERVICE_URI points at
a `dstack-audit guard` subprocess. The applies go through the server's own API, as `dstack apply`
sends them: `runs/get` for the current run, the spec changed, then `runs/get_plan` and
`runs/apply`. The captures, from their rows: in-place-bump's service `web` is RUNNING with its
one replica on the one instance of cpu-fleet (nodes.max 1: no room); rolling-ok's `api` is
RUNNING on one busy instance of cpu-fleet with nodes.max 2 (room for one more).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import CAPTURES
from test_live_server import DSTACK, VENV, DstackServer, free_port, quiet_env

from analyzer.cli import main

pytestmark = pytest.mark.skipif(
    not DSTACK.is_file(),
    reason=f"no dstack server venv at {VENV}: `bash .ci/dstack.sh` installs dstack[server]==0.22.5",
)
PLUGIN_CONFIG = "projects: []\nplugins:\n  - rest_plugin\n"
START_TIMEOUT_S = 60
REJECTED = "Apply request rejected: "


class Guard:
    """`dstack-audit guard` for one server, its stdout and stderr kept in files."""

    def __init__(self, root: Path, port: int) -> None:
        self.port = port
        self.stdout, self.stderr = root / "guard.out", root / "guard.err"
        self.root = root

    def start(self, server: DstackServer) -> Guard:
        env = quiet_env(self.root / "home", DSTACK_TOKEN=server.token)
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        command = [sys.executable, "-m", "analyzer", "guard", "--server", server.url]
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while "checks applies" not in self.stderr.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the guard did not start: {self.stderr.read_text()}")
            time.sleep(0.1)
        return self

    def decisions(self) -> list[dict]:
        lines = self.stderr.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def stop(self) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=15)


class Stack:
    """A dstack server with rest_plugin enabled and the guard it calls."""

    def __init__(self, capture: str, root: Path) -> None:
        port = free_port()
        self.guard = Guard(root, port)
        self.server = DstackServer(
            CAPTURES / "v0.22.5" / capture,
            root / "dstack",
            config=PLUGIN_CONFIG,
            env={"DSTACK_PLUGIN_SERVICE_URI": f"http://127.0.0.1:{port}"},
        )
        (root / "home").mkdir()

    def start(self) -> Stack:
        self.server.wait()
        self.guard.start(self.server)
        return self

    def post(self, project: str, path: str, body: dict) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.server.token}"}
        url = f"{self.server.url}/api/project/{project}/{path}"
        return httpx.post(url, json=body, headers=headers, timeout=30)

    def run(self, project: str, name: str) -> dict:
        response = self.post(project, "runs/get", {"run_name": name})
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self) -> None:
        self.guard.stop()
        self.server.stop()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    """Both servers started at once, each once for the module."""
    started = {
        name: Stack(name, tmp_path_factory.mktemp(name)) for name in ("in-place-bump", "rolling-ok")
    }
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(Stack.start, started.values()))
        yield started
    finally:
        for stack in started.values():
            stack.stop()


def changed(run: dict, **configuration) -> dict:
    spec = copy.deepcopy(run["run_spec"])
    spec["configuration"].update(configuration)
    return spec


def refusal(response: httpx.Response) -> str | None:
    """The guard's reason when the server refused the apply with it."""
    if response.status_code != 400:
        return None
    messages = [d.get("msg", "") for d in response.json().get("detail", [])]
    return next((m.removeprefix(REJECTED) for m in messages if m.startswith(REJECTED)), None)


def test_an_update_with_no_room_is_refused_with_the_reason(stacks):
    stack = stacks["in-place-bump"]
    run = stack.run("cyberdyne", "web")
    spec = changed(run, commands=["python -m http.server 8000 --bind 0.0.0.0"])
    plan = stack.post("cyberdyne", "runs/get_plan", {"run_spec": spec})
    reason = refusal(plan)
    assert reason is not None, plan.text
    for fact in ("service web", "1 healthy replica", "fleet cpu-fleet", "nodes.max 1"):
        assert fact in reason
    assert "raise fleet cpu-fleet's nodes.max to 2" in reason
    body = {"plan": {"run_spec": spec, "current_resource": run}, "force": False}
    assert refusal(stack.post("cyberdyne", "runs/apply", body)) == reason
    assert stack.run("cyberdyne", "web")["deployment_num"] == run["deployment_num"]
    logged = stack.guard.decisions()[-1]
    assert logged["decision"] == "reject" and logged["reason"] == reason
    assert (logged["user"], logged["project"], logged["run"]) == ("admin", "cyberdyne", "web")


def test_with_room_no_new_replica_and_a_new_run_pass(stacks):
    stack = stacks["rolling-ok"]
    run = stack.run("globex", "api")
    in_place = changed(run, priority=5)
    body = {"plan": {"run_spec": in_place, "current_resource": run}, "force": False}
    applied = stack.post("globex", "runs/apply", body)
    assert applied.status_code == 200, applied.text
    run = stack.run("globex", "api")
    rolling = changed(run, commands=["python -m http.server 8000"])
    body = {"plan": {"run_spec": rolling, "current_resource": run}, "force": False}
    applied = stack.post("globex", "runs/apply", body)
    assert applied.status_code == 200, applied.text
    assert applied.json()["deployment_num"] == run["deployment_num"] + 1
    fresh = changed(run, name="fresh", image=None)  # no image: the plan pulls nothing offline
    fresh["run_name"] = "fresh"
    plan = stack.post("globex", "runs/get_plan", {"run_spec": fresh})
    assert plan.status_code == 200, plan.text
    decisions = [(d["run"], d["decision"], d["reason"]) for d in stack.guard.decisions()]
    assert decisions[-3:] == [
        ("api", "approve", "an in-place update: it starts no replica"),
        (
            "api",
            "approve",
            "a rolling deployment (configuration.commands) of api: room for 1 new replica(s)",
        ),
        ("fresh", "approve", "a new run, not an update of a running service"),
    ]


def test_a_token_the_server_refuses_stops_the_guard_at_start(stacks):
    url, wrong = stacks["rolling-ok"].server.url, "not-a-token-0123456789"
    result = CliRunner().invoke(main, ["guard", "--server", url, "--token", wrong, "--port", "0"])
    assert result.exit_code == 2 and "the server refused the token" in result.output
    assert wrong not in result.output


def test_the_token_is_in_no_output_and_ctrl_c_exits_130(stacks):
    for (project, name), stack in zip(
        (("cyberdyne", "web"), ("globex", "api")), stacks.values(), strict=True
    ):
        spec = changed(stack.run(project, name), commands=["sleep infinity"])
        stack.post(project, "runs/get_plan", {"run_spec": spec})
        assert stack.guard.stop() == 130
        out, err = stack.guard.stdout.read_text(), stack.guard.stderr.read_text()
        assert stack.server.token not in out + err
        assert err.splitlines()[-1] == "dstack-audit: interrupted"
        assert stack.guard.decisions(), "the guard logged no decision"
