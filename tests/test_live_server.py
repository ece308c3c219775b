"""A real dstack 0.22.5 server (never a mock) audited through its REST API.

Each server runs `dstack server` from the venv `.ci/dstack.sh` installs, on 127.0.0.1 and a free
port, with DSTACK_SERVER_DIR holding a COPY of a capture's database; background processing is
off (the runs stay as captured) and every outbound call is pointed at a closed loopback port.
The admin token is read from the copy's users table (`enc:identity:noname:<token>`: dstack's
identity "encryption" keeps the plaintext). Every server is stopped at teardown, even on failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import (
    CAPTURES,
    capture_id,
    expected_victims,
    found_victims,
    load_truth,
    one_line_error,
    self_signed,
    truth_files,
)

from analyzer import open_sources
from analyzer.cli import main
from analyzer.errors import AuditInputError
from analyzer.sources.collect import collect, collect_into

VENV = Path(os.environ.get("DSTACK_SERVER_VENV", "/opt/dstack-server-venv"))
DSTACK = VENV / "bin" / "dstack"
pytestmark = pytest.mark.skipif(
    not DSTACK.is_file(),
    reason=f"no dstack server venv at {VENV}: `bash .ci/dstack.sh` installs dstack[server]==0.22.5",
)
TRUTHS = truth_files("v0.22.5/*/truth.json")
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def admin_token(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        (stored,) = connection.execute("SELECT token FROM users WHERE name = 'admin'").fetchone()
    assert stored.startswith("enc:identity:"), "the capture's tokens are stored in plaintext"
    return stored.split(":", 3)[3]


def quiet_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: a private HOME, and every proxy at a closed loopback port so
    nothing the server or a CLI tries reaches beyond this machine."""
    closed = "http://127.0.0.1:9"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HTTP_PROXY": closed,
        "HTTPS_PROXY": closed,
        "ALL_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }


class DstackServer:
    """`dstack server` on a copy of a capture's database; `config` is its server/config.yml
    (none: the server's config is disabled) and `env` more environment variables."""

    def __init__(
        self, capture: Path, root: Path, config: str | None = None, env: dict | None = None
    ) -> None:
        self.capture = capture
        self.root = root
        server_dir = root / "server"
        (server_dir / "data").mkdir(parents=True)
        (root / "home").mkdir()
        db = server_dir / "data" / "sqlite.db"
        db.write_bytes((capture / "server.db").read_bytes())
        if config is not None:
            (server_dir / "config.yml").write_text(config, encoding="utf-8")
        self.token = admin_token(db)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        settings = {
            "DSTACK_SERVER_DIR": str(server_dir),
            "DSTACK_SERVER_HOST": "127.0.0.1",
            "DSTACK_SERVER_PORT": str(self.port),
            "DSTACK_SERVER_BACKGROUND_PROCESSING_DISABLED": "1",
            "DSTACK_DEFAULT_CREDS_DISABLED": "1",
            "DSTACK_DO_NOT_UPDATE_DEFAULT_PROJECT": "1",
        }
        if config is None:
            settings["DSTACK_SERVER_CONFIG_DISABLED"] = "1"
        env = quiet_env(root / "home", **settings, **(env or {}))
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(DSTACK), "server", "--host", "127.0.0.1", "--port", str(self.port), "-n"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self) -> DstackServer:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dstack server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.post(self.url + "/api/server/get_info", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"dstack server not up in {START_TIMEOUT_S}s: {self.log.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One server per v0.22.5 capture, all started at once (their start-up is mostly imports)."""
    started: dict[str, DstackServer] = {}
    try:
        for truth in TRUTHS:
            name = capture_id(truth)
            started[name] = DstackServer(truth.parent, tmp_path_factory.mktemp(truth.parent.name))
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(DstackServer.wait, started.values()))
        yield started
    finally:
        for server in started.values():
            server.terminate()  # all at once, then each waited for (or killed)
        for server in started.values():
            server.stop()


@pytest.fixture
def own_server(tmp_path):
    """A server of the seed capture that a test may kill."""
    server = DstackServer(CAPTURES / "v0.22.5" / "seed", tmp_path / "dstack")
    try:
        yield server.wait()
    finally:
        server.stop()


def check_truth(report, truth: dict) -> None:
    assert found_victims(report) == expected_victims(truth)
    verdicts = {v.run_id: v for v in report.runs}
    assert len(report.runs) == len(truth["runs"])
    for run in truth["runs"]:
        verdict = verdicts[run["run_id"]].verdict
        if run["expected_flag"]:
            assert verdict == "collateral_termination"
        elif run["expected_flag_broad"]:
            assert verdict == "same_deployment_collateral"
        else:
            assert verdict in ("no_incident", "no_healthy_victim")
        culprits = {
            c.job_id for f in report.findings if f.run_id == run["run_id"] for c in f.culprits
        }
        assert culprits == (
            {c["job_id"] for c in run["culprit"]} if run["expected_flag_broad"] else set()
        )


