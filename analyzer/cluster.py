"""Audit partitions of whole services as tasks on a Dask cluster, then merge them here.

Each task opens the sources itself, from the paths or URLs it is given (a shared file system,
a database URL, an ingested dataset on object storage through fsspec), with what the client
learnt once of the whole inputs (a file's hash, which runs fall into which partition, the latest
times, the tables every partition reads whole: `WholeInputFacts`), and sends back only its
partition's Report and the few rows the capacity foresight needs of it (the instances its runs
hold, the placements refused to them): the whole frames never travel through the scheduler. The
task is given by the caller (analyzer.api.audit_partition), so this module never imports the api
back; each result goes to the merge's spill as it arrives (`ReportSpill`), the same code as for
partitions audited one after another in one process.

A fleet of dstack servers (several databases, each a server) is audited one server per task
instead (`audit_servers`; with a local `--workers N`, on processes of our own:
`audit_servers_locally`): each task finishes its server (its capacity foresight; for the JSON
report its rendering and redaction too), and only its secret values must be known to the
others before the client puts the parts together (`FleetTasks`).

Dask is imported only here, and only when a command asks for a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from analyzer._version import __version__
from analyzer.cluster_local import Local, Servers, Workers
from analyzer.cluster_local import started as local_workers
from analyzer.collector import paused
from analyzer.errors import AuditInputError
from analyzer.pipeline.partitions import (
    MergedReport,
    PartitionResult,
    ReportSpill,
)
from analyzer.progress import stage
from analyzer.sources.base import LEARNING_PARTS, WholeInputFacts
from analyzer.sources.buckets import emptying

if TYPE_CHECKING:
    from distributed import Client

    from analyzer.contract import Report

INSTALL_HINT = "install the extra: pip install 'dstack-audit[cluster]'"
PARTITIONS_PER_WORKER = 1
"""One task per worker thread: the hash of whole services spreads runs evenly over partitions,
and each extra partition costs a task's start (before the client learnt the whole inputs once,
also one more pass over every database's runs table). Measured then (benchmarks/cluster.py,
2,000 runs, 2 workers, a shared 2-core machine): 2 / 4 / 8 partitions 9.1 / 9.3 / 18.8 s;
`--partitions` sets more, to bound memory."""
WORKER_WAIT_SECONDS = 30


def _distributed():
    try:
        import distributed
    except ImportError as error:
        raise AuditInputError(
            "--workers/--cluster", "Dask distributed is not installed", INSTALL_HINT
        ) from error
    return distributed


@contextmanager
def connect(address: str) -> Iterator[Client]:
    """A client of the Dask scheduler at `address`, closed on leaving."""
    distributed = _distributed()
    try:
        client = distributed.Client(address)
    except (OSError, ValueError, TypeError) as error:
        raise AuditInputError(
            "--cluster",
            f"cannot reach the Dask scheduler at {address} ({type(error).__name__}: {error})",
            "give tcp://HOST:PORT of a running scheduler",
        ) from None
    with client:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError:
            raise AuditInputError(
                "--cluster",
                f"the scheduler at {address} has no workers after {WORKER_WAIT_SECONDS} s",
            ) from None
        yield client


def default_partitions(client: Client) -> int:
    """PARTITIONS_PER_WORKER tasks per worker thread of the cluster."""
    return PARTITIONS_PER_WORKER * max(1, sum(client.nthreads().values()))


def _sendable(paths: Sequence[str | Path]) -> list[str]:
    """The sources as the strings a worker opens; standard input cannot be sent."""
    given = [str(path) for path in paths]
    if not given:
        raise AuditInputError(
            "audit", "no input given", "name a server.db, an export folder or a log"
        )
    if "-" in given:
        raise AuditInputError(
            "-", "standard input cannot be sent to the workers", "save it to a file they can read"
        )
    return given


PartitionTask = Callable[
    [Sequence[str], int, int, dict[str, Any], WholeInputFacts | None], PartitionResult
]
"""(paths, index, count, options, shared) -> the report of partition `index` of `count` and its
share of the capacity foresight: a module-level function, so a worker imports it by name."""
LearnWholeInputs = Callable[[Sequence[str], int | None], WholeInputFacts]
"""(paths, count) -> what every partition would read of the whole inputs, learnt once (given
the `count` of partitions, each database's run tables also written by bucket for them to read
here: local workers only)."""


def audit_partitions(
    client: Client,
    paths: Sequence[str | Path],
    count: int,
    task: PartitionTask,
    spill: ReportSpill,
    *,
    shared: WholeInputFacts,
    **options: Any,
) -> None:
    """The partitions of whole services as `task`s of `client`'s cluster, each result written
    to `spill` as it arrives (merged there as in one process); the facts `shared` of the whole
    inputs are sent once to every worker. An error raised by a task (an unreadable input) is
    raised here unchanged."""
    given = _sendable(paths)
    [facts] = client.scatter([shared], broadcast=True, hash=False)
    futures = client.map(
        task,
        [given] * count,
        range(count),
        count=count,
        options=options,
        shared=facts,
        pure=False,
    )
    for index, result in _arrived(client, futures):
        _same_version([result.report.generated_by])
        spill.add(index, result)


def _gather(client: Client, futures: list) -> list:
    """The tasks' results in order (_arrived)."""
    done = dict(_arrived(client, futures))
    return [done[i] for i in range(len(futures))]


