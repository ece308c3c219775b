"""`dstack-audit guard` called by a real dstack 0.22.5 server (issue 25), never a mock.

Each capture's database is copied under a `dstack server` (test_live_server's DstackServer) whose
server/config.yml enables the builtin `rest_plugin` and whose DSTACK_PLUGIN_SERVICE_URI points at
a `dstack-audit guard` subprocess. The applies go through the server's own API, as `dstack apply`
sends them: `runs/get` for the current run, the spec changed, then `runs/get_plan` and
`runs/apply`; once also through the real `dstack apply` CLI. An approved update is shown by
`runs/apply`: its `get_plan` would go on to pull the image's config from the registry, which
this offline machine cannot reach (the plugin is asked first either way). The captures, from
their rows: in-place-bump's service `web` is RUNNING with its
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
from analyzer.redact import Redactor
from analyzer.service.http import ApplyRequest, Guard, Policy
from analyzer.service.model import ServerModel

pytestmark = pytest.mark.skipif(
    not DSTACK.is_file(),
    reason=f"no dstack server venv at {VENV}: `bash .ci/dstack.sh` installs dstack[server]==0.22.5",
)
PLUGIN_CONFIG = "projects: []\nplugins:\n  - rest_plugin\n"
START_TIMEOUT_S = 60
REJECTED = "Apply request rejected: "
SECRET = "e2e-caller-secret-0123456789abcdef"
CHANGED = "Resource has been changed"  # apply_plan's answer when the run moved since the plan
ATTEMPTS = 5


WEB_UPDATE = """\
type: service
name: web
image: python:3.12-slim
commands:
  - python -m http.server 8000 --bind 0.0.0.0
port: 8000
priority: 10
resources:
  cpu: 2..
  memory: 8GB..
  disk: 100GB..
