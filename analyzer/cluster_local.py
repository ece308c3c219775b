"""A fleet of dstack servers audited one server per task, or one server's partitions one per
task, on local processes of our own (`--workers N`: analyzer.cluster.audit_servers_locally and
audit_partitions_locally), with none of a Dask cluster's start: no scheduler, no nanny, no Dask
imported anywhere.

This module imports the standard library and the base layer's light modules only, so that the
command can start its workers before it imports the pipeline itself (`started`): their
interpreters start and import while the command's does, and the workers are ready to audit when
the command is (on 8 servers of 2k runs, a worker started after the command's imports began
auditing 0.3-0.4 s of CPU after the command's own process did, 0.5-1.5 s on a loaded machine).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from analyzer import cores
from analyzer.collector import paused
from analyzer.errors import AuditInputError
from analyzer.interrupts import handlers_kept_after_polars
from analyzer.magic import SQLITE_MAGIC
from analyzer.progress import quiet_stages

SIGNAL_SECONDS = 0.2  # how soon a local --workers audit sees Ctrl-C while it waits

THEN = "then"  # a message to a worker: the second step of the tasks it finished
AUDITED = "audited"  # a worker's word that a task is done, before its head (pickled meanwhile)
Servers = list[tuple[list[str], Any]]
"""Each task's paths and what names it: a server's label (analyzer.api.one_server_each), or a
partition (analyzer.cluster.Part)."""


def may_be_a_fleet(sources: Sequence[str]) -> bool:
    """Whether the sources may be audited one server per task (analyzer.api.one_server_each
    decides): two or more distinct SQLite database files. Read from their first bytes only,
    before anything heavy is imported; a source this cannot open is left to the audit to
    name."""
    if len(sources) < 2 or len(set(sources)) < len(sources):
        return False
    for source in sources:
        try:
            with Path(source).open("rb") as file:
                if file.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                    return False
        except OSError:
            return False
    return True


class Workers:
    """`count` local worker processes, started at once, each importing the modules `preload`
    names as it starts (what its tasks will need) and then waiting to be given a fleet's tasks
    (`Local`). A fresh interpreter each: a fork would copy the threads polars runs from its
    import on, and a lock one of them held."""

    def __init__(self, count: int, preload: Sequence[str] = ()) -> None:
        context = multiprocessing.get_context("spawn")
        self.connections: list[Connection] = []
        self.processes: list[Any] = []
        own = _cores_each(count + 1)
        self.core = own[0] if own else None  # this process's, while a fleet's audit runs
        try:
            with _deaf_to_ctrl_c():
                for number in range(count):
                    ours, theirs = context.Pipe()
                    core = own[number + 1] if own else None
                    process = context.Process(
                        target=_serve, args=(theirs, tuple(preload), core), daemon=True
                    )
                    process.start()
                    theirs.close()
                    self.connections.append(ours)
                    self.processes.append(process)
        except BaseException:  # Ctrl-C typed meanwhile: none of them left behind
            self.terminate()
            self.join()
            raise

    def terminate(self) -> None:
        """Stop the processes still running (their ends of the pipes close)."""
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()

    def join(self) -> None:
        """Our ends of the pipes closed, and every process waited for."""
        for connection in self.connections:
            connection.close()
        for process in self.processes:
            process.join()


@contextmanager
def started(count: int, preload: Sequence[str] = ()) -> Iterator[Workers]:
    """`count` workers (`Workers`), none left behind on leaving, also on an error or Ctrl-C:
    any still running is stopped (one a fleet's audit told it was done is only freeing what
    it kept by then, `Local`; one no audit took was never given anything). Polars' thread
    pool is sized for the workers and this process meanwhile (`_polars_threads`), this
    process's own too when it imports polars after them, as the command does."""
    with _polars_threads(count + 1):
        workers = Workers(count, preload)
        try:
            yield workers
        finally:
            workers.terminate()
            workers.join()