def _arrived(client: Client, futures: list) -> Iterator[tuple[int, Any]]:
    """Each task's index and result as it arrives, its future released then; an error raised
    by a task (an unreadable input) is raised here unchanged, a lost worker or scheduler says
    so."""
    distributed = _distributed()
    index = {future.key: i for i, future in enumerate(futures)}
    arriving = distributed.as_completed(futures, with_results=True)
    try:
        for future, result in arriving:
            yield index[future.key], result
            future.release()
    except distributed.KilledWorker as error:
        raise AuditInputError(
            "--cluster",
            f"workers died while auditing a partition ({error})",
            "more partitions bound each task's memory: --partitions N",
        ) from None
    except distributed.comm.CommClosedError as error:
        raise AuditInputError(
            "--cluster", f"lost the scheduler during the audit ({error})"
        ) from None
    except ImportError as error:
        raise AuditInputError(
            "--cluster",
            f"a worker cannot run the audit ({error})",
            f"install dstack-audit {__version__} on every worker",
        ) from None
    finally:
        if not arriving.is_empty():  # left early (an error): the other tasks are not wanted
            arriving.clear()
            client.cancel(futures)


def _same_version(generated_by: Iterable[str]) -> None:
    """Refuse results of workers that run another version of the tool."""
    versions = set(generated_by) - {f"dstack-audit {__version__}"}
    if versions:
        raise AuditInputError(
            "--cluster",
            f"workers run {', '.join(sorted(versions))}, not dstack-audit {__version__}",
            "install the same version on every worker",
        )


@dataclass(frozen=True)
class FleetTasks:
    """How a fleet of servers is audited one server per task (module-level functions, so a
    worker imports them by name): `audit(paths, label, options)` runs on a worker and its
    result stays there, its `.head` sent to the client at once (analyzer.api.ServerHead: its
    secret values, its runs, the version, its part of the merge); `finish(audited, secrets)`
    runs where `audit` ran, given every server's secret values, and returns its part again
    only when they changed it (else None); `merge` puts the parts together here, in the order
    the servers were given. `then(finished, context)`, when given, is a second step run where
    `finish` ran, on what it returned (one audit's partitions: their capacity foresight, given
    every partition's facts); what `finish` returned is kept there for it, and the client is
    sent `shared(finished)` meanwhile (their foresight pieces alone: the reports come with
    `then`'s answer, not pickled twice on the way to it). `ahead(audited, known)`, when
    given, takes `finish`'s look with what is known so far (a fleet: the secret values of the
    servers done by then) while the command's own process waits for the workers' last tasks
    (analyzer.cluster_local), so that `finish` looks only for the rest."""

    audit: Callable[[Sequence[str], str, dict[str, Any]], Any]
    finish: Callable[[Any, Any], Any]
    merge: Callable[[list[Any]], Any]
    then: Callable[[Any, Any], Any] | None = None
    shared: Callable[[Any], Any] | None = None
    ahead: Callable[[Any, Any], None] | None = None


def _head(audited: Any) -> Any:
    return audited.head


def audit_servers(client: Client, servers: Servers, fleet: FleetTasks, **options: Any) -> Any:
    """A fleet of dstack servers, one server per task of `client`'s cluster, merged by
    `fleet.merge`: the report (or its JSON) one process gives. Servers share no fleet and no
    instance, so each task finishes its own server's capacity foresight; only the secret
    values go round, because one process masks every text with every input's. None when two
    of them turn out to hold the same runs (copies of one database, or a database with no
    run, which one process files with its folder's): then they are one server, and the
    caller audits in partitions instead."""
    order = _largest_first(servers)
    audits = client.map(
        fleet.audit,
        [servers[i][0] for i in order],
        [servers[i][1] for i in order],
        options=options,
        pure=False,
    )
    heads = dict(zip(order, _gather(client, client.map(_head, audits, pure=False)), strict=True))
    secrets = _every_secret(heads)
    if secrets is None:
        return None
    finished = client.map(fleet.finish, audits, secrets=secrets, pure=False)
    return _merged(fleet, heads, dict(zip(order, _gather(client, finished), strict=True)))