"""  # in-place-bump's `web` as captured, but for its commands: a rolling deployment


class Stack:
    """A dstack server with rest_plugin enabled and the `dstack-audit guard` it calls; HOME
    holds the dstack CLI's configuration for the server's admin (`dstack project add`'s file)."""

    def __init__(self, capture: str, project: str, root: Path, via_config: bool) -> None:
        self.project, self.root, self.via_config = project, root, via_config
        self.port = free_port()
        self.server = DstackServer(
            CAPTURES / "v0.22.5" / capture,
            root / "dstack",
            config=PLUGIN_CONFIG,
            # requests sends the URI's user-info as Basic auth: the secret proves the caller
            env={"DSTACK_PLUGIN_SERVICE_URI": f"http://dstack:{SECRET}@127.0.0.1:{self.port}"},
        )
        self.home = root / "home"
        (self.home / ".dstack").mkdir(parents=True)
        entry = {"name": project, "url": self.server.url, "token": self.server.token}
        config = json.dumps({"projects": [entry | {"default": True}]})  # YAML reads JSON
        (self.home / ".dstack" / "config.yml").write_text(config, encoding="utf-8")
        self.stdout, self.stderr = root / "guard.out", root / "guard.err"

    def start(self) -> Stack:
        """The guard once the server answers: by the CLI's configuration (`--server
        dstack:PROJECT`) or by URL with DSTACK_TOKEN, the two ways `audit URL` takes a token."""
        self.server.wait()
        env = quiet_env(self.home, DSTACK_AUDIT_GUARD_SECRET=SECRET)
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        where = [f"dstack:{self.project}"] if self.via_config else [self.server.url]
        if not self.via_config:
            env["DSTACK_TOKEN"] = self.server.token
        command = [sys.executable, "-m", "analyzer", "guard", "--server", *where]
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.guard = subprocess.Popen(
                [*command, "--port", str(self.port)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while "checks applies" not in self.stderr.read_text():
            if self.guard.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the guard did not start: {self.stderr.read_text()}")
            time.sleep(0.1)
        return self

    def decisions(self) -> list[dict]:
        lines = self.stderr.read_text().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        return [r for r in records if "decision" in r]

    def post(self, path: str, body: dict) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.server.token}"}
        url = f"{self.server.url}/api/project/{self.project}/{path}"
        return httpx.post(url, json=body, headers=headers, timeout=30)

    def apply(self, name: str, **configuration) -> tuple[httpx.Response, dict]:
        """`runs/apply` of the run's spec changed by `configuration`, planned against the run as
        read just before; on "Resource has been changed" read, plan and apply again, as a user
        of the dstack CLI does on that message (a busy server moves a run between the two)."""
        for _ in range(ATTEMPTS):
            run = self.run(name)
            body = {"plan": {"run_spec": changed(run, **configuration), "current_resource": run}}
            applied = self.post("runs/apply", body | {"force": False})
            if applied.status_code != 400 or CHANGED not in applied.text:
                return applied, run
            time.sleep(0.5)
        return applied, run

    def get(self, path: str, secret: str | None = SECRET) -> httpx.Response:
        auth = ("dstack", secret) if secret else None
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", auth=auth, timeout=10)

    def run(self, name: str) -> dict:
        response = self.post("runs/get", {"run_name": name})
        assert response.status_code == 200, response.text
        return response.json()

    def interrupt(self) -> int:
        """Ctrl-C to the guard; its exit status."""
        if self.guard.poll() is None:
            os.kill(self.guard.pid, signal.SIGINT)
        try:
            return self.guard.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.guard.pid, signal.SIGKILL)
            return self.guard.wait(timeout=15)

    def stop(self) -> None:
        if hasattr(self, "guard"):
            self.interrupt()
        self.server.stop()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    """Both servers started at once, each once for the module."""
    started = {}
    try:
        for capture, project, via_config in (
            ("in-place-bump", "cyberdyne", False),
            ("rolling-ok", "globex", True),
        ):
            root = tmp_path_factory.mktemp(capture)
            started[capture] = Stack(capture, project, root, via_config)
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(Stack.start, started.values()))
        yield started
    finally:
        for stack in started.values():
            stack.server.terminate()  # all at once, then each waited for (or killed)
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
    run = stack.run("web")
    spec = changed(run, commands=["python -m http.server 8000 --bind 0.0.0.0"])
    plan = stack.post("runs/get_plan", {"run_spec": spec})
    reason = refusal(plan)
    assert reason is not None, plan.text
    for fact in ("service web", "1 healthy replica", "fleet cpu-fleet", "nodes.max 1"):
        assert fact in reason
    assert "raise fleet cpu-fleet's nodes.max to 2" in reason
    applied, run = stack.apply("web", commands=["python -m http.server 8000 --bind 0.0.0.0"])
    assert refusal(applied) == reason
    assert stack.run("web")["deployment_num"] == run["deployment_num"]
    logged = stack.decisions()[-1]
    assert logged["decision"] == "reject" and logged["reason"] == reason
    assert (logged["user"], logged["project"], logged["run"]) == ("admin", "cyberdyne", "web")
    for doc in ("README.md", "docs/guard.md"):  # the refusal the documents show is this one
        shown = (Path(__file__).parents[1] / doc).read_text(encoding="utf-8")
        example = shown.split("$ dstack apply -f .dstack.yml -y\n", 1)[1].split("```", 1)[0]
        assert " ".join(example.split()) == " ".join((REJECTED + reason).split()), doc


def test_with_room_no_new_replica_and_a_new_run_pass(stacks):
    stack = stacks["rolling-ok"]
    applied, _ = stack.apply("api", priority=5)
    assert applied.status_code == 200, applied.text
    applied, run = stack.apply("api", commands=["python -m http.server 8000"])
    assert applied.status_code == 200, applied.text
    assert applied.json()["deployment_num"] == run["deployment_num"] + 1
    fresh = changed(run, name="fresh", image=None)  # no image: the plan pulls nothing offline
    fresh["run_name"] = "fresh"
    plan = stack.post("runs/get_plan", {"run_spec": fresh})
    assert plan.status_code == 200, plan.text
    decisions = [(d["run"], d["decision"], d["reason"]) for d in stack.decisions()]
    assert decisions[-3:] == [
        ("api", "approve", "an in-place update: it starts no replica"),
        (
            "api",
            "approve",
            "a rolling deployment (configuration.commands) of api: room for 1 new replica(s)",
        ),
        ("fresh", "approve", "a new run, not an update of a running service"),
    ]


