"""The library entry points the CLI and notebooks share: open sources, get frames and a report."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from functools import cache, cached_property, lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

import analyzer.contract_frames as frames
from analyzer.collector import paused
from analyzer.contract import Finding, InputRecord, LimitationRecord, Report, RunVerdict
from analyzer.cores import on_one_core
from analyzer.errors import AuditInputError
from analyzer.outputs import private_folder
from analyzer.pipeline.assemble import (
    NO_RUN_EVIDENCE_RECORD,
    assemble,
    end_bounds,
    merge_reports,
    refuse_unsplit,
)
from analyzer.pipeline.detect import dateless_runs, detect
from analyzer.pipeline.evidence import Evidence, combine
from analyzer.pipeline.exposure import frames_of
from analyzer.pipeline.foresight import foresight
from analyzer.pipeline.impact import assess, serving_capacity
from analyzer.pipeline.reconcile import TimeOptions, reconcile
from analyzer.pipeline.selectors import one_run, run_filter
from analyzer.pipeline.servers import assign_servers, distinct_labels
from analyzer.pipeline.timeline import deployments, evidence_gaps, submissions
from analyzer.progress import listening, stage
from analyzer.redact import Redactor, chunked, shapes_only, without_controls
from analyzer.sources import (
    count_files,
    is_claimed,
    learn_whole_inputs,
    load_path,
    shown,
    sniff,
)
from analyzer.sources.adbc import release_freed
from analyzer.sources.base import LoadContext, ReadOptions, WholeInputFacts
from analyzer.sources.buckets import emptying
from analyzer.times import parse_time

if TYPE_CHECKING:
    from analyzer.cluster import FleetTasks, Learning
    from analyzer.cluster_local import Workers
    from analyzer.pipeline.partitions import (
        ForesightPiece,
        MergedReport,
        PartitionResult,
        SpilledPartition,
    )
    from analyzer.pipeline.story import RunStory

DEFAULT_SERVER = "default"

BUCKET_FOLDER = "dstack-audit-buckets-"  # the prefix of the run tables' private folder


@dataclass
class Audit:
    """An opened set of sources: canonical frames, timelines, verdicts and the report."""

    evidence: Evidence
    project: str | None = None
    run: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    # a partition of a larger audit: the capacity foresight is left to the merge, which has
    # the instances every partition's runs hold (`foresight_piece`)
    _defer_foresight: bool = False

    @cached_property
    def runs(self) -> pl.DataFrame:
        """One row per run (the filters applied): RUNS_SCHEMA of analyzer.model."""
        runs = self.evidence.runs
        if self.project:
            runs = runs.filter(pl.col("project") == self.project)
        if self.run:
            runs = runs.filter(run_filter(self.run))
        if self.since:
            ended = pl.col("last_processed_at")
            runs = runs.filter(ended.is_null() | (ended >= self.since))
        if self.until:
            began = pl.col("submitted_at")
            runs = runs.filter(began.is_null() | (began <= self.until))
        return runs

    def _of_runs(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame`'s rows of the selected runs: a semi join on (server, run_id) as a lookup
        (the join cost more than the rest of selecting a large audit's events)."""
        keys = self.runs.select(pl.struct("server", "run_id")).to_series().implode()
        selected = pl.col("run_id").is_not_null() & pl.struct("server", "run_id").is_in(keys)
        return frame.filter(selected)

    @cached_property
    def submissions(self) -> pl.DataFrame:
        """One row per job submission with its derived times and health (timeline stage)."""
        subs = submissions(self.evidence)
        return self._of_runs(subs)

    @cached_property
    def deployments(self) -> pl.DataFrame:
        """One row per (run, deployment): when it began, what changed, who applied it."""
        deps = deployments(self.evidence, self.submissions)
        listed = (
            pl.col("changed_fields")
            .str.split(",")
            .list.eval(pl.element().str.strip_chars())
            .list.eval(pl.element().filter(pl.element() != ""))
        )
        return self._of_runs(deps).with_columns(listed.alias("changed_fields"))

    @cached_property
    def events(self) -> pl.DataFrame:
        """Every state change of the selected runs and their jobs, each with its provenance."""
        return self._of_runs(self.evidence.events)

    @cached_property
    def end_of_evidence(self) -> datetime | None:
        """The latest moment any input speaks of (a lower bound of when it was captured):
        Evidence.end_of_evidence, of the ends worked out once."""
        return max(self._ends.values(), default=None)

    @cached_property
    def capacity(self) -> pl.DataFrame:
        """Healthy replicas per run over time (a step function)."""
        return serving_capacity(
            self.submissions,
            self.events,
            self.end_of_evidence,
            self._ends,
        )

    def story(self, run: str) -> RunStory:
        """The story of one run (a selector as the CLI takes) that every renderer draws."""
        from analyzer.pipeline.story import tell

        row = one_run(self.runs, run)
        key = (pl.col("server") == row["server"]) & (pl.col("run_id") == row["run_id"])
        return tell(
            row,
            submissions=self.submissions.filter(key),
            events=self.events.filter(key),
            deployments=self.deployments.filter(key),
            capacity=self.capacity.filter(key),
            findings=self.report.findings,
            verdicts=self.report.runs,
            end_of_evidence=self.end_of_evidence,
            ends_by_server=self.evidence.ends_by_server,
        )

    @cached_property
    def _ends(self) -> dict[str, datetime]:
        """Evidence.ends_by_server, worked out once: the judgement, the impact and the report's
        bounds all read it."""
        return self.evidence.ends_by_server()

    @cached_property
    def _detected(self) -> tuple[list[RunVerdict], list[Finding]]:
        # the verdicts and findings are kept to the end (the report): a pass of the cycle
        # collector over them frees nothing (collector.paused)
        with stage("auditing runs"), paused():
            return self._detect()

    def _detect(self) -> tuple[list[RunVerdict], list[Finding]]:
        gaps = evidence_gaps(
            self.runs, self.evidence.jobs, self.events, self.evidence.events_table_servers
        )
        verdicts, findings = detect(
            self.runs,
            self.submissions,
            self.events,
            self.evidence.disputed_runs,
            self._ends,
            gaps,
        )
        findings = assess(
            findings,
            self.submissions,
            self.evidence.runs,
            self.events,
            self._ends,
        )
        if not self._defer_foresight:
            findings = foresight(frames_of(self), findings, self.deployments, self._dateless)
        return verdicts, findings

    @property
    def _dateless(self) -> set[tuple[str, str]]:
        """The runs whose update no date places among the tables' times (a rich log alone)."""
        return dateless_runs(self.events)

    def _foresight_piece(self, *, whole_tables: bool) -> ForesightPiece:
        """What the merge of this partition with the others needs for the capacity foresight
        (analyzer.pipeline.partitions.ForesightPiece)."""
        from analyzer.pipeline.partitions import foresight_piece

        _, findings = self._detected
        return foresight_piece(
            frames_of(self),
            findings,
            self.deployments,
            self._dateless,
            whole_tables=whole_tables,
            narrowed=bool(self.since or self.project),
            secrets=set(self.evidence.redactor.values),
        )

    @property
    def verdicts(self) -> list[RunVerdict]:
        """Every run's verdict (as in the report: secrets redacted)."""
        return self.report.runs

    @property
    def findings(self) -> list[Finding]:
        """The findings, worst first (as in the report: secrets redacted)."""
        return self.report.findings

    @cached_property
    def healthy_intervals(self) -> pl.DataFrame:
        """One row per submission that served: from when it was healthy until it stopped."""
        return self.submissions.filter(pl.col("health") == "healthy").select(
            "server",
            "run_id",
            "job_id",
            "job_name",
            "replica_num",
            "deployment_num",
            pl.col("healthy_since").alias("start"),
            pl.col("stopped_at").alias("end"),
            "health_proof",
        )

    def tables(self) -> dict[str, pl.LazyFrame]:
        """Every table of the audit as a lazy polars frame, by the name SQL queries use.

        >>> audit = open_sources(["samples/v0.22.5/seed/server.db"])  # doctest: +SKIP
        >>> audit.tables()["victims"].select("job_name").collect()  # doctest: +SKIP
        """
        report = self.report
        return {
            "runs": self.runs.lazy(),
            "submissions": self.submissions.lazy(),
            "transitions": self.events.lazy(),
            "deployments": self.deployments.lazy(),
            "healthy_intervals": self.healthy_intervals.lazy(),
            "capacity": self.capacity.lazy(),
            "verdicts": frames.verdicts(report).lazy(),
            "findings": frames.findings(report).lazy(),
            "victims": frames.victims(report).lazy(),
            "culprits": frames.culprits(report).lazy(),
            "evidence": frames.evidence(report).lazy(),
            "inputs": frames.inputs(report).lazy(),
            "limitations": frames.limitations(report).lazy(),
        }

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over `tables()`.

        >>> open_sources(["samples/v0.22.5/seed"]).sql(  # doctest: +SKIP
        ...     "SELECT job_name, lost_seconds FROM victims ORDER BY lost_seconds DESC")
        """
        with pl.SQLContext(self.tables()) as context:
            return context.execute(query, eager=True)

    @cached_property
    def report(self) -> Report:
        """The pydantic report (what `--format json` prints), with every secret redacted."""
        # every text the report is built from was masked at the source (evidence._redact):
        # the guard walks it only if a known value or a hidden character is in it after all
        return self.evidence.redactor.guard_model(self._assembled)

    @cached_property
    def _assembled(self) -> Report:
        """The report before its guard."""
        return self._assemble()

    def _assemble(self, *, figures: bool = True) -> Report:
        """The report before its guard; without the summary's `figures` when it is a part of
        a merge (a fleet's server: guarded once, with every server's secret values, and
        summed up with the others: finish_server, merge_reports)."""
        verdicts, findings = self._detected
        with paused():
            limitations = [
                LimitationRecord(code=lim.code, message=lim.message, source=lim.source)
                for lim in self.evidence.limitations
            ]
            limitations += end_bounds(self._ends, findings)
            if not self.evidence.runs.height and not self.evidence.events.height:
                limitations.append(NO_RUN_EVIDENCE_RECORD)
            return assemble(
                inputs=[_input_record(i) for i in self.evidence.inputs],
                limitations=limitations,
                verdicts=verdicts,
                findings=findings,
                end_of_evidence=self.end_of_evidence,
                figures=figures,
            )

    def redact(self, text: str, *, keep_styles: bool = False) -> str:
        """Mask every secret the inputs hold (and every secret-shaped string) in `text`, and
        remove its control characters: the last pass over every rendered output
        (`keep_styles`: but a terminal table's own colour sequences)."""
        clean = without_controls(text, keep_styles=keep_styles)  # cleaned first, then masked
        return self.evidence.redactor.apply(clean)


@dataclass
class RenderedReport:
    """The report, its text in the chunks the final pass takes (redact.chunked), and that
    pass (`redact`) for them."""

    report: Report
    texts: list[str]
    redact: Callable[[str], str]


def rendered_report(audit: Audit, render: Callable[[Report], Iterable[str]]) -> RenderedReport:
    """`audit.report` and `render`'s text of it: the guard's one look is at that text, not at
    a JSON dump of its own, so a report written as JSON is serialised once (`render` gives
    the report's JSON as pydantic writes it, at any indent: the strings the guard looks into
    are the same). The look also asks for each known value as given: when the text holds
    none and no hidden character, the final pass over it has only secret shapes to mask
    (redact.shapes_only). Rendered again only when the guard changed the report."""
    if "report" in audit.__dict__:  # guarded already (Audit.report)
        return RenderedReport(audit.report, list(chunked(render(audit.report))), audit.redact)
    assembled = audit._assembled
    texts = list(chunked(render(assembled)))
    redactor = audit.evidence.redactor
    final: Callable[[str], str] = audit.redact
    if not redactor.holds_known_or_hidden(texts, raw_forms=True):
        report, final = assembled, shapes_only  # what guard_model and `redact` would find
    else:
        report = redactor.guard_model(assembled, texts)
        if report is not assembled:
            texts = list(chunked(render(report)))
    audit.__dict__["report"] = report  # Audit.report's cache: the same report
    return RenderedReport(report, texts, final)


def _input_record(info) -> InputRecord:
    return InputRecord(
        path=info.path,
        kind=info.kind,
        sha256=info.sha256,
        size=info.size,
        mtime=datetime.fromtimestamp(info.mtime, UTC) if info.mtime is not None else None,
        records=info.records,
        unparsed=info.unparsed,
        server_version=info.server_version,
        notes=info.notes,
    )


Paths = str | Path | Iterable[str | Path]
When = str | date | datetime


def as_paths(paths: Paths) -> list[str | Path]:
    """One path (text or Path) or several: a string is one path, never its characters."""
    if isinstance(paths, str | Path):
        return [paths]
    return list(paths)


def open_sources(
    paths: Paths,
    *,
    project: str | None = None,
    run: str | None = None,
    server: str = DEFAULT_SERVER,
    log_tz: str | None = None,
    log_date: date | str | None = None,
    since: When | None = None,
    until: When | None = None,
    partition: tuple[int, int] | None = None,
    server_labels: dict[str, str] | None = None,
    shared: WholeInputFacts | None = None,
) -> Audit:
    """Read every input (read-only) and combine them into one audit.

    `paths` is one path or a list; `since`/`until` a datetime, a date or ISO 8601 text
    (`2026-11-02`, `2026-11-02T09:00:00Z`, `...+02:00`); `run` a name, `project/name` or an
    id prefix.

    Each database is its own server; a log or an API export joins the database whose ids it
    shares (analyzer.pipeline.servers). `server_labels` maps a source (as given) to its
    server's name, overriding that; a single server is called `server`. `shared` holds facts
    about whole inputs (a file's hash, its latest times) that the other partitions of the same
    audit computed already (audit_in_partitions); leave it None.

    >>> audit = open_sources(["samples/v0.22.5/seed"])  # doctest: +SKIP
    >>> audit.report.findings[0].victims[0].job_name  # doctest: +SKIP
    'web-0-0'
    """
    given = as_paths(paths)
    since, until = parse_time(since, "since"), parse_time(until, "until")
    if isinstance(log_date, str):
        log_date = _log_date(log_date)
    if not given:
        raise AuditInputError(
            "audit", "no input given", "name a server.db, an export folder or a log"
        )
    options = ReadOptions(partition=partition, since=since, project=project, shared=shared)
    labels = server_labels or {}
    loaded = []
    unit = "inputs" if any(is_claimed(path) for path in given) else "files"
    total = sum(count_files(path) for path in given) if listening() else None
    with stage("reading", total=total, unit=unit) as step:
        for path in given:
            started = time.perf_counter()
            data = load_path(path, LoadContext(labels.get(str(path), server), options))
            for part in data if not is_claimed(path) else ():
                part.given = str(path)
            loaded.append((data, labels.get(str(path))))
            read = [i for part in data for i in part.inputs]
            step(
                count=0,
                note=f"read {shown(path)} in {time.perf_counter() - started:.2f}s: "
                + ", ".join(f"{i.path} ({i.kind}, {i.records} records)" for i in read[:20])
                + (f" and {len(read) - 20} more" if len(read) > 20 else ""),
            )
    if partition is not None:
        refuse_unsplit(part for parts, _label in loaded for part in parts)
    with stage("combining and aligning clocks"):
        parts = assign_servers(loaded, server, partitioned=partition is not None)
        evidence = reconcile(combine(parts), TimeOptions(log_tz=log_tz, log_date=log_date))
    evidence.narrowed = bool(partition or since or project)
    return Audit(evidence, project=project, run=run, since=since, until=until)


def _log_date(text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise AuditInputError("log_date", f"{text!r} is not a date", "e.g. 2026-11-02") from None


def audit(paths: Paths, **options) -> Report:
    """Audit the given sources and return the report (what `dstack-audit audit` prints)."""
    return open_sources(paths, **options).report


def audit_partition(
    paths: Sequence[str | Path],
    index: int,
    count: int,
    options: dict,
    shared: WholeInputFacts | None = None,
) -> PartitionResult:
    """One partition's report and its share of the capacity foresight: the task a Dask worker
    runs (analyzer.cluster); `shared` holds what was learnt of the whole inputs (hashes, the
    runs' partitions, latest times, the tables every partition reads whole) once for all."""
    from analyzer.pipeline.partitions import PartitionResult

    opened = open_sources(paths, partition=(index, count), shared=shared, **options)
    opened._defer_foresight = True
    # its summary's counts alone: the merge works the figures out once, over every
    # partition's findings (merge_reports; 100k runs in 64 partitions: 1 s of CPU). Its texts
    # were masked at the source with its secret values; what a text built from several of
    # them could hold again, the merge's guard finds, with every partition's values (its
    # own among them: `ForesightPiece.secrets`), in the files where the report is written
    # (partitions._guard) and in the merged head: a guard of its own here would dump the
    # whole report to JSON once more to look (100k runs: 2.2 s of CPU)
    report = opened._assemble(figures=False)
    return PartitionResult(report, opened._foresight_piece(whole_tables=index == 0))


@dataclass
class LearntPart:
    """One process's part of the learning of the whole inputs of an audit in partitions on
    local workers (analyzer.cluster.audit_partitions_locally), kept where it was learnt to
    audit the partitions that part goes with; its facts are all the client is sent."""

    paths: list[str]
    learning: Learning
    options: dict
    facts: WholeInputFacts

    @cached_property
    def head(self) -> WholeInputFacts:
        """What the other processes are sent: its facts but the fleets and instances tables
        as read, once what the mapping makes of them is learnt (RAW_FLEET_TABLES), those it
        made sent through files in the audit's private folder (WholeInputFacts.through_files:
        the other processes see it; a process alone sends nothing: none written)."""
        facts = self.facts.without(RAW_FLEET_TABLES, "fleets and instances")
        if self.learning.parts == 1:
            return facts
        return facts.through_files(Path(self.learning.folder), f"sent-{self.learning.index}")


RAW_FLEET_TABLES = ("table fleets:", "table instances:")
"""The fleets and instances tables as a database's reader remembers them read whole
(SqliteReader.read_slim), which a partition never reads again once what the mapping makes of
them is learnt ("fleets and instances": dstack_tables.learn_fleet_tables); 33 MB of the 56 MB
of facts one process sends the other at 16k runs."""


def learn_part(paths: Sequence[str], learning: Learning, options: dict) -> LearntPart:
    """Part `learning` of what every partition reads of the whole inputs, the first task a
    local worker runs for an audit in partitions: the other part is learnt meanwhile by
    another process."""
    facts = WholeInputFacts(split=(learning.count, Path(learning.folder)), part=learning.part)
    for path in paths:
        learn_whole_inputs(path, facts)
    return LearntPart(list(paths), learning, options, facts)


def audit_learnt_part(learnt: LearntPart, others: WholeInputFacts) -> dict[int, SpilledPartition]:
    """The partitions `learnt` goes with, audited where it was learnt, given what the other
    processes learnt (`others`), each written to the merge's spill files there, its foresight
    piece too (spilled_piece): every process reads the others' pieces from those files, not
    from pickles sent through the pipes (16k runs on --workers 2: 0.01-0.03 s to write a
    partition's piece against 0.08 s to pickle and unpickle its 40 MB, and no wait for the
    pipe between the audit and the foresight: 0.16 s of wall time to 0.005 s)."""
    from analyzer.pipeline.partitions import spilled, spilled_piece

    learnt.facts.update(others)
    learning, options, folder = learnt.learning, learnt.options, Path(learnt.learning.spill)
    parts = {}
    for index in learning.partitions:
        result = audit_partition(learnt.paths, index, learning.count, options, learnt.facts)
        part = spilled(folder, index, result)
        parts[index] = replace(part, foresight=spilled_piece(folder, index, part.foresight))
    return parts


def foresight_of_part(
    parts: dict[int, SpilledPartition], others: tuple[str, dict[int, ForesightPiece]]
) -> dict[int, SpilledPartition]:
    """The partitions one process audited (`parts`) finished there, given the other processes'
    pieces of the capacity foresight's facts (`others`: the merge's spill folder, each of
    their partitions' piece): their foresight worked out and their files masked with every
    partition's secret values (finished_where_audited); the rest of the merge is the
    client's."""
    from analyzer.pipeline.partitions import finished_where_audited

    folder, theirs = others
    pieces = {index: part.foresight for index, part in parts.items()} | theirs
    every = [pieces[index] for index in sorted(pieces)]  # as one process reads them
    return finished_where_audited(Path(folder), parts, every)


def foresight_pieces(parts: dict[int, SpilledPartition]) -> dict[int, ForesightPiece]:
    """What the other processes are sent of the partitions one process audited before their
    second step: their foresight pieces (FleetTasks.shared)."""
    return {index: part.foresight for index, part in parts.items()}


@cache
def partition_tasks() -> FleetTasks:
    """One audit's partitions on local workers: each process learns a part of the whole
    inputs, audits the partitions that part goes with, then works out their capacity
    foresight; the client merges their results in its ReportSpill, not by `merge` (made on
    first use, as report_fleet)."""
    from analyzer.cluster import FleetTasks

    return FleetTasks(learn_part, audit_learnt_part, list, foresight_of_part, foresight_pieces)


@dataclass(frozen=True)
class ServerHead:
    """What the client is sent of each server's audit as soon as it is done: the secret values
    its inputs hold (one process masks every text with every input's), its runs (two copies
    of one database are one server), the version that audited it, and its `part` of the
    merge, final unless another server's secret values mask more in it (`finish_server`)."""

    generated_by: str
    secrets: frozenset[str]
    runs: frozenset[str]
    part: Any


@dataclass
class ServerAudit:
    """One server of a fleet audited whole where its task ran: its report (the capacity
    foresight worked out in the task, as in one process: servers share no fleet and no
    instance) built from texts masked with its own secret values, its summary's counts alone
    (the merge works out the fleet's figures), not yet guarded (that is done once, with every
    server's: `finish_server`), and those values. `dumped` is the report's JSON, written in
    the task (in parallel with the other servers') for the guard's one look, which waits for
    every server's secret values."""

    report: Report
    secrets: frozenset[str]
    dumped: str | Sequence[str]
    looked: frozenset[str] | None = None  # values the guard found none of, nor a hidden character

    @property
    def head(self) -> ServerHead:
        return ServerHead(
            self.report.generated_by,
            self.secrets,
            frozenset(v.run_id for v in self.report.runs),
            self.report,
        )


def audit_server(
    paths: Sequence[str],
    label: str,
    options: dict,
    render: Callable[[Report], Sequence[str]] | None = None,
) -> ServerAudit:
    """One server of a fleet, audited whole: the task a worker runs for each server
    (analyzer.cluster.audit_servers); its result stays on the worker until `finish_server`.
    `render`: the report's JSON as the task writes it anyway (in consecutive whole lines),
    the guard's look then (no dump of its own)."""
    opened = open_sources(paths, **{**options, "server_labels": dict.fromkeys(paths, label)})
    report = opened._assemble(figures=False)
    dumped = report.model_dump_json() if render is None else render(report)
    return ServerAudit(report, frozenset(opened.evidence.redactor.values), dumped)


def finish_server(audited: ServerAudit, secrets: frozenset[str]) -> Report | None:
    """The server's report guarded as one process guards its report (Audit.report), with the
    secret values of every server of the fleet (`secrets`: all of them), as one process
    masks every text with all the inputs' values (a token one server's job spec holds,
    repeated in another's failure message); None when the guard changes nothing in it: its
    head's part stands."""
    looked = audited.looked
    if looked is not None and looked <= secrets:
        rest = secrets - looked
        if not rest or not _fleet_guard(rest).holds_known_or_hidden(audited.dumped):
            return None
    report = _fleet_guard(secrets).guard_model(audited.report, audited.dumped)
    return None if report is audited.report else report


def look_ahead(audited: ServerAudit, secrets: frozenset[str]) -> None:
    """`finish_server`'s look at the server's JSON for the secret values known so far
    (`secrets`: those of the servers done by then), taken while its process waits for the
    others (FleetTasks.ahead): when it finds none of them and no hidden character, the
    finish looks only for the values it was not given (a text holds a value of a set when
    it holds one of either part)."""
    if not _fleet_guard(secrets).holds_known_or_hidden(audited.dumped):
        audited.looked = secrets


@lru_cache(maxsize=1)
def _fleet_guard(secrets: frozenset[str]) -> Redactor:
    """The guard of every server a process finishes: the forms of the fleet's secret values
    worked out once, not once a server (8 servers of 2k runs: 384 values, 0.016 s each time)."""
    return Redactor(values=set(secrets))


@cache
def report_fleet() -> FleetTasks:
    """A fleet's servers audited one per task and merged into the report one process gives;
    made on first use, so that an audit in one process never imports the cluster's modules
    (analyzer.cluster)."""
    from analyzer.cluster import FleetTasks

    return FleetTasks(audit_server, finish_server, merge_reports, ahead=look_ahead)


def one_server_each(paths: Sequence[str | Path]) -> list[tuple[list[str], str]] | None:
    """Each given path as a server of its own, named as one process names it, when every path
    is a SQLite database file (each database is a server: analyzer.pipeline.servers); None
    otherwise (a log or an export joins the database it agrees with, which only reading it
    tells)."""
    given = [str(path) for path in paths]
    if len(given) < 2 or len(set(given)) < len(given) or any(is_claimed(p) for p in given):
        return None
    for path in map(Path, given):
        source = sniff(path) if path.is_file() else None
        if getattr(source, "kind", None) != "sqlite":
            return None
    return [([path], label) for path, label in zip(given, distinct_labels(given), strict=True)]


def audit_in_partitions(paths: Paths, count: int, *, client=None, **options) -> Report:
    """Audit one partition of whole services at a time and merge: memory is bounded by the
    largest partition, not by the input (databases and ingested datasets push the partition
    down into their reads). With a Dask `client`, the partitions are tasks of its cluster
    (analyzer.cluster) and the workers open the sources from the same paths or URLs."""
    with partitions_merged(paths, count, client=client, **options) as merged:
        return merged.report()


@contextmanager
def partitions_merged(
    paths: Paths, count: int, *, client=None, **options
) -> Iterator[MergedReport]:
    """`audit_in_partitions`, its runs and findings left in the merge's private folder until
    the report is written (`MergedReport.texts`: what the JSON output streams), so that no
    list of every run and finding is held; the folder is removed on leaving."""
    from analyzer.pipeline.partitions import ReportSpill

    given = as_paths(paths)
    with (
        ReportSpill() as spill,
        private_folder(BUCKET_FOLDER) as folder,
        ExitStack() as meanwhile,
    ):
        # a remote cluster's workers cannot read this machine's bucket files
        shared = whole_input_facts(given, count if client is None else None, folder)
        if client is not None:
            from analyzer.cluster import audit_partitions

            audit_partitions(client, given, count, audit_partition, spill, shared=shared, **options)
        else:
            # one partition after another, each a long run of small queries: kept on one core
            # from here to the report's end (analyzer.cores; the 100k-run audit in 64
            # partitions, in turn: 8-26% less CPU, the same wall time or less)
            meanwhile.enter_context(on_one_core())
            for index in range(count):
                spill.add(index, audit_partition(given, index, count, options, shared))
        del shared  # the whole tables it holds are not needed by the merge
        # nor the C heap's pages the partitions' Python objects and reads freed: polars'
        # allocator never reuses them for the merge's facts (100k runs: 160 MB given back)
        release_freed()
        meanwhile.enter_context(emptying(folder))
        yield spill.merged()


def whole_input_facts(
    paths: Sequence[str | Path], count: int | None = None, folder: Path | None = None
) -> WholeInputFacts:
    """What every partition would read of the whole inputs (hashes, the runs' services,
    latest times, the tables read whole), learnt once for any number of partitions; given
    the `count` of partitions and a private `folder`, each database's run tables are also
    read once and written there by bucket, for each partition to read its own."""
    shared = WholeInputFacts(split=(count, folder) if count and folder else None)
    with stage("learning the whole inputs"):
        for path in paths:
            learn_whole_inputs(path, shared)
    return shared


@contextmanager
def cluster_merged(
    paths: Paths,
    *,
    workers: int | None = None,
    address: str | None = None,
    partitions: int | None = None,
    fleet: FleetTasks | None = None,
    partitioned: FleetTasks | None = None,
    started: Workers | None = None,
    **options,
) -> Iterator[Report | MergedReport | Any]:
    """Audit on `workers` local processes of our own or on the Dask scheduler at `address`,
    in `partitions` tasks (analyzer.cluster.PARTITIONS_PER_WORKER per worker unless given),
    the partitions' runs and findings left in the merge's private folder until the report is
    written (as `partitions_merged`). Several databases, each a server of its own, are
    audited one server per task instead (unless --partitions or --server-label is given): no
    task reads another's database, and nothing is learnt of the whole inputs first; `fleet`
    says what those tasks do and what their merge yields (report_fleet(): the report);
    `partitioned`, what the local partitions' tasks do (partition_tasks(): their files for the
    merge); `started`: the local workers the command started before its own imports
    (analyzer.cluster_local.started)."""
    from analyzer.cluster import run_on_cluster
    from analyzer.pipeline.partitions import ReportSpill

    given = as_paths(paths)
    servers = None if partitions or options.get("server_labels") else one_server_each(given)
    with ReportSpill() as spill, private_folder(BUCKET_FOLDER) as folder:
        yield run_on_cluster(
            given,
            audit_partition,
            partial(whole_input_facts, folder=folder),
            spill,
            servers=servers,
            fleet=fleet or report_fleet(),
            partition_tasks=partitioned or partition_tasks(),
            folder=folder,
            workers=workers,
            address=address,
            partitions=partitions,
            started=started,
            **options,
        )