class Local:
    """This process and the `workers`, each given one server at a time: a thread of this
    process hands the servers to the workers and reads their heads while this process audits
    servers of its own. Each keeps the servers it audited until they are finished there."""

    def __init__(self, fleet: Any, workers: Workers) -> None:
        self._fleet = fleet  # analyzer.cluster.FleetTasks
        self._workers = workers
        self._connections = workers.connections
        self._held: dict[int, Connection] = {}  # which worker audited each of its servers
        self._kept: dict[int, Any] = {}  # the servers this process audited
        self._stop = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self._core = ExitStack()  # this process kept to its core while the audit runs
        for connection in self._connections:
            _send(connection, fleet)  # its tasks, by name

    def __enter__(self) -> Local:
        if self._workers.core is not None:
            self._core.enter_context(cores.kept_to({self._workers.core}))
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        """The workers told they are done, not waited for: whoever started them does
        (`started`), once the report is written, so that their exit (each frees the servers
        it kept) never holds this process back. On an error they are stopped and waited for
        here: none still writes into the audit's private folders as they are removed."""
        self._stop.set()
        self._core.close()
        if kind is None:
            self.release()
        else:
            self._workers.terminate()  # its end of the pipe closes: the dispatcher stops
        if self._dispatcher is not None:
            self._dispatcher.join()
        if kind is not None:
            self._workers.join()

    def release(self) -> None:
        """Tell every worker it is done: they exit while this process merges."""
        for connection in self._connections:
            if not connection.closed:
                with suppress(OSError):  # one that died has nothing left to say
                    connection.send(None)
                connection.close()

    def audit(
        self,
        servers: Servers,
        order: list[int],
        options: dict[str, Any],
        step: Callable,
        known: Callable[[dict[int, Any]], Any] | None = None,
    ) -> dict[int, Any]:
        """Each server's head, the servers taken in `order` by whichever process is free,
        this one included (`step`: a server done). Once none is left for this process, its
        own servers are looked at `ahead` (FleetTasks) with what the heads in by then tell
        (`known`), one at a time while a worker still audits: the wait is otherwise idle."""
        pending = deque(order)
        arrived: SimpleQueue[tuple[int | None, Any]] = SimpleQueue()
        heads: dict[int, Any] = {}
        self._dispatcher = threading.Thread(
            target=self._dispatch, args=(servers, pending, options, arrived), daemon=True
        )
        self._dispatcher.start()
        try:
            while True:
                self._take(arrived, heads, servers, step)
                try:
                    index = pending.popleft()
                except IndexError:
                    break
                with quiet_stages():  # its own stages are not shown: one step a server
                    self._kept[index] = self._fleet.audit(*servers[index], options)
                heads[index] = self._kept[index].head
                step(note=f"audited {servers[index][1]}")
            self._ahead(known, heads)
            while self._dispatcher.is_alive():  # woken often: Ctrl-C is raised here
                self._dispatcher.join(SIGNAL_SECONDS)
            self._take(arrived, heads, servers, step)
        except BaseException:
            self._stop.set()  # no more servers to the workers
            raise
        return heads

    def _ahead(self, known: Callable[[dict[int, Any]], Any] | None, heads: dict[int, Any]) -> None:
        """This process's servers looked at ahead (FleetTasks.ahead) while the workers' last
        servers are audited; none once they are done (`finish` then looks once, not twice)."""
        ahead = self._fleet.ahead
        if ahead is None or known is None or not self._dispatcher.is_alive():
            return
        context = known(heads)
        with quiet_stages():
            for audited in self._kept.values():
                if not self._dispatcher.is_alive():
                    return
                ahead(audited, context)

    def _dispatch(
        self,
        servers: Servers,
        pending: deque[int],
        options: dict[str, Any],
        arrived: SimpleQueue[tuple[int | None, Any]],
    ) -> None:
        """The dispatcher thread: each worker sent the next server as soon as it says it is
        done with one (AUDITED), before its head is pickled there and read here (it starts on
        the next while its head is pickled, comes through the pipe and is unpickled here),
        each head put in `arrived` as it comes (an error as `(None, error)`, and no more
        sent)."""
        busy: dict[Connection, int] = {}
        try:
            for connection in self._connections:
                self._give(connection, servers, pending, options, busy)
            while busy:
                for connection in _ready(list(busy)):
                    index = busy.pop(connection)
                    _received(connection)  # AUDITED, or the error its task raised
                    try:
                        self._give(connection, servers, pending, options, busy)
                    except AuditInputError:  # it died after its audit: no head
                        _received(connection)
                        raise
                    arrived.put((index, _received(connection)))
        except BaseException as error:
            self._stop.set()
            arrived.put((None, error))

    def _give(
        self,
        connection: Connection,
        servers: Servers,
        pending: deque[int],
        options: dict[str, Any],
        busy: dict[Connection, int],
    ) -> None:
        """The next server sent to the worker at `connection`, unless none is left (this
        process took the last one) or an error stopped the audit."""
        if self._stop.is_set():
            return
        try:
            index = pending.popleft()
        except IndexError:
            return
        paths, label = servers[index]
        _send(connection, (index, (paths, label, options)))
        busy[connection], self._held[index] = index, connection

    @staticmethod
    def _take(
        arrived: SimpleQueue[tuple[int | None, Any]],
        heads: dict[int, Any],
        servers: Servers,
        step: Callable,
    ) -> None:
        """The workers' heads that arrived, into `heads`; the error one raised, raised."""
        while not arrived.empty():
            index, answer = arrived.get()
            if index is None:
                raise answer
            heads[index] = answer
            step(note=f"audited {servers[index][1]}")

    def finish(self, context: Callable[[list[int]], Any]) -> dict[int, Any]:
        """Each task this process audited finished here, given `context(its tasks)` (a fleet:
        every server's secret values), after each worker is sent the context of its own tasks
        (one message each) to finish them meanwhile (`finished_there`)."""
        for connection in self._connections:
            mine = [index for index, held in self._held.items() if held is connection]
            _send(connection, (mine, context(mine)))
        kept, self._kept = self._kept, {}
        here = context(list(kept))
        with quiet_stages():  # its own stages are not shown: the caller's stage is
            return {index: self._fleet.finish(audited, here) for index, audited in kept.items()}

    def then(self, context: Callable[[list[int]], Any]) -> None:
        """Each worker sent the context of its tasks' second step (FleetTasks.then: one
        audit's partitions, their capacity foresight given every partition's facts), once
        their finish was read (`finished_there`: a message is never sent to a worker still
        sending its answer, which would wait for the other); their answers are read by
        `finished_there` again."""
        for connection in self._connections:
            mine = [index for index, held in self._held.items() if held is connection]
            _send(connection, (THEN, mine, context(mine)))

    def finished_there(self) -> dict[int, Any]:
        """The workers' servers as they finished them (`finish`, or `then`): one reply each."""
        finished: dict[int, Any] = {}
        for connection in self._connections:
            finished.update(_received(connection))
        return finished