def _largest_first(servers: Servers) -> list[int]:
    """The servers' indexes, the largest first: no long task starts last."""
    return sorted(range(len(servers)), key=lambda i: -_bytes(servers[i][0]))


def _bytes(paths: Sequence[str]) -> int:
    """How large a server's inputs are, as this process sees them (0: it cannot see them)."""
    try:
        return sum(Path(path).stat().st_size for path in paths)
    except OSError:
        return 0


def _every_secret(heads: dict[int, Any]) -> frozenset[str] | None:
    """Every server's secret values, once the heads show one version of the tool and no run
    twice (None: two of them are one server)."""
    _same_version(head.generated_by for head in heads.values())
    runs = [head.runs for head in heads.values()]
    if not all(runs) or len(set().union(*runs)) < sum(map(len, runs)):
        return None
    return _secrets_so_far(heads)


def _secrets_so_far(heads: dict[int, Any]) -> frozenset[str]:
    """The secret values of the servers whose heads are in (FleetTasks.ahead)."""
    return frozenset().union(*(head.secrets for head in heads.values()))


def _merged(fleet: FleetTasks, heads: dict[int, Any], finished: dict[int, Any]) -> Any:
    """`fleet.merge` of each server's part, in the order given: the head's, or the one its
    finish rendered again (a server not in `finished`: its head's)."""
    parts = [heads[i].part if finished.get(i) is None else finished[i] for i in range(len(heads))]
    return fleet.merge(parts)


def audit_servers_locally(
    workers: int,
    servers: Servers,
    fleet: FleetTasks,
    *,
    started: Workers | None = None,
    **options: Any,
) -> Any:
    """`audit_servers` on `workers` local processes (`--workers N`; analyzer.cluster_local),
    the `started` ones if the command started them before its own imports. This process is
    one of them (it has the pipeline imported already, and what it audits is never pickled).
    Each head is read here while the other servers are still audited; once every server's
    secret values are known, each process finishes its own servers, and this one merges
    while the workers finish theirs (most often they change nothing, and the merge stands).
    The cycle collector is paused meanwhile, and what is left is set aside on leaving
    (collector.paused, keep): the heads read here and the merge are kept until the report is
    written and make no cycles, yet each pass walked every object of them again (a third of
    this process's CPU on a fleet of 8 servers of 2k runs); the servers audited here leave
    next to nothing in cycles (31 objects a server of 2k runs, the same peak RSS: measured
    over 6 of them)."""
    with ExitStack() as stack:
        if started is None:
            started = stack.enter_context(local_workers(min(workers, len(servers)) - 1))
        return _audited_locally(servers, fleet, started, options)


def _audited_locally(
    servers: Servers, fleet: FleetTasks, started: Workers, options: dict[str, Any]
) -> Any:
    """`audit_servers_locally` on the `started` workers."""
    with paused(keep=True), Local(fleet, started) as pool:
        with stage("auditing servers", total=len(servers), unit="servers") as step:
            heads = pool.audit(servers, _largest_first(servers), options, step, _secrets_so_far)
        secrets = _every_secret(heads)
        if secrets is None:
            return None
        finished = pool.finish(lambda _: secrets)
        merged = _merged(fleet, heads, finished)
        there = pool.finished_there()
        pool.release()
        if any(part is not None for part in there.values()):
            merged = _merged(fleet, heads, {**finished, **there})
        return merged


class Learning(NamedTuple):
    """Part `index` of `parts` of the learning of one audit's whole inputs (LEARNING_PARTS;
    nothing past them), for its `count` partitions split into `folder`: whoever learns it
    audits partitions `index`, `index + parts`, ... (`partitions`), written to the merge's
    `spill` folder."""

    index: int
    parts: int
    count: int
    folder: str
    spill: str

    def __str__(self) -> str:
        return f"part {self.index + 1}/{self.parts} of the whole inputs"

    @property
    def part(self) -> str | None:
        """Which of LEARNING_PARTS (None: all of them, a process alone; "": none)."""
        if self.parts == 1:
            return None
        return list(LEARNING_PARTS)[self.index] if self.index < len(LEARNING_PARTS) else ""

    @property
    def partitions(self) -> range:
        return range(self.index, self.count, self.parts)