def judged(report, name: str, label: str) -> dict:
    """What must not depend on where the pages were read from: verdicts, findings, summary and
    the limitations' codes (the pages' names made alike)."""
    data = json.loads(report.model_dump_json().replace(name, label))
    return {
        "runs": data["runs"],
        "findings": data["findings"],
        "summary": data["summary"],
        "limitations": sorted(lim["code"] for lim in data["limitations"]),
    }


def without_cost(doc):
    runs = doc if isinstance(doc, list) else [doc]
    return [{k: v for k, v in run.items() if k != "cost"} for run in runs]


def all_text(folder: Path) -> str:
    return "\n".join(p.read_text("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("truth_path", TRUTHS, ids=capture_id)
def test_live_audit_gives_truth(servers, truth_path, monkeypatch):
    server = servers[capture_id(truth_path)]
    monkeypatch.setenv("DSTACK_TOKEN", server.token)
    audit = open_sources([server.url])
    check_truth(audit.report, load_truth(truth_path))
    text = audit.report.model_dump_json()
    assert server.token not in text
    collection = next(i for i in audit.report.inputs if i.kind == "dstack-api-collection")
    assert collection.server_version == "0.22.5"
    assert any("pages/s" in note for note in collection.notes)
    codes = {lim.code for lim in audit.report.limitations}
    assert {"api_fields_not_exposed", "api_live_snapshot"} <= codes
    assert all(i.path.startswith(server.url) for i in audit.report.inputs)


@pytest.mark.parametrize("truth_path", TRUTHS, ids=capture_id)
def test_collect_then_offline_audit_equals_live(servers, truth_path, tmp_path, monkeypatch):
    server = servers[capture_id(truth_path)]
    folder = tmp_path / "collected"
    result = collect(server.url, folder, server.token)
    assert result.server_version == "0.22.5"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and manifest["dstack_version"] == "0.22.5"
    assert len(manifest["pages"]) == len(list(p for p in folder.rglob("*.json"))) - 1
    assert server.token not in all_text(folder)
    # What the capture's own API export got from the same calls: the same bytes, but for the
    # cost of a run still running (price x duration up to now; the export's clock was frozen).
    # (captures made after the exports, stop-after-kill and retry-on-error, have none)
    export = truth_path.parent / "api"
    exported = json.loads((export / "manifest.json").read_text()) if export.is_dir() else None
    exported_sha = {r["file"]: r["sha256"] for r in exported["requests"]} if exported else {}
    same_calls = [p for p in manifest["pages"] if p["file"] in exported_sha]
    assert not exported or {p["path"] for p in same_calls} >= {"/api/events/list", "/api/runs/list"}
    for page in same_calls:
        if page["sha256"] != exported_sha[page["file"]]:
            ours, theirs = (json.loads((f / page["file"]).read_text()) for f in (folder, export))
            assert page["path"] != "/api/events/list"
            assert without_cost(ours) == without_cost(theirs)

    offline = open_sources([folder]).report
    check_truth(offline, load_truth(truth_path))
    monkeypatch.setenv("DSTACK_TOKEN", server.token)
    live = open_sources([server.url]).report
    assert judged(offline, str(folder), server.url) == judged(live, server.url, server.url)

    runner = CliRunner()
    verified = runner.invoke(main, ["verify", str(folder)])
    assert verified.exit_code == 0 and verified.output.startswith("verified:")
    bundle = tmp_path / "bundle"
    assert runner.invoke(main, ["audit", str(folder), "--bundle", str(bundle)]).exit_code == 0
    assert runner.invoke(main, ["verify", str(bundle)]).exit_code == 0


def test_every_page_of_a_paged_collection(servers, tmp_path):
    """Pages of one item each: every runs and events page is followed to its end, and the
    audit is the same as with full pages."""
    server = servers["v0.22.5/multi-replica-crash"]
    small = collect_into(server.url, server.token, tmp_path / "small", page_size=1)
    full = collect_into(server.url, server.token, tmp_path / "full")
    events = sum(p.items for p in full.pages if p.path == "/api/events/list")
    assert events > 50
    small_events = [p for p in small.pages if p.path == "/api/events/list"]
    assert sum(p.items for p in small_events) == events
    assert len(small_events) == events + len(small.projects)  # one short page per project
    assert {p.items for p in small.pages if p.path == "/api/runs/list"} == {0, 1}
    a = open_sources([tmp_path / "small"]).report
    b = open_sources([tmp_path / "full"]).report
    assert a.findings and found_victims(a) == found_victims(b)
    item = re.compile(r"page-\d+\.json#/\d+")  # the same event, on another page
    small_view = judged(a, str(tmp_path / "small"), "X")
    full_view = judged(b, str(tmp_path / "full"), "X")
    assert json.loads(item.sub("item", json.dumps(small_view))) == json.loads(
        item.sub("item", json.dumps(full_view))
    )


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_cli_end_to_end_token_in_no_output(servers, tmp_path):
    server = servers["v0.22.5/seed"]
    env = {"DSTACK_TOKEN": server.token}
    outputs = []
    for fmt in ("table", "json", "markdown"):
        done = run_cli("audit", server.url, "--format", fmt, env=env)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    with_option = run_cli("audit", server.url, "--token", server.token, "--fail-on-findings")
    assert with_option.returncode == 1  # the seed capture's finding
    outputs += [with_option.stdout, with_option.stderr]
    collected = run_cli("collect", server.url, "--to", str(tmp_path / "c"), env=env)
    assert collected.returncode == 0, collected.stderr
    assert "pages/s" in collected.stdout
    outputs += [collected.stdout, collected.stderr, all_text(tmp_path / "c")]
    assert "collateral_termination" in outputs[0]
    assert all(server.token not in text for text in outputs)
    refused = run_cli("audit", server.url, "--bundle", str(tmp_path / "b"), env=env)
    assert refused.returncode == 2 and "collect them first" in refused.stderr
    page = tmp_path / "c" / "runs_list" / "acme" / "page-001.json"
    page.write_bytes(page.read_bytes().replace(b'"failed"', b'"running"', 1))
    changed = CliRunner().invoke(main, ["verify", str(tmp_path / "c")])
    assert changed.exit_code == 1 and "page changed: runs_list/acme/page-001.json" in changed.output
    codes = {lim.code for lim in open_sources([tmp_path / "c"]).report.limitations}
    assert "collection_altered" in codes


def test_wrong_token(servers, tmp_path):
    server = servers["v0.22.5/seed"]
    wrong = "0badc0de-0000-4000-8000-000000000000"
    runner = CliRunner()
    for args in (["audit", server.url], ["collect", server.url, "--to", str(tmp_path / "c")]):
        line = one_line_error(runner.invoke(main, [*args, "--token", wrong]))
        assert "refused the token (HTTP 401" in line or "refused the token (HTTP 403" in line
        assert wrong not in line
    assert not (tmp_path / "c").exists()
    assert list(tmp_path.iterdir()) == []


def test_no_token(servers, monkeypatch):
    monkeypatch.delenv("DSTACK_TOKEN", raising=False)
    line = one_line_error(CliRunner().invoke(main, ["audit", servers["v0.22.5/seed"].url]))
    assert "dstack 0.22.5 answers, but no token was given" in line


@pytest.fixture
def plain_http_server(tmp_path):
    """Python's http.server: answers GET with a listing, POST with 501."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_url_that_is_not_a_dstack_server(plain_http_server, tmp_path):
    runner = CliRunner()
    line = one_line_error(runner.invoke(main, ["audit", plain_http_server, "--token", "t0ken"]))
    assert "not a dstack server (POST /api/server/get_info answered HTTP 501)" in line
    assert "not a dstack-audit dataset" in line
    target = tmp_path / "out" / "c"
    line = one_line_error(
        runner.invoke(main, ["collect", plain_http_server, "--to", str(target), "--token", "t0k"])
    )
    assert "not a dstack server" in line
    assert not target.exists()


def test_unreachable_server(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(CliRunner().invoke(main, ["audit", url, "--token", "t0ken"]))
    assert "cannot reach the server" in line


def test_tls_failure(tmp_path):
    """A TLS server with a self-signed certificate: the certificate is refused in one line."""
    key, cert = self_signed(tmp_path)
    port = free_port()
    serve = (
        "import http.server, ssl, sys\n"
        "server = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), "
        "http.server.SimpleHTTPRequestHandler)\n"
        "context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
        "context.load_cert_chain(sys.argv[2], sys.argv[3])\n"
        "server.socket = context.wrap_socket(server.socket, server_side=True)\n"
        "server.serve_forever()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", serve, str(port), str(cert), str(key)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        url = f"https://127.0.0.1:{port}"
        line = one_line_error(CliRunner().invoke(main, ["audit", url, "--token", "t0ken"]))
        assert "TLS certificate not accepted" in line
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_server_dies_mid_collection(own_server, tmp_path):
    """The server is killed after the third page: one line naming the call, nothing written."""
    pages = []

    def kill_after_three(page) -> None:
        pages.append(page)
        if len(pages) == 3:
            own_server.kill()

    target = tmp_path / "out" / "collected"
    with pytest.raises(AuditInputError) as raised:
        collect(own_server.url, target, own_server.token, page_size=1, on_page=kill_after_three)
    message = str(raised.value)
    assert "\n" not in message and own_server.token not in message
    assert "cannot reach the server" in message and "after 4 tries" in message
    assert f"nothing was written to {target}" in message
    assert not target.exists()
    assert list((tmp_path / "out").iterdir()) == []  # no half-written folder left behind


def test_dstack_cli_configuration(servers, tmp_path, monkeypatch):
    """`dstack:` and `dstack:PROJECT` from the config.yml that the real `dstack project add`
    writes."""
    server = servers["v0.22.5/seed"]
    home = tmp_path / "home"
    home.mkdir()
    for name in ("main", "acme"):  # with -y, each added project becomes the default
        added = subprocess.run(
            [
                *(str(DSTACK), "project", "add", "--name", name, "--url", server.url),
                *("--token", server.token, "-y"),
            ],
            env=quiet_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert added.returncode == 0, added.stderr
    assert (home / ".dstack" / "config.yml").is_file()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DSTACK_TOKEN", raising=False)
    truth = load_truth(CAPTURES / "v0.22.5" / "seed" / "truth.json")
    default = open_sources(["dstack:"]).report
    check_truth(default, truth)
    assert open_sources(["dstack:main"]).report.runs == []
    runner = CliRunner()
    result = runner.invoke(main, ["collect", "dstack:acme", "--to", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["projects"] == ["acme"]
    line = one_line_error(runner.invoke(main, ["audit", "dstack:nope"]))
    assert "no project 'nope' (configured: main, acme)" in line


def test_stop_reaching_a_running_victim_through_the_api(copy_db, tmp_path):
    """The stop-after-kill variant whose stop reaches the RUNNING victim (TERMINATED_BY_USER),
    served by dstack itself and collected: the same finding as from its database."""
    from test_moments import _check_stopped_during_cascade, _stop_reaches_victim_db

    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "server.db").write_bytes(_stop_reaches_victim_db(copy_db).read_bytes())
    server = DstackServer(capture, tmp_path / "dstack")
    try:
        server.wait()
        collect(server.url, tmp_path / "collected", server.token)
    finally:
        server.stop()
    report = open_sources([tmp_path / "collected"]).report
    _check_stopped_during_cascade(
        report, False, victim_label="got TERMINATED_BY_USER", final="stopped_by_user"
    )


RELEASE = re.compile(r"^release [^:]+:")


def exposure_of(source: str, *options: str, env: dict[str, str] | None = None) -> dict:
    """`dstack-audit exposure SOURCE --format json`, with what only names the source made
    alike: the pages' and rows' provenance, and the release (a database knows it from its
    alembic head, `0.22.1-0.22.5`; a server says `0.22.5`)."""
    result = CliRunner().invoke(main, ["exposure", source, "--format", "json", *options], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for service in report["services"]:
        service["dstack_release"] = None
        service["reasons"] = [RELEASE.sub("release:", reason) for reason in service["reasons"]]
        for fleet in service["fleets"]:
            fleet["provenance"] = None
            for instance in fleet["instances"]:
                instance["provenance"] = None
    return report


@pytest.mark.parametrize("truth_path", TRUTHS, ids=capture_id)
def test_exposure_of_a_live_server_and_its_collection_equal_the_database(
    servers, truth_path, tmp_path
):
    """Issue 25: the fleets and instances read through the API give the offline answer. The
    default moment may differ: a database also dates the fleets' and instances' processing
    (last_processed_at), which the API does not show; at one moment everything is the same."""
    server = servers[capture_id(truth_path)]
    env = {"DSTACK_TOKEN": server.token}
    folder = tmp_path / "collected"
    collect(server.url, folder, server.token)
    db = str(truth_path.parent / "server.db")
    offline = exposure_of(db)
    assert "no_fleet_tables" not in {lim["code"] for lim in offline["limitations"]}
    moments = [offline["as_of"].removesuffix("Z")]
    updates = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
        "SELECT max(recorded_at) FROM events WHERE message LIKE 'Run updated.%'"
    )
    (update,) = updates.fetchone()
    if update:  # just before the last rollout, when its surge replica was placed
        moments.append(update[:19])
    for moment in moments:
        expected = exposure_of(db, "--as-of", moment)
        assert exposure_of(server.url, "--as-of", moment, env=env) == expected
        assert exposure_of(str(folder), "--as-of", moment) == expected
    asked = datetime.now(UTC)
    live = exposure_of(server.url, env=env)
    # a live server is assessed as of now (issue 37), never before its last record
    assert datetime.fromisoformat(live["as_of"]) >= min(
        asked, datetime.fromisoformat(offline["as_of"])
    )
    for report in (live, offline):
        report.pop("as_of")
        for service in report["services"]:
            service.pop("as_of")
    assert live == offline
    assert server.token not in json.dumps(live)