@contextmanager
def _deaf_to_ctrl_c() -> Iterator[None]:
    """SIGINT ignored while the workers are started (a few milliseconds): an ignored signal
    stays ignored across exec and Python keeps it so, so a Ctrl-C to the whole foreground
    group while a worker is still importing cannot print its traceback (the client stops the
    workers itself). A blocked signal alone would not do (the spawn clears the mask), but it
    is blocked here too: Linux keeps a blocked signal pending even while it is ignored, so a
    Ctrl-C typed meanwhile reaches this process once its handler is back, instead of being
    lost (a thread of polars' that does not block it may still take it and lose it: when the
    command starts the workers, before its imports, there is none)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # multiprocessing's resource tracker, started with a process's first spawn, unblocks
    # SIGINT after its own start whatever the mask was: started before, so it cannot
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextmanager
def _polars_threads(processes: int) -> Iterator[None]:
    """Polars' thread pool sized, in every process that starts it inside (polars reads
    POLARS_MAX_THREADS once, when it does), so that the `processes` share the cores instead
    of each running as many threads as there are cores: threads that wait for each other's
    core cost CPU time (8 servers of 2k runs on --workers 2, 2 cores: the command's own
    process 0.3-0.4 s of CPU less on one thread than on two, its workers' unchanged). A
    POLARS_MAX_THREADS the user set is kept. The cores are those this process may run on, as
    polars counts them (a container's cpuset may give it fewer than the machine has)."""
    if "POLARS_MAX_THREADS" in os.environ or processes < 2:
        yield
        return
    usable = len(cores.usable()) or os.cpu_count() or 1
    os.environ["POLARS_MAX_THREADS"] = str(max(1, usable // processes))
    try:
        yield
    finally:
        del os.environ["POLARS_MAX_THREADS"]


def _ready(connections: list[Connection]) -> list[Connection]:
    """The connections with an answer to read, waited for a little at a time: a signal
    (Ctrl-C, SIGTERM) may land on one of polars' threads, which does not wake a wait of the
    main thread, and only the main thread raises it."""
    while not (ready := wait(connections, timeout=SIGNAL_SECONDS)):
        pass
    return ready  # type: ignore[return-value]


def _send(connection: Connection, message: Any) -> None:
    """A message to a worker process, which may have died (its end of the pipe closed)."""
    try:
        connection.send(message)
    except OSError:
        raise _died("before it was sent its work") from None


def _received(connection: Connection) -> Any:
    """A worker process's answer; the error its task raised, raised here."""
    _ready([connection])
    try:
        done, answer = connection.recv()
    except (EOFError, OSError):
        raise _died("while auditing a server") from None
    if not done:
        raise answer
    return answer


def _died(when: str) -> AuditInputError:
    return AuditInputError(
        "--workers",
        f"a worker process died {when}",
        "fewer --workers bound the memory: each audits a whole server",
    )


def _cores_each(processes: int) -> list[int] | None:
    """A core for each of the `processes` (this one first) when they are as many as the cores
    this one may run on and each runs polars on one thread (`_polars_threads`): each process's
    own thread and its pool's then hand over on one core (analyzer.cores). --workers 2 on two
    cores, in turn: 8 servers of 2k runs 3.78-3.92 s against 3.88-4.14 s of wall time, one
    server of 16k runs 4.83-4.99 s against 5.01-5.24 s. None otherwise (more processes than
    cores share them as the system schedules them)."""
    usable = cores.usable()
    if len(usable) != processes or os.environ.get("POLARS_MAX_THREADS") != "1":
        return None
    return usable


def _serve(connection: Connection, preload: tuple[str, ...], core: int | None) -> None:
    """A local worker process: the modules `preload` names imported, then each task it is
    sent audited and kept, and finished when sent their context (a fleet: every server's
    secret values); its cycle collector paused as the client's is (collector.paused: each
    pass would walk the servers it keeps again; 0.1-0.4 s of a worker's 5-6 s CPU on a fleet
    of 8 servers of 2k runs, against the command's thresholds); kept to its `core` when given
    one (`_cores_each`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the client stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    handlers_kept_after_polars([signal.SIGINT])  # ignored still once polars is imported
    with paused():
        for name in preload:
            importlib.import_module(name)
        if core is not None:
            cores.keep_to({core})
        _served(connection)


def _served(connection: Connection) -> None:
    """`_serve`'s loop: the fleet's tasks, then one message after another until told it is
    done. A task finished is kept for its second step when the fleet's tasks have one
    (FleetTasks.then), and only its `shared` part sent then."""
    fleet = connection.recv()
    kept: dict[int, Any] = {}
    while fleet is not None and (message := connection.recv()) is not None:
        try:
            if isinstance(message[0], int):
                index, arguments = message
                kept[index] = fleet.audit(*arguments)
                connection.send((True, AUDITED))  # the next task is sent meanwhile
                answer = kept[index].head
            elif message[0] == THEN:
                _, indexes, context = message
                answer = {i: fleet.then(kept.pop(i), context) for i in indexes}
            else:
                indexes, context = message
                answer = {i: fleet.finish(kept.pop(i), context) for i in indexes}
                if fleet.then is not None:
                    kept.update(answer)
                    answer = {i: fleet.shared(part) for i, part in answer.items()}
        except Exception as error:  # sent back whole: the client raises it
            _send_error(connection, error)
            continue
        connection.send((True, answer))


def _send_error(connection: Connection, error: Exception) -> None:
    """The error a task raised, to the client; one that cannot be pickled, as its text."""
    try:
        connection.send((False, error))
    except (pickle.PicklingError, TypeError, AttributeError):
        connection.send((False, RuntimeError(f"{type(error).__name__}: {error}")))