def audit_partitions_locally(
    given: list[str],
    count: int,
    tasks: FleetTasks,
    spill: ReportSpill,
    started: Workers,
    folder: Path,
    options: dict[str, Any],
) -> MergedReport:
    """The `count` partitions of one audit on this process and the `started` local workers
    (analyzer.cluster_local): each process learns a part of the whole inputs at once
    (`tasks.audit`, a `Learning`: the run tables split by bucket into `folder`, or the
    rest), is sent what the others learnt, and audits the partitions its part goes with
    (`tasks.finish`), writing each to `spill`'s files there; then each works out the
    capacity foresight of its own partitions' findings, given every partition's facts
    (`tasks.then`: each process's pieces sent to the others, as the secret values of a
    fleet's servers are), so that this process does not work it out alone at the end; they
    are merged here as in one process."""
    if tasks.then is None or tasks.shared is None:
        raise ValueError("local partitions need their tasks' second step (then, shared)")
    processes = len(started.processes) + 1
    learning: Servers = [
        (given, Learning(k, processes, count, str(folder), str(spill.folder)))
        for k in range(processes)
    ]
    with ExitStack() as meanwhile:
        with paused(keep=True), Local(tasks, started) as pool:
            with stage("learning the whole inputs", total=processes, unit="parts") as step:
                learnt = pool.audit(learning, list(range(processes)), options, step)

            def others(mine: list[int]) -> WholeInputFacts:
                facts = WholeInputFacts()
                for index, part in learnt.items():
                    if index not in mine:
                        facts.update(part)
                return facts

            with stage("auditing partitions"):
                done = pool.finish(others)
                shared = {index: tasks.shared(part) for index, part in done.items()}
                shared.update(pool.finished_there())
            spilling = str(spill.folder)

            def pieces(learnt: list[int]) -> tuple[str, dict[int, Any]]:
                """The foresight's pieces of the partitions the others audited."""
                return spilling, _partitions(shared, [i for i in shared if i not in learnt])

            pool.then(pieces)
            answered = tasks.then(_partitions(done), pieces(list(done)))
            meanwhile.enter_context(emptying(folder))
            answered.update(_partitions(pool.finished_there()))
            pool.release()
        _same_version(part.head.generated_by for part in answered.values())
        every = _partitions(shared)
        for index in range(count):
            # finished where it was audited, its piece kept for its secret values
            spill.take(index, replace(answered[index], foresight=every[index]))
        return spill.merged()


def _partitions(
    done: dict[int, dict[int, Any]], parts: Iterable[int] | None = None
) -> dict[int, Any]:
    """The partitions audited with the learning `parts` (None: all of them), together."""
    return {
        index: part
        for learnt, audited in done.items()
        if parts is None or learnt in parts
        for index, part in audited.items()
    }


def run_on_cluster(
    paths: Sequence[str | Path],
    task: PartitionTask,
    learn: LearnWholeInputs,
    spill: ReportSpill,
    *,
    servers: Servers | None = None,
    fleet: FleetTasks | None = None,
    partition_tasks: FleetTasks | None = None,
    folder: Path | None = None,
    workers: int | None = None,
    address: str | None = None,
    partitions: int | None = None,
    started: Workers | None = None,
    **options: Any,
) -> Report | MergedReport | Any:
    """Audit on `workers` local processes of our own (this one among them, the `started` ones
    if the command started them before its imports) or on the Dask scheduler at `address`, in
    `partitions` tasks (PARTITIONS_PER_WORKER per worker or worker thread unless given), each
    task's result written to `spill` (the merged report reads it: use it inside `spill`'s
    `with`). Local partitions are `partition_tasks` (analyzer.api.partition_tasks), the whole
    inputs learnt in parts by the processes (the run tables split into `folder`); Dask's are
    `task`, the whole inputs' shared facts learnt by `learn` in this process. Given `servers`
    (a fleet of databases) and `fleet`, one server per task (audit_servers_locally or
    audit_servers): what `fleet.merge` returns, unless two servers prove to be one."""
    given = _sendable(paths)
    if address is None:
        count = partitions or PARTITIONS_PER_WORKER * (workers or 1)
        with ExitStack() as stack:
            if servers is not None and fleet is not None:
                merged = audit_servers_locally(
                    workers or 1, servers, fleet, started=started, **options
                )
                if merged is not None:
                    return merged
                started = None  # told they are done: others take the partitions
            if started is None:
                started = stack.enter_context(local_workers(min(workers or 1, count) - 1))
            if partition_tasks is None or folder is None:
                raise ValueError("local partitions need their partition_tasks and a folder")
            return audit_partitions_locally(
                given, count, partition_tasks, spill, started, folder, options
            )
    with connect(address) as client:
        if servers is not None and fleet is not None:
            merged = audit_servers(client, servers, fleet, **options)
            if merged is not None:
                return merged
        count = partitions or default_partitions(client)
        shared = learn(given, None)
        audit_partitions(client, given, count, task, spill, shared=shared, **options)
        return spill.merged()