def test_warn_mode_approves_and_says_the_same_reason(stacks, capsys):
    stack = stacks["in-place-bump"]
    spec = changed(stack.run("web"), commands=["python -m http.server 8000 --bind 0.0.0.0"])
    model = ServerModel(stack.server.url, stack.server.token, every=60)
    model.refresh()
    request = ApplyRequest(user="admin", project=stack.project, spec=spec)
    refused = Guard(model, Policy("reject"), SECRET, Redactor()).answer("on_run_apply", request)
    warned = Guard(model, Policy("warn"), SECRET, Redactor()).answer("on_run_apply", request)
    assert warned == {"spec": spec, "error": None}
    logged = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["decision"] for line in logged] == ["reject", "warn"]
    assert logged[1]["reason"] == logged[0]["reason"] == refused["error"]


def test_a_token_the_server_refuses_stops_the_guard_at_start(stacks):
    url, wrong = stacks["rolling-ok"].server.url, "not-a-token-0123456789"
    result = CliRunner().invoke(
        main,
        ["guard", "--server", url, "--token", wrong, "--port", "0"],
        env={"DSTACK_AUDIT_GUARD_SECRET": SECRET},
    )
    assert result.exit_code == 2 and "the server refused the token" in result.output
    assert wrong not in result.output


def test_dstack_apply_shows_the_refusal(stacks, tmp_path):
    """The real `dstack apply` of the CLI, offline: the user's own view of a refusal."""
    stack = stacks["in-place-bump"]
    (tmp_path / ".dstack.yml").write_text(WEB_UPDATE, encoding="utf-8")
    shown = subprocess.run(
        [str(DSTACK), "apply", "-f", ".dstack.yml", "-y"],
        cwd=tmp_path,
        env=quiet_env(stack.home, DSTACK_CLI_LOG_LEVEL="error", COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join((shown.stdout + shown.stderr).split())
    assert shown.returncode != 0 and text.startswith(REJECTED), text
    assert " ".join(stack.decisions()[-1]["reason"].split()) in text


def test_healthz_metrics_and_callers_without_the_secret(stacks):
    """What an operator's Prometheus sees of the real servers: web is exposed (no room for a
    surge replica), api is not (nodes.max 2 leaves room)."""
    for stack, (name, exposed) in zip(stacks.values(), (("web", 1), ("api", 0)), strict=True):
        health = stack.get("/healthz", secret=None)
        assert health.status_code == 200 and health.json()["ready"] is True, health.text
        assert stack.get("/metrics", secret=None).status_code == 401
        assert stack.get("/metrics", secret="wrong-secret-0123456789").status_code == 401
        metrics = stack.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        gauge = f'dstack_audit_guard_service_exposed{{project="{stack.project}",service="{name}"}}'
        assert f"{gauge} {exposed}" in metrics.text.splitlines(), metrics.text
        unsigned = httpx.post(
            f"http://127.0.0.1:{stack.port}/apply_policies/on_run_apply",
            json={"user": "x", "project": stack.project, "spec": {}},
            timeout=10,
        )
        assert unsigned.status_code == 401


def test_the_token_is_in_no_output_and_ctrl_c_exits_130(stacks):
    for stack, name in zip(stacks.values(), ("web", "api"), strict=True):
        spec = changed(stack.run(name), commands=["sleep infinity"])
        stack.post("runs/get_plan", {"run_spec": spec})
        assert stack.interrupt() == 130
        out, err = stack.stdout.read_text(), stack.stderr.read_text()
        assert stack.server.token not in out + err
        assert err.splitlines()[-1] == "dstack-audit: interrupted"
        assert stack.decisions(), "the guard logged no decision"
