"""Partitions audited as tasks on a real Dask cluster (a scheduler and two workers started with
the `dask scheduler` / `dask worker` commands on 127.0.0.1) and on local processes of our own
(`--workers`).
The merged report must be the single-process report, field for field."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from analyzer.api import audit_in_partitions, one_server_each, open_sources, report_fleet
from analyzer.cluster import FleetTasks, audit_servers, audit_servers_locally
from analyzer.errors import AuditInputError
from analyzer.render.report_json import json_fleet, json_pieces
from analyzer.synth import synthesize
from tests.conftest import (
    CAPTURES,
    ROOT,
    children_of,
    left_unchanged,
    plant_env_secret,
    plant_failure_message,
    still_running,
    where_sent,
)

distributed = pytest.importorskip(
    "distributed", reason="Dask distributed is not installed: pip install 'dstack-audit[cluster]'"
)

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """tcp://127.0.0.1:PORT of a scheduler with two one-thread workers, started in a folder of
    their own (so every path they open must be given absolute), stopped even on failure."""
    home = tmp_path_factory.mktemp("dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    worker = [BIN / "dask", "worker", address, "--host", "127.0.0.1", "--nthreads", "1"]
    commands = [
        [BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        *([*worker, "--no-dashboard", "--name", f"worker-{i}"] for i in range(2)),
    ]
    processes = []
    try:
        for number, command in enumerate(commands):
            log = (home / f"process-{number}.log").open("w")
            processes.append(
                subprocess.Popen(command, cwd=home, stdout=log, stderr=subprocess.STDOUT)
            )
            if number == 0:
                _wait_for_port(port, processes[0], home)
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for process in reversed(processes):
            _stop(process)


def _wait_for_port(port: int, process: subprocess.Popen, home: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dask scheduler exited: {(home / 'process-0.log').read_text()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail("dask scheduler did not listen within 120 s")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[str]:
    """A synthetic server of 200 runs and several real captures, as absolute paths."""
    out = tmp_path_factory.mktemp("synth") / "fleet"
    synthesize(out, 200, seed=3)
    captures = [
        CAPTURES / "v0.22.5" / name / "server.db"
        for name in ("seed", "multi-replica-crash", "rolling-ok", "scale-up-fails")
    ]
    return [str(out / "server.db"), *map(str, captures), str(CAPTURES / "v0.20/seed/server.db")]


def _labels(sources: list[str]) -> list[str]:
    """Each source its own dstack server, so the captures' runs stay apart."""
    return [f"--server-label=s{i}={source}" for i, source in enumerate(sources)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BIN / "dstack-audit", *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


@pytest.fixture(scope="module")
def single(sources) -> dict:
    result = _cli("audit", *_labels(sources), "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _assert_same_report(partitioned: dict, single: dict) -> None:
    """The partitioned report is the single-process one, byte for byte as JSON: the capacity
    foresight included, though an instance is held by runs of every partition (it is worked
    out at the merge, over every partition's facts)."""
    assert json.dumps(partitioned) == json.dumps(single)


def test_a_scheduler_and_two_workers_give_the_single_process_report(scheduler, sources, single):
    result = _cli("audit", *_labels(sources), "--cluster", scheduler, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert single["summary"]["victims"] > 0
    assert report["summary"]["runs"] == single["summary"]["runs"] > 200
    assert report["runs"] == single["runs"]
    _assert_same_report(report, single)


def test_two_local_workers_give_the_single_process_report(sources, single):
    result = _cli("audit", *_labels(sources), "--workers", "2", "--format", "json")
    assert result.returncode == 0, result.stderr
    _assert_same_report(json.loads(result.stdout), single)


def test_the_library_takes_a_client_and_a_dataset_url(scheduler, sources, tmp_path):
    """An ingested dataset is opened by the workers from its location, partition pushed down."""
    from click.testing import CliRunner

    from analyzer.cli import main

    dataset = tmp_path / "dataset"
    ingest = CliRunner().invoke(main, ["ingest", *sources[1:], "--to", str(dataset)])
    assert ingest.exit_code == 0, ingest.output
    whole = open_sources([dataset]).report
    with distributed.Client(scheduler) as client:
        merged = audit_in_partitions([dataset], 5, client=client)
    assert whole.findings
    assert merged.model_dump() == whole.model_dump()
    assert [i.kind for i in merged.inputs][-1] == "dataset"


def test_an_unreadable_input_on_a_worker_is_the_same_one_line_error(scheduler, tmp_path):
    broken = tmp_path / "server.db"
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    alone = _cli("audit", str(broken))
    on_cluster = _cli("audit", str(broken), "--cluster", scheduler)
    assert alone.returncode == on_cluster.returncode == 2
    assert on_cluster.stderr == alone.stderr
    assert on_cluster.stderr.count("\n") == 1 and str(broken) in on_cluster.stderr
    assert "Traceback" not in on_cluster.stderr and not on_cluster.stdout


def test_workers_of_another_version_are_refused(scheduler, sources):
    def set_version(version: str) -> None:
        import analyzer.pipeline.assemble

        analyzer.pipeline.assemble.__version__ = version

    with distributed.Client(scheduler) as client:
        client.run(set_version, "0.0.0-other")
        try:
            result = _cli("audit", sources[1], "--cluster", scheduler)
        finally:
            client.run(set_version, __import__("analyzer").__version__)
    assert result.returncode == 2
    assert result.stderr.startswith("dstack-audit: --cluster: workers run dstack-audit 0.0.0-other")


def test_inputs_read_whole_by_every_partition_are_refused(scheduler):
    """A log is read whole by every partition: merging would count its runs once per task."""
    logs = CAPTURES / "v0.22.5" / "rolling-ok" / "logs"
    on_cluster = _cli("audit", str(logs), "--cluster", scheduler)
    sequential = _cli("audit", str(logs), "--partitions", "2")
    assert on_cluster.returncode == sequential.returncode == 2
    assert on_cluster.stderr == sequential.stderr
    assert on_cluster.stderr.count("\n") == 1
    assert f"{logs}/server-info." in on_cluster.stderr
    assert "cannot be read one partition at a time" in on_cluster.stderr


def _audit_in_process(*args: str):
    from click.testing import CliRunner

    from analyzer.cli import main

    return CliRunner().invoke(main, ["audit", *args])


def test_an_unreachable_scheduler_is_one_line_and_exit_2(sources):
    import dask

    address = f"tcp://127.0.0.1:{_free_port()}"
    with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
        result = _audit_in_process(sources[1], "--cluster", address)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    expected = f"dstack-audit: --cluster: cannot reach the Dask scheduler at {address} "
    assert result.stderr.startswith(expected)
    assert not result.stdout


def test_a_scheduler_without_workers_is_one_line_and_exit_2(sources, monkeypatch):
    from analyzer import cluster

    monkeypatch.setattr(cluster, "WORKER_WAIT_SECONDS", 1)
    with distributed.LocalCluster(
        n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None
    ) as empty:
        result = _audit_in_process(sources[1], "--cluster", empty.scheduler_address)
    assert result.exit_code == 2
    assert result.stderr == (
        f"dstack-audit: --cluster: the scheduler at {empty.scheduler_address} has no workers "
        "after 1 s\n"
    )


def test_standard_input_and_conflicting_options_are_refused(sources):
    stdin = _audit_in_process("-", "--workers", "2")
    assert stdin.exit_code == 2
    assert stdin.stderr.startswith("dstack-audit: -: standard input cannot be sent to the workers")
    both = _audit_in_process(sources[1], "--workers", "2", "--cluster", "tcp://127.0.0.1:1")
    assert both.exit_code == 2 and "cannot be combined with --cluster" in both.stderr


def test_without_distributed_the_error_names_the_extra(sources, monkeypatch):
    """The package hidden from the import system, as on an install without the extra."""
    monkeypatch.setitem(sys.modules, "distributed", None)
    result = _audit_in_process(sources[1], "--cluster", "tcp://127.0.0.1:1")
    assert result.exit_code == 2
    assert result.stderr == (
        "dstack-audit: --workers/--cluster: Dask distributed is not installed "
        "(install the extra: pip install 'dstack-audit[cluster]')\n"
    )


def test_local_workers_need_no_dask(sources, single, monkeypatch):
    """`--workers` runs one server's partitions on local processes of its own, as a fleet's
    servers: Dask hidden from the import system, the report is still the one process's."""
    monkeypatch.setitem(sys.modules, "distributed", None)
    result = _audit_in_process(*_labels(sources), "--workers", "2", "--format", "json")
    assert result.exit_code == 0, result.stderr
    _assert_same_report(json.loads(result.stdout), single)


def test_start_up_does_not_import_dask():
    code = (
        "import sys, analyzer.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# A fleet of dstack servers: one server per task (issue 38)


def test_a_fleet_of_databases_is_one_server_per_task(scheduler, sources):
    """Several databases, each a server of its own, are audited one server per task, named
    as one process names them, and merge into the one-process report byte for byte."""
    fleet = [s for s in sources if "v0.20" not in s]  # each a server of its own
    servers = one_server_each(fleet)
    assert servers is not None and [paths for paths, _ in servers] == [[s] for s in fleet]
    one = _cli("audit", *fleet, "--format", "json")
    assert one.returncode == 0, one.stderr
    assert sorted({v["server"] for v in json.loads(one.stdout)["runs"]}) == sorted(
        label for _, label in servers
    )
    whole = open_sources(fleet).report
    with distributed.Client(scheduler, timeout=60) as client:
        report = audit_servers(client, servers, report_fleet())
        rendered = audit_servers(client, servers, json_fleet())
    assert report is not None and rendered is not None
    assert report.model_dump_json() == whole.model_dump_json()
    # the JSON fleet: each server's runs and findings rendered in its task, merged here
    assert "".join(rendered.pieces()) == "".join(json_pieces(whole)) == one.stdout
    assert rendered.report.summary == whole.summary
    done = _cli("audit", *fleet, "--cluster", scheduler, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert done.stdout == one.stdout


def test_a_fleet_on_local_workers_is_the_one_process_report(sources):
    """`--workers 2` audits a fleet on two local processes of its own (no Dask cluster), one
    server per task: the JSON rendered in the tasks, the markdown from the merged report, both
    byte for byte what one process writes, and --fail-on-findings exits alike."""
    fleet = [s for s in sources if "v0.20" not in s]
    written = {}
    for fmt, gate in (("json", ["--fail-on-findings"]), ("markdown", [])):
        one = _cli("audit", *fleet, "--format", fmt, *gate)
        local = _cli("audit", *fleet, "--workers", "2", "--format", fmt, *gate)
        assert one.returncode == local.returncode == (1 if gate else 0), local.stderr
        assert local.stdout == one.stdout and not local.stderr
        written[fmt] = local.stdout
    assert json.loads(written["json"])["summary"]["victims"] > 0


def test_an_unreadable_server_on_local_workers_is_the_same_one_line_error(tmp_path):
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    given = [str(CAPTURES / "v0.22.5" / "seed" / "server.db"), str(broken)]
    alone = _cli("audit", *given)
    local = _cli("audit", *given, "--workers", "2")
    assert alone.returncode == local.returncode == 2
    assert local.stderr == alone.stderr and local.stderr.count("\n") == 1
    assert str(broken) in local.stderr and not local.stdout


def test_copies_of_one_database_give_way_to_the_partitions(scheduler, tmp_path):
    """Two copies of a database hold the same runs, which one process makes one server: the
    one-server-per-task audit gives way to the partitions (the report `--partitions 2` gives)."""
    seed = CAPTURES / "v0.22.5" / "seed" / "server.db"
    copy = tmp_path / "copy" / "server.db"
    copy.parent.mkdir()
    copy.write_bytes(seed.read_bytes())
    given = [str(seed), str(copy)]
    with distributed.Client(scheduler, timeout=60) as client:
        assert audit_servers(client, one_server_each(given), report_fleet()) is None
    assert audit_servers_locally(2, one_server_each(given), json_fleet()) is None
    partitioned = _cli("audit", *given, "--partitions", "2", "--format", "json")
    done = _cli("audit", *given, "--cluster", scheduler, "--format", "json")
    local = _cli("audit", *given, "--workers", "2", "--format", "json")
    assert partitioned.returncode == done.returncode == local.returncode in (0, 1)
    assert done.stdout == partitioned.stdout == local.stdout
    assert json.loads(done.stdout)["summary"]["victims"] > 0


def test_only_databases_alone_are_split_by_server():
    seed = CAPTURES / "v0.22.5" / "seed"
    crash = CAPTURES / "v0.22.5" / "multi-replica-crash"
    assert one_server_each([seed / "server.db"]) is None  # one server: partitions
    assert one_server_each([seed / "server.db", seed / "logs" / "server-info.json.log"]) is None
    assert one_server_each([seed, crash]) is None  # folders: what joins what needs reading
    servers = one_server_each([seed / "server.db", crash / "server.db"])
    assert servers == [
        ([str(seed / "server.db")], "seed/server.db"),
        ([str(crash / "server.db")], "multi-replica-crash/server.db"),
    ]


def test_a_secret_one_server_knows_is_masked_in_every_server(scheduler, tmp_path):
    """A token in one server's job spec, repeated in another server's termination message:
    one process masks it in both, and so does the one-server-per-task audit."""
    secret = "hf_PlantedAcrossServers_4242"
    seed, crash = tmp_path / "seed.db", tmp_path / "crash.db"
    seed.write_bytes((CAPTURES / "v0.22.5" / "seed" / "server.db").read_bytes())
    crash.write_bytes((CAPTURES / "v0.22.5" / "multi-replica-crash" / "server.db").read_bytes())
    plant_env_secret(seed, secret)
    plant_failure_message(crash, f"exited: token {secret} rejected")
    given = [str(seed), str(crash)]
    one = _cli("audit", *given, "--format", "json")
    done = _cli("audit", *given, "--cluster", scheduler, "--format", "json")
    local = _cli("audit", *given, "--workers", "2", "--format", "json")
    assert secret not in one.stdout and "token *** rejected" in one.stdout
    assert done.stdout == one.stdout == local.stdout


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_ctrl_c_stops_the_local_workers_and_leaves_no_output(sources, tmp_path):
    """Ctrl-C (SIGINT to the whole foreground group) while the local worker processes audit
    the fleet: exit 130, no partial output, and no worker process left behind."""
    out = tmp_path / "report.json"
    fleet = [s for s in sources if "v0.20" not in s]
    command = [BIN / "dstack-audit", "audit", *fleet, "--workers", "2", "-o", str(out), "-q"]
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(workers := children_of(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # a worker (the command's own process is the other) and
    assert len(workers) >= 2, "the worker process did not start"  # multiprocessing's tracker
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the audit finished before the signal")
    assert process.returncode == 130, stderr
    assert stderr.decode().strip() == "dstack-audit: interrupted"
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 10
    while (left := still_running(workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


def test_the_command_s_own_process_is_one_of_the_local_workers():
    """`--workers 2` starts one process and audits in its own: each server audited once, in
    one of the two, the parts merged in the order given."""
    servers = [([f"/nowhere/{n}.db"], f"s{n}") for n in range(6)]
    parts = audit_servers_locally(2, servers, FleetTasks(where_sent, left_unchanged, list))
    assert [label for label, _ in parts] == [label for _, label in servers]
    processes = {pid for _, pid in parts}
    assert os.getpid() in processes and len(processes) == 2


def _in_the_client(paths, label, options):
    """The command's own process audits a server too: slowly, so the worker takes the other."""
    time.sleep(1)
    return SimpleNamespace(head=None)


def _raises_unpicklable(paths, label, options):
    if multiprocessing.parent_process() is None:
        return _in_the_client(paths, label, options)
    raise ValueError(lambda: label)  # a lambda cannot be pickled: the error cannot travel whole


def _dies(paths, label, options):
    if multiprocessing.parent_process() is None:
        return _in_the_client(paths, label, options)
    os._exit(9)  # as the kernel's OOM killer ends a worker


def test_a_local_worker_s_failure_reaches_the_client(tmp_path):
    """An error that cannot be pickled arrives as its text; a worker process that dies is one
    AuditInputError naming --workers, not a hang (while the command's own process audits the
    other server)."""
    servers = [([str(tmp_path / "a.db")], "a"), ([str(tmp_path / "b.db")], "b")]
    fleet = FleetTasks(_raises_unpicklable, report_fleet().finish, report_fleet().merge)
    with pytest.raises(RuntimeError, match=r"^ValueError: <function"):
        audit_servers_locally(2, servers, fleet)
    fleet = FleetTasks(_dies, report_fleet().finish, report_fleet().merge)
    with pytest.raises(AuditInputError, match="a worker process died"):
        audit_servers_locally(2, servers, fleet)


def test_a_local_worker_that_dies_with_servers_left_says_it_died_auditing(tmp_path):
    """A worker is sent its next server before its head is read: when it died while auditing
    with servers still to give out, that send fails first, and the error still says when it
    died, not that it died before it was sent its work."""
    servers = [([str(tmp_path / f"{name}.db")], name) for name in "abcd"]
    fleet = FleetTasks(_dies, report_fleet().finish, report_fleet().merge)
    with pytest.raises(AuditInputError, match=r"^--workers: a worker process died while auditing"):
        audit_servers_locally(2, servers, fleet)
