"""A fleet's local worker processes (`--workers N` over several databases), started by the
command before it imports the pipeline: their start-up overlaps the command's own."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    CAPTURES,
    LOOKED_AHEAD,
    ROOT,
    LateHead,
    children_of,
    left_unchanged,
    noted_ahead,
    plant_env_secret,
    plant_failure_message,
    read_until_closed,
    slower_in_a_worker,
    still_running,
    where_kept,
    where_sent,
    with_late_head,
)

from analyzer import cores
from analyzer.api import audit_server, finish_server, look_ahead
from analyzer.cluster import FleetTasks, audit_servers_locally
from analyzer.cluster_local import AUDITED, _served, may_be_a_fleet, started
from analyzer.collector import paused
from analyzer.errors import AuditInputError

SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"


def test_only_two_or_more_distinct_databases_may_be_a_fleet(tmp_path):
    seed, crash = str(SEED / "server.db"), str(CRASH / "server.db")
    assert may_be_a_fleet([seed, crash])
    assert not may_be_a_fleet([seed])
    assert not may_be_a_fleet([seed, seed])
    assert not may_be_a_fleet([seed, str(SEED / "logs")])  # a folder
    assert not may_be_a_fleet([seed, str(SEED / "logs" / "server-info.json.log")])
    assert not may_be_a_fleet([seed, str(tmp_path / "missing.db")])
    assert not may_be_a_fleet([seed, "-"])


def test_workers_started_beforehand_audit_the_fleet_and_are_stopped_after():
    servers = [([f"/nowhere/{n}.db"], f"s{n}") for n in range(6)]
    with started(1) as workers:
        [worker] = workers.processes
        fleet = FleetTasks(where_sent, left_unchanged, list)
        parts = audit_servers_locally(2, servers, fleet, started=workers)
        assert worker.is_alive()  # told it is done, not waited for: its owner stops it
    assert [label for label, _ in parts] == [label for _, label in servers]
    assert {pid for _, pid in parts} == {os.getpid(), worker.pid}
    assert worker.exitcode is not None


def test_a_worker_still_ignores_ctrl_c_once_polars_is_imported():
    """Not in the issue: a worker ignores Ctrl-C (the client stops it), and polars' import
    put a SIGINT handler of its own in place of the ignoring (pola-rs/polars#21739), one that
    would abort the query in hand and print the worker's traceback on the terminal. Read from
    the worker's /proc status once polars' runtime is loaded there."""

    def flags(pid: int, name: str) -> int:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(line for line in lines if line.startswith(name)).split()[1], 16)

    with started(1, preload=("polars",)) as workers:
        [worker] = workers.processes
        maps = Path(f"/proc/{worker.pid}/maps")
        deadline = time.monotonic() + 60
        while "_polars_runtime" not in maps.read_text():
            assert time.monotonic() < deadline, "polars never loaded in the worker"
            time.sleep(0.05)
        time.sleep(0.5)  # its import ends: the handler is put back right after
        sigint = 1 << (2 - 1)
        assert flags(worker.pid, "SigIgn") & sigint
        assert not flags(worker.pid, "SigCgt") & sigint


@pytest.mark.skipif(len(cores.usable()) < 2, reason="one core: nothing to share out")
def test_as_many_processes_as_cores_each_keep_to_a_core_of_their_own():
    """Each process runs polars on one thread then: its threads kept on one core, its own, so
    that its thread and its pool's hand over in place; the command's cores given back after."""
    usable = cores.usable()
    servers = [([f"/nowhere/{n}.db"], f"s{n}") for n in range(2 * len(usable))]
    with started(len(usable) - 1) as workers:
        fleet = FleetTasks(where_kept, left_unchanged, list)
        parts = audit_servers_locally(len(usable), servers, fleet, started=workers)
    kept = {pid: seen for _, pid, seen in parts}
    assert len(kept) == len(usable)  # every process audited servers
    assert all(len(seen) == 1 and len(next(iter(seen))) == 1 for seen in kept.values())
    assert sorted(next(iter(next(iter(seen)))) for seen in kept.values()) == usable
    assert os.sched_getaffinity(0) == set(usable)


def test_a_worker_dead_before_its_work_is_one_error_naming_workers():
    servers = [([f"/nowhere/{n}.db"], f"s{n}") for n in range(2)]
    with started(1) as workers:
        [worker] = workers.processes
        worker.kill()  # as the kernel's OOM killer ends it
        worker.join()
        with pytest.raises(AuditInputError, match=r"^--workers: a worker process died before"):
            audit_servers_locally(
                2, servers, FleetTasks(where_sent, left_unchanged, list), started=workers
            )


def test_the_command_s_own_servers_are_looked_at_ahead_while_a_worker_still_audits():
    """Once no server is left for the command's own process and a worker still audits one,
    each server it audited itself is looked at ahead (FleetTasks.ahead) with the secret
    values of the heads in by then: its own servers', not the worker's."""
    servers = [([f"/nowhere/{n}.db"], f"s{n}") for n in range(3)]
    LOOKED_AHEAD.clear()
    with started(1) as workers:
        fleet = FleetTasks(slower_in_a_worker, left_unchanged, list, ahead=noted_ahead)
        parts = audit_servers_locally(2, servers, fleet, started=workers)
    mine = {label for label, pid in parts if pid == os.getpid()}
    assert len(mine) == 2  # the worker audited one server meanwhile
    assert sorted(label for label, _ in LOOKED_AHEAD) == sorted(mine)
    assert {known for _, known in LOOKED_AHEAD} == {frozenset(f"secret-of-{s}" for s in mine)}


def test_a_secret_only_another_server_knows_is_masked_after_a_look_ahead(tmp_path):
    """A token in one server's job spec, repeated in another's failure message: the other
    server's look ahead with its own secret values finds nothing, and its finish, given every
    server's, still masks the token (it looks for the values the look ahead was not given)."""
    secret = "hf_PlantedAcrossServers_4242"
    seed, crash = tmp_path / "seed.db", tmp_path / "crash.db"
    seed.write_bytes((SEED / "server.db").read_bytes())
    crash.write_bytes((CRASH / "server.db").read_bytes())
    plant_env_secret(seed, secret)
    plant_failure_message(crash, f"exited: token {secret} rejected")
    holder = audit_server([str(seed)], "seed", {})
    every = holder.secrets | audit_server([str(crash)], "crash", {}).secrets
    finished = []
    for ahead in (frozenset(), every - holder.secrets, every):
        repeater = audit_server([str(crash)], "crash", {})
        assert secret in repeater.report.model_dump_json()
        look_ahead(repeater, ahead)
        assert repeater.looked == (None if secret in ahead else ahead)
        finished.append(finish_server(repeater, every).model_dump_json())
    assert secret not in finished[0] and "token *** rejected" in finished[0]
    assert finished.count(finished[0]) == 3


def test_a_worker_says_a_task_is_done_before_it_builds_and_sends_its_head():
    """The dispatcher sends a worker its next server on that word: the worker pickles and
    sends its head while the next server waits for it in the pipe, not a round trip after."""
    client, worker = multiprocessing.Pipe()
    LateHead.client, LateHead.built = client, threading.Event()
    serving = threading.Thread(target=_served, args=(worker,))
    serving.start()
    try:
        client.send(FleetTasks(with_late_head, left_unchanged, list))
        client.send((0, (["/nowhere/0.db"], "s0", {})))
        assert LateHead.built.wait(10)
        assert client.recv() == (True, AUDITED)
        assert client.recv() == (True, True)  # the word was waiting when the head was built
    finally:
        client.send(None)
        serving.join(10)
    assert not serving.is_alive()


def test_workers_started_for_no_fleet_are_stopped_unused():
    with started(1, preload=["analyzer.api"]) as workers:
        [worker] = workers.processes
    assert worker.exitcode is not None


def test_what_a_fleet_keeps_is_set_aside_from_the_cycle_collector():
    """Kept to the end of the process (a fleet's heads and merge): frozen on leaving, so no
    pass walks them; not on an error; the collector on again either way."""
    was_on = gc.isenabled()
    gc.enable()
    try:
        frozen = gc.get_freeze_count()
        with paused(keep=True):
            assert not gc.isenabled()
            kept = [[n] for n in range(10_000)]
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
        gc.unfreeze()
        try:
            with paused(keep=True):
                lost = [[n] for n in range(10_000)]
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        assert gc.isenabled() and gc.get_freeze_count() < len(lost)
    finally:
        gc.unfreeze()
        if not was_on:
            gc.disable()


# The command run with its worker pool's start recorded: was the pipeline imported by then?
RECORDED = """
import sys
import analyzer.cluster_local as local
start = local.Workers.__init__
def recorded(self, *args, **kwargs):
    print("pipeline imported:", "polars" in sys.modules, file=sys.stderr)
    start(self, *args, **kwargs)
local.Workers.__init__ = recorded
from analyzer.cli import main
main()
"""


def test_the_command_starts_its_workers_before_its_own_imports():
    given = [str(SEED / "server.db"), str(CRASH / "server.db")]
    argv = ["audit", *given, "--format", "json", "-q"]
    local = subprocess.run(
        [sys.executable, "-c", RECORDED, *argv, "--workers", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    one = subprocess.run(
        [sys.executable, "-m", "analyzer", *argv], capture_output=True, text=True, cwd=ROOT
    )
    assert local.returncode == one.returncode == 0, local.stderr
    assert local.stderr == "pipeline imported: False\n"
    assert local.stdout == one.stdout


# polars imported while a fleet's worker is started, as the command imports it
SHARING = """
from analyzer.cluster_local import started
with started(1):
    import polars
    print(polars.thread_pool_size())
"""


@pytest.mark.parametrize(("chosen", "size"), [(None, max(1, len(cores.usable()) // 2)), ("3", 3)])
def test_the_command_s_own_polars_shares_the_cores_with_its_workers(chosen, size):
    """The command's process audits servers too: its polars threads and its worker's share
    the cores (one each on two), as a pool the user sized is kept."""
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    shared = subprocess.run(
        [sys.executable, "-c", SHARING],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env if chosen is None else {**env, "POLARS_MAX_THREADS": chosen},
        timeout=60,
    )
    assert shared.returncode == 0, shared.stderr
    assert shared.stdout == f"{size}\n"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_ctrl_c_typed_while_the_workers_start_is_clean(tmp_path):
    """Ctrl-C typed in a terminal the moment the fleet's first process is started (the
    resource tracker, then the worker), while the command starts them and imports: exit 130,
    one line, no traceback from any, no file, none left behind. (It was lost at first: the
    tracker's start unblocked SIGINT while it was ignored for the worker's start.)"""
    out = tmp_path / "report.json"
    given = [str(SEED / "server.db"), str(CRASH / "server.db")]
    pid, leader = pty.fork()
    if pid == 0:  # the child: a shell's foreground job
        os.chdir(ROOT)
        argv = [sys.executable, "-m", "analyzer", "audit", *given, "--workers", "2"]
        os.execv(sys.executable, [*argv, "-o", str(out)])
    deadline = time.monotonic() + 60
    while not (workers := children_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers, "no worker was started"
    os.write(leader, b"\x03")  # Ctrl-C, as typed
    screen = read_until_closed(leader)
    _, status = os.waitpid(pid, 0)
    os.close(leader)
    assert os.waitstatus_to_exitcode(status) == 130, screen
    assert screen.replace(b"^C", b"").strip() == b"dstack-audit: interrupted"  # ^C: the echo
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 10
    while (left := still_running(workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


def test_the_whole_inputs_learnt_in_two_parts_add_up_to_one_learning(tmp_path):
    """`--workers` learns the whole inputs in two parts at once (LEARNING_PARTS), each in its
    own process: together the parts hold every fact one learner learns, each part's run
    tables split by bucket as one learner splits them."""
    from analyzer.sources import learn_whole_inputs
    from analyzer.sources.base import LEARNING_PARTS, WholeInputFacts

    db = CRASH / "server.db"
    alone = WholeInputFacts(split=(2, tmp_path))
    learn_whole_inputs(db, alone)
    parts = {part: WholeInputFacts(split=(2, tmp_path), part=part) for part in LEARNING_PARTS}
    for facts in parts.values():
        learn_whole_inputs(db, facts)
    assert parts["events"].known("sha256", db) is None
    split = {part: facts.known("buckets of 2", db) for part, facts in parts.items()}
    assert split["events"].files.keys() == {"events", "event_targets"}
    assert split["runs"].files.keys() == {"runs", "jobs", "probes"}
    joined = WholeInputFacts()
    for facts in parts.values():
        joined.update(facts)
    for name in ("latest", "sha256"):
        assert joined.known(name, db) == alone.known(name, db) is not None, name
    assert joined.known("runs by service", db).equals(alone.known("runs by service", db))
    assert (
        joined.known("buckets of 2", db).files.keys()
        == alone.known("buckets of 2", db).files.keys()
    )


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_ctrl_c_typed_while_one_server_s_partitions_are_audited_is_clean(tmp_path):
    """Ctrl-C typed in a terminal while `--workers 2` audits one server's partitions (the
    worker learning its part of the whole inputs or auditing its partition, the command its
    own): exit 130, one line, no traceback from any process, no file, none left behind, and
    nothing left of the private folders the workers write into (stopped before they go)."""
    from analyzer.synth import synthesize

    synthesize(tmp_path / "server", 2000, seed=5)  # ~3 s of auditing: still going at the signal
    out = tmp_path / "report.json"
    private = tmp_path / "tmp"
    private.mkdir()
    pid, leader = pty.fork()
    if pid == 0:  # the child: a shell's foreground job
        os.chdir(ROOT)
        db = str(tmp_path / "server" / "server.db")
        argv = [
            sys.executable,
            "-m",
            "analyzer",
            "audit",
            db,
            "--workers",
            "2",
            "-q",
            "-o",
            str(out),
        ]
        os.execve(sys.executable, argv, {**os.environ, "TMPDIR": str(private)})
    deadline = time.monotonic() + 60
    while not (workers := children_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers, "no worker was started"
    # the signal as soon as the whole inputs are being learnt (the runs written by bucket into
    # a private folder), not after a fixed time an audit may finish within
    while not _written_into(private) and time.monotonic() < deadline:
        time.sleep(0.005)
    workers |= children_of(pid)
    os.write(leader, b"\x03")  # Ctrl-C, as typed
    screen = read_until_closed(leader)
    _, status = os.waitpid(pid, 0)
    os.close(leader)
    assert os.waitstatus_to_exitcode(status) == 130, screen
    assert screen.replace(b"^C", b"").strip() == b"dstack-audit: interrupted"  # ^C: the echo
    assert not out.exists()
    assert list(private.iterdir()) == []
    deadline = time.monotonic() + 10
    while (left := still_running(workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


def _written_into(private: Path) -> bool:
    """Whether a file is in a folder the audit made in `private` (none: not yet, or gone)."""
    try:
        return any(any(folder.iterdir()) for folder in private.iterdir() if folder.is_dir())
    except OSError:
        return False


def test_a_learnt_part_sends_the_fleet_tables_mapped_not_as_read(tmp_path):
    """The part that learns the tables read whole sends the other process what the mapping
    made of the fleets and instances, not the tables as read, which no partition reads again
    (the reports stay byte-identical: tests/test_partition_merge.py, the benchmarks' check)."""
    from analyzer.api import RAW_FLEET_TABLES, learn_part
    from analyzer.cluster import Learning

    db = CRASH / "server.db"
    learnt = learn_part([str(db)], Learning(1, 2, 2, str(tmp_path), str(tmp_path)), {})
    kept = {key[0] for key in learnt.facts._facts}
    sent = {key[0] for key in learnt.head._facts}
    assert {name for name in kept if name.startswith(RAW_FLEET_TABLES)} == kept - sent
    assert len(kept - sent) == 2
    assert learnt.head.known("fleets and instances", db) is not None
    assert learnt.head.known("latest", db) == learnt.facts.known("latest", db) is not None


def test_a_learnt_part_sends_the_mapped_fleet_tables_through_files(tmp_path):
    """What the mapping made of the fleets and instances goes to the other process as files
    in the audit's private folder, pickled as their paths (not their frames through the
    pipe); unpickled there, it is the same tables. A process learning alone (`--workers 1`)
    has no other to send them to, and writes none."""
    import pickle

    from analyzer.api import learn_part
    from analyzer.cluster import Learning

    db = CRASH / "server.db"
    learnt = learn_part([str(db)], Learning(1, 2, 2, str(tmp_path), str(tmp_path)), {})
    kept = learnt.facts.known("fleets and instances", db)
    sent = pickle.dumps(learnt.head.known("fleets and instances", db))
    assert len(sent) * 4 < len(pickle.dumps(kept))
    assert any(tmp_path.glob("sent-*.arrow"))
    back = pickle.loads(sent)
    for name in ("fleets", "instances", "fleet_names", "instance_names", "alive"):
        mine, theirs = getattr(kept, name), getattr(back, name)
        assert (mine is None and theirs is None) or mine.equals(theirs), name
    assert back.damage.found.keys() == kept.damage.found.keys()
    alone = tmp_path / "alone"
    alone.mkdir()
    learnt = learn_part([str(db)], Learning(0, 1, 2, str(alone), str(alone)), {})
    assert learnt.head.known("fleets and instances", db) is learnt.facts.known(
        "fleets and instances", db
    )
    assert not any(alone.glob("sent-*"))
