"""Audit partitions of whole services as tasks on a Dask cluster, then merge them here.

Each task opens the sources itself, from the paths or URLs it is given (a shared file system,
a database URL, an ingested dataset on object storage through fsspec), with what the client
learnt once of the whole inputs (a file's hash, which runs fall into which partition, the latest
times, the tables every partition reads whole: `WholeInputFacts`), and sends back only its
partition's Report and the few rows the capacity foresight needs of it (the instances its runs
hold, the placements refused to them): the whole frames never travel through the scheduler. The
task is given by the caller (analyzer.api.audit_partition), so this module never imports the api
back; the merge is `merge_partitions`, the same code as for partitions audited one after another
in one process.

Dask is imported only here, and only when a command asks for a cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer._version import __version__
from analyzer.errors import AuditInputError
from analyzer.pipeline.partitions import (
    MergedReport,
    PartitionResult,
    ReportSpill,
    merge_partitions,
)
from analyzer.sources.base import WholeInputFacts

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
WORKER_PRELOAD = "analyzer.api"
"""Imported by each local worker as it starts (while the client learns the whole inputs), not
when its first task arrives."""


def _distributed():
    try:
        import distributed
    except ImportError as error:
        raise AuditInputError(
            "--workers/--cluster", "Dask distributed is not installed", INSTALL_HINT
        ) from error
    return distributed


@contextmanager
def connect(*, workers: int | None = None, address: str | None = None) -> Iterator[Client]:
    """A client of a new local cluster of `workers` processes (one thread each, 127.0.0.1,
    no dashboard; the scheduler's own HTTP endpoint on a free port, not on the dashboard's
    8787 another cluster may hold), or of the scheduler at `address`; closed (and the local
    cluster stopped) on leaving."""
    distributed = _distributed()
    if address is None:
        with (
            distributed.LocalCluster(
                n_workers=workers or 1,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                preload=[WORKER_PRELOAD],
                silence_logs=logging.ERROR,
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            yield client
        return
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
            "-", "standard input cannot be sent to Dask workers", "save it to a file they can read"
        )
    return given


PartitionTask = Callable[
    [Sequence[str], int, int, dict[str, Any], WholeInputFacts | None], PartitionResult
]
"""(paths, index, count, options, shared) -> the report of partition `index` of `count` and its
share of the capacity foresight: a module-level function, so a worker imports it by name."""
LearnWholeInputs = Callable[[Sequence[str]], WholeInputFacts]
"""paths -> what every partition would read of the whole inputs, learnt once."""


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
        spill.add(index, result)


def _gather(client: Client, futures: list) -> list[PartitionResult]:
    """The tasks' results in order (_arrived)."""
    done = dict(_arrived(client, futures))
    return [done[i] for i in range(len(futures))]


def _arrived(client: Client, futures: list) -> Iterator[tuple[int, PartitionResult]]:
    """Each task's index and result as it arrives, its future released then; an error raised
    by a task (an unreadable input) is raised here unchanged, a lost worker or scheduler and
    another version of the tool say so."""
    distributed = _distributed()
    index = {future.key: i for i, future in enumerate(futures)}
    arriving = distributed.as_completed(futures, with_results=True)
    try:
        for future, result in arriving:
            _same_version(result)
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


def _same_version(result: PartitionResult) -> None:
    version = result.report.generated_by
    if version != f"dstack-audit {__version__}":
        raise AuditInputError(
            "--cluster",
            f"workers run {version}, not dstack-audit {__version__}",
            "install the same version on every worker",
        )


ServerTask = Callable[[Sequence[str], str, dict[str, Any]], PartitionResult]
"""(a server's paths, its label, options) -> its report and its share of the capacity
foresight: a module-level function, so a worker imports it by name."""
Servers = tuple[list[tuple[list[str], str]], ServerTask]
"""Each server's paths and label, and the task that audits one."""


def audit_servers(
    client: Client, servers: list[tuple[list[str], str]], task: ServerTask, **options: Any
) -> Report | None:
    """A fleet of dstack servers, one server per task of `client`'s cluster, merged as the
    partitions are (the capacity foresight over every server's fleets and instances). None
    when two of them turn out to hold the same runs (copies of one database, or a database
    with no run, which one process files with its folder's): then they are one server, and
    the caller audits in partitions instead."""
    # the largest server first, so that no long task starts last; merged in the order given
    order = sorted(range(len(servers)), key=lambda i: -_bytes(servers[i][0]))
    futures = client.map(
        task,
        [servers[i][0] for i in order],
        [servers[i][1] for i in order],
        options=options,
        pure=False,
    )
    done = dict(zip(order, _gather(client, futures), strict=True))
    results = [done[i] for i in range(len(servers))]
    runs = [{v.run_id for v in r.report.runs} for r in results]
    if not all(runs) or len(set().union(*runs)) < sum(map(len, runs)):
        return None
    return merge_partitions(results)


def _bytes(paths: Sequence[str]) -> int:
    """How large a server's inputs are, as this process sees them (0: it cannot see them)."""
    try:
        return sum(Path(path).stat().st_size for path in paths)
    except OSError:
        return 0


def run_on_cluster(
    paths: Sequence[str | Path],
    task: PartitionTask,
    learn: LearnWholeInputs,
    spill: ReportSpill,
    *,
    servers: Servers | None = None,
    workers: int | None = None,
    address: str | None = None,
    partitions: int | None = None,
    **options: Any,
) -> Report | MergedReport:
    """Audit on a new local cluster of `workers` processes or on the scheduler at `address`,
    in `partitions` tasks (PARTITIONS_PER_WORKER per worker thread unless given), the whole
    inputs' shared facts learnt by `learn` in this process while the cluster starts, each
    task's result written to `spill` as it arrives (the merged report reads it: use it inside
    `spill`'s `with`); or, given `servers` (a fleet of databases), one server per task
    (audit_servers)."""
    given = _sendable(paths)
    if servers is not None:
        with connect(workers=workers, address=address) as client:
            report = audit_servers(client, *servers, **options)
            if report is not None:
                return report
            count = partitions or default_partitions(client)
            shared = learn(given)
            audit_partitions(client, given, count, task, spill, shared=shared, **options)
            return spill.merged()
    with ThreadPoolExecutor(1) as pool:
        learning = pool.submit(learn, given)
        with connect(workers=workers, address=address) as client:
            count = partitions or default_partitions(client)
            shared = learning.result()
            audit_partitions(client, given, count, task, spill, shared=shared, **options)
            return spill.merged()
