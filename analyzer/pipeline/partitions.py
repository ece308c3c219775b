"""Partitions of one audit, merged into the report one process gives.

A partition reads whole services, but an instance is held, and a placement refused, by runs of
every partition: the capacity foresight (analyzer.pipeline.foresight.foresight) of a finding
needs them all. So each partition sends, beside its report, a `ForesightPiece`, and the merge
works the foresight out once over every partition's findings and pieces.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import polars as pl
from pydantic import BaseModel, SerializeAsAny

from analyzer.contract import Finding, Report, RunVerdict
from analyzer.model import own_buffers
from analyzer.outputs import remove_folder
from analyzer.pipeline.assemble import merge_reports
from analyzer.pipeline.exposure import Frames
from analyzer.pipeline.foresight import (
    RowKeys,
    capacity_holders,
    facts_of,
    foresight,
    row_keys,
    wanted_findings,
)
from analyzer.pipeline.placement import PLACED_COLUMNS, placed_jobs
from analyzer.progress import stage
from analyzer.redact import Redactor

# What the foresight reads of the submissions of runs other than the probed ones: the
# instances they hold (`held`), the provider's refusals (`refused`) and the jobs waiting in
# dstack's queue (analyzer.pipeline.placement.queued_at), in timeline order; and of their runs.
_CROSS_RUN_COLUMNS = (
    "server",
    "run_id",
    "job_name",
    "replica_num",
    "job_num",
    "submission_num",
    "instance_id",
    "created_at",
    "stopped_at",
    "blocks",
    "termination_reason",
    "termination_reason_message",
    "replica_group",
    "status",
    "left_queue_at",
    # who held a fleet's room at a failure (foresight, placement.holders_at)
    "fleet_name",
    "fleet_id",
    "deployment_num",
    "instance_name",
    "health",
    "health_proof",
)
_CROSS_RUN_RUN_COLUMNS = ("server", "run_id", "project", "run_name", "fleet_id", "placement_spec")
_TIMELINE_ORDER = ["server", "run_id", "replica_num", "job_num", "submission_num"]


@dataclass
class ForesightPiece:
    """One partition's share of the capacity foresight's facts. An instance is held, and a
    placement refused, by runs of every partition, so the foresight is worked out once, over
    every partition's findings, when they are merged (as in one process): each partition
    sends the few columns of its other runs' jobs that tell what they held, were refused or
    waited for (and of those runs), the whole rows of its runs with a no-capacity culprit, and
    (the first partition, or each server of a fleet) the fleets and instances it read."""

    # frames, or (once written to the merge's folder: `spilled_piece`) the scans of their files
    runs: pl.DataFrame | pl.LazyFrame
    submissions: pl.DataFrame | pl.LazyFrame  # the jobs of its runs with a finding asking
    others: pl.DataFrame | pl.LazyFrame  # its other runs' jobs, their _CROSS_RUN_COLUMNS
    deployments: pl.DataFrame | pl.LazyFrame
    dateless: set[tuple[str, str]]
    # the "Run updated" events of its runs (specs.run_spec_at)
    updates: pl.DataFrame | pl.LazyFrame | None
    fleets: pl.DataFrame | pl.LazyFrame | None
    instances: pl.DataFrame | pl.LazyFrame | None
    fleet_table_servers: set[str]
    server_versions: dict[str, str]
    evidence_ends: dict[str, datetime]
    narrowed: bool  # --project or --since: other runs' jobs were not read at all
    secrets: set[str]  # the partition's known secret values, to mask what the foresight says


def foresight_piece(
    frames: Frames,
    findings: list[Finding],
    deployments: pl.DataFrame,
    dateless: set[tuple[str, str]],
    *,
    whole_tables: bool,
    narrowed: bool,
    secrets: set[str],
) -> ForesightPiece:
    """This partition's `ForesightPiece` (`whole_tables`: it carries the fleets and
    instances, which every partition reads whole)."""
    key = pl.DataFrame(
        sorted({(f.server, f.run_id) for f in wanted_findings(findings)}),
        schema={"server": pl.String, "run_id": pl.String},
        orient="row",
    )
    subs = frames.submissions
    # every job of another run may have held an instance, been refused one or waited in the
    # queue at a moment a probe asks about: the moments are known only at the merge
    others = subs.join(key, on=["server", "run_id"], how="anti").select(_CROSS_RUN_COLUMNS)
    runs = pl.concat(
        [
            frames.runs.join(key, on=["server", "run_id"], how="semi"),
            frames.runs.join(key, on=["server", "run_id"], how="anti").select(
                _CROSS_RUN_RUN_COLUMNS
            ),
        ],
        how="diagonal_relaxed",
    )
    return ForesightPiece(
        runs=own_buffers(runs),
        submissions=own_buffers(subs.join(key, on=["server", "run_id"], how="semi")),
        others=own_buffers(others),
        deployments=own_buffers(deployments.join(key, on=["server", "run_id"], how="semi")),
        dateless=dateless,
        updates=own_buffers(frames.updates) if frames.updates is not None else None,
        fleets=frames.fleets if whole_tables else None,
        instances=frames.instances if whole_tables else None,
        fleet_table_servers=frames.fleet_table_servers,
        server_versions=frames.server_versions,
        evidence_ends=frames.evidence_ends,
        narrowed=narrowed,
        secrets=secrets,
    )


_PIECE_FRAMES = ("runs", "submissions", "others", "deployments", "updates", "fleets", "instances")


def spilled_piece(folder: Path, index: int, piece: ForesightPiece) -> ForesightPiece:
    """Partition `index`'s piece, its frames written to `folder` (IPC files) and read back
    only by the merge, as scans: a partition's piece is 2 MB a thousand runs (100k runs:
    250 MB), no longer held while the other partitions are audited."""
    scans = {}
    for name in _PIECE_FRAMES:
        frame = getattr(piece, name)
        if isinstance(frame, pl.DataFrame):
            path = folder / f"foresight-{index}-{name}.ipc"
            frame.write_ipc(path)
            scans[name] = pl.scan_ipc(path, glob=False)
    return replace(piece, **scans)


def _concat(frames: list[pl.DataFrame | pl.LazyFrame]) -> pl.LazyFrame:
    return pl.concat([frame.lazy() for frame in frames], how="diagonal_relaxed")


class MergedFacts(NamedTuple):
    """What `foresight` reads over every partition's findings (`foresight_frames`). The jobs
    of the runs whose findings ask are held whole (`whole_jobs`); `frames.submissions` holds
    every job, but only the columns read of another run's jobs (_CROSS_RUN_COLUMNS) and of
    every job before a chunk's are picked (placement.placed_jobs, foresight.row_keys,
    foresight.capacity_holders), `_whole` naming a whole job's row: a column of another
    run's job is null in one process's frame too, and 100k runs' 219k such jobs held it in
    their 35 other columns (16 bytes a string, null or not: some 80 MB). A chunk's jobs are
    made whole again as they are picked (`foresight_answered`)."""

    frames: Frames
    deployments: pl.DataFrame
    dateless: set[tuple[str, str]]
    whole_jobs: pl.DataFrame


def foresight_frames(pieces: list[ForesightPiece]) -> MergedFacts:
    """What `foresight` reads, from every partition's piece: the same facts as one process
    reads (its frames, the deployments, the dateless runs), in its order but for the jobs:
    those of the runs whose findings ask held whole apart (`whole_jobs`), every job in the
    columns read before a chunk's, unsorted; `foresight_answered` makes a chunk's whole again
    and puts them in timeline order as it narrows them."""
    # every piece that read fleets and instances: the first partition's, or each server's
    whole = [p for p in pieces if p.fleets is not None]
    updated = [p.updates for p in pieces if p.updates is not None]
    whole_jobs, others, runs, fleets, instances, deployments, *updates = pl.collect_all(
        [
            _concat([p.submissions for p in pieces]),
            _concat([p.others for p in pieces]),
            _concat([p.runs for p in pieces]),
            _concat([p.fleets for p in whole]),
            _concat([p.instances for p in whole]),
            _concat([p.deployments for p in pieces]),
            *([_concat(updated)] if updated else []),
        ]
    )
    kept = [c for c in whole_jobs.columns if c in others.columns or c in PLACED_COLUMNS]
    frames = Frames(
        runs=runs,
        # every partition's jobs of the runs that ask, then every partition's others: each
        # chunk's own are sorted (foresight_answered), not every partition's at once (100k
        # runs: 137 MB, and a copy of it at the audit's peak)
        submissions=pl.concat(
            [whole_jobs.select(kept).with_row_index("_whole"), others], how="diagonal_relaxed"
        ),
        fleets=fleets,
        instances=instances,
        fleet_table_servers=set().union(*(p.fleet_table_servers for p in pieces)),
        server_versions={k: v for p in pieces for k, v in p.server_versions.items()},
        narrowed=any(p.narrowed for p in pieces),
        evidence_ends={k: v for p in pieces for k, v in p.evidence_ends.items()},
        updates=updates[0] if updates else None,
    )
    dateless = set().union(*(p.dateless for p in pieces))
    return MergedFacts(frames, deployments, dateless, whole_jobs)


def _whole_again(jobs: pl.DataFrame, whole_jobs: pl.DataFrame) -> pl.DataFrame:
    """`jobs` (rows of MergedFacts.frames.submissions) with every column of one process's
    frame, in its order: a whole job's row taken from `whole_jobs`, another run's with nulls
    in the columns never read of it, as one process's frame holds them (a run's jobs are all
    whole or all another run's: their order among themselves is kept)."""
    picked = jobs["_whole"]
    return pl.concat(
        [
            whole_jobs[picked.drop_nulls()],
            jobs.filter(picked.is_null()).drop("_whole"),
        ],
        how="diagonal_relaxed",
    ).select(whole_jobs.columns)


def foresight_answered(
    findings: list[Finding],
    facts: MergedFacts,
    redactor: Redactor,
    holders: dict[tuple, list[str]] | None = None,
    keys: RowKeys | None = None,
) -> list[Finding]:
    """`foresight` over findings of any partitions, from the `foresight_frames` of every
    partition's piece (each finding's answer depends on its own run and the shared facts
    alone; who held the room, `holders`, found for them all at once when given), each new
    answer masked with every partition's known secrets, as the partitions masked the rest of
    their findings (`keys`: the row_keys of the facts' frames, found once for every call)."""
    narrowed = facts_of(facts.frames, findings, keys)
    if narrowed is not facts.frames:
        # the jobs kept, whole, in timeline order (a stable sort): the order one process reads
        subs = _whole_again(narrowed.submissions, facts.whole_jobs)
        narrowed = replace(narrowed, submissions=subs.sort(_TIMELINE_ORDER, maintain_order=True))
    answered = list(foresight(narrowed, findings, facts.deployments, facts.dateless, holders))
    worked = [
        i
        for i, (old, new) in enumerate(zip(findings, answered, strict=True))
        if new.capacity_foresight is not None and new is not old
    ]
    # every new answer masked in one pass: each distinct text once, not once per finding
    masked = redactor.apply_model([answered[i].capacity_foresight for i in worked], controls=True)
    for i, answer in zip(worked, masked, strict=True):
        answered[i] = answered[i].model_copy(update={"capacity_foresight": answer})
    return answered


@dataclass
class PartitionResult:
    """What one partition of a larger audit returns: its report (its findings without their
    capacity foresight) and its share of the foresight's facts."""

    report: Report
    foresight: ForesightPiece


STREAMED = ("runs", "findings")  # the lists of a report that wait on disk for the merge
FORESIGHT_CHUNK = 512
"""Findings whose capacity foresight is worked out in one call (a project's together, a run's
never split: `_chunks`): each call's memory grows with the moments it asks about and the holders
of the room then. 16k runs, 2,192 findings: all at once 1.6 s CPU and 400 MB over the merge's
own, 512 at a time 2.5 s and 120 MB (the audit in 16 partitions: 542 MB peak; 1,024 at a time:
676 MB); at 100k runs the merge's foresight is the audit's peak (docs/benchmarks.md)."""


LOCAL_FORESIGHT_CHUNK = 2048
"""FORESIGHT_CHUNK in a process of a local --workers audit, which answers only the findings of
the partitions it audited, given every partition's facts (finished_where_audited): 16k runs on
--workers 2, each process's 1.1k findings in one call, not three: 0.08-0.1 s of CPU less in
each (0.40-0.46 s against 0.49-0.55 s), the same peak RSS (617-670 MB)."""


@dataclass
class SpilledPartition:
    """What the merge keeps of a partition written to its spill files (`spilled`): its report,
    its findings slim (a verdict is small: held whole, for the summary and the order of the
    runs), which of its findings ask for the capacity foresight, its foresight piece (None
    once taken by the merge), whether its files are masked with every partition's secret
    values already (`finished_where_audited`), and whether their texts passed the JSON
    report's final pass already, as the report's pieces (`texts_passed`)."""

    head: Report
    wanted: list[int]
    foresight: ForesightPiece | None
    guarded: bool = False
    passed: bool = False


def spilled(folder: Path, index: int, result: PartitionResult) -> SpilledPartition:
    """Partition `index`'s report written to its files in the merge's `folder` (ReportSpill:
    each run verdict and finding as its JSON text, in the report's order), in whichever
    process audited it."""
    report = result.report
    _write(_spill_file(folder, "runs", index), [_text(v) for v in report.runs])
    _write(_spill_file(folder, "findings", index), [_text(f) for f in report.findings])
    wanted = {id(f) for f in wanted_findings(report.findings)}
    return SpilledPartition(
        report.model_copy(
            update={
                "runs": [slim_verdict(v) for v in report.runs],
                "findings": [slim_finding(f, id(f) in wanted) for f in report.findings],
            }
        ),
        [i for i, f in enumerate(report.findings) if id(f) in wanted],
        result.foresight,
    )


def _spill_file(folder: Path, name: str, index: int) -> Path:
    return folder / f"{name}-{index}.spill"


class ReportSpill:
    """The reports of the partitions of one audit, each written to a private folder as soon
    as its partition is done, so that no list of every run and finding is held for the merge:
    each run verdict and each finding as its JSON text, in the partition's order (`_write`;
    the merge's order of them all is the merged head's), beside what the merge reads of them
    (the summary's few fields) and the partition's whole-report facts. The folder is made by
    `tempfile` (never in or beside the evidence) and removed on leaving, also on an error or
    Ctrl-C."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._parts: dict[int, SpilledPartition] = {}  # each partition, its items slim
        self._pieces: list[ForesightPiece] = []

    def __enter__(self) -> ReportSpill:
        self._folder = Path(tempfile.mkdtemp(prefix="dstack-audit-merge-"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._folder is not None:
            remove_folder(self._folder)
            self._folder = None

    @property
    def folder(self) -> Path:
        if self._folder is None:
            raise RuntimeError("a ReportSpill is used inside `with`")
        return self._folder

    def _file(self, name: str, index: int) -> Path:
        return _spill_file(self.folder, name, index)

    def add(self, index: int, result: PartitionResult) -> None:
        """Partition `index`'s report written out, its foresight piece kept (results may come
        in any order: the merge takes them in the partitions' order)."""
        self.take(index, spilled(self.folder, index, result))

    def take(self, index: int, part: SpilledPartition) -> None:
        """Partition `index`, written out already (`spilled`, where it was audited), its
        foresight answered there already when its `wanted` is empty (foresight_written).
        Its piece is written out for the merge's foresight (`spilled_piece`), but for a
        partition finished where it was audited (`guarded`): the merge reads only the secret
        values of that one, which its caller holds already."""
        if part.foresight is not None:
            piece = part.foresight
            self._pieces.append(piece if part.guarded else spilled_piece(self.folder, index, piece))
        self._parts[index] = replace(part, foresight=None)

    def merged(self) -> MergedReport:
        """The merged report: the capacity foresight of every finding that asks for it worked
        out once over every partition's facts (and written into its partition's file; unless
        the processes that audited the partitions did, `finished_where_audited`), every text
        masked with every partition's known secret values: the report one process gives."""
        pieces, self._pieces = self._pieces, []
        known = known_secrets(pieces)
        self._parts = foresight_written(self.folder, self._parts, pieces, known)
        order = sorted(self._parts)
        with stage("merging: every partition's secrets masked in the others"):
            for index in order:
                if not self._parts[index].guarded:
                    _guard(self.folder, index, known)
        whole = merge_reports([self._parts[i].head for i in order])
        head = known.guard_model(whole.model_copy(update={name: [] for name in STREAMED}))
        # which partition's file holds each merged item: the merge keeps the items themselves
        source = {
            id(item): position
            for position, index in enumerate(order)
            for name in STREAMED
            for item in getattr(self._parts[index].head, name)
        }
        return MergedReport(
            head=head,
            counts={"runs": whole.summary.runs, "findings": whole.summary.findings},
            files={name: [self._file(name, i) for i in order] for name in STREAMED},
            sources={
                name: [source[id(item)] for item in getattr(whole, name)] for name in STREAMED
            },
            passed=all(self._parts[i].passed for i in order),
        )


def _guard(folder: Path, index: int, known: Redactor) -> None:
    """Partition `index`'s files as the merged report's secret guard leaves them
    (Redactor.guard_model), each rewritten only when a text holds a known value or a hidden
    character (a value one partition's runs hold, repeated in another's): one look at the
    texts first, the items read only then."""
    for name, model in (("runs", RunVerdict), ("findings", Finding)):
        path = _spill_file(folder, name, index)
        if not known.holds_known_or_hidden(path.read_text(encoding="utf-8")):
            continue
        items = [model.model_validate_json(text) for text in _read(path)]
        _write(path, [_text(item) for item in known.guard_model(_Items(items=items)).items])


def finished_where_audited(
    folder: Path, parts: dict[int, SpilledPartition], pieces: list[ForesightPiece]
) -> dict[int, SpilledPartition]:
    """`parts` finished in the process that audited them, given every partition's foresight
    `pieces` (in the partitions' order): their capacity foresight worked out
    (`foresight_written`) and their files masked with every partition's secret values, so
    that the merge has neither left to do alone."""
    known = known_secrets(pieces)
    answered = foresight_written(folder, parts, pieces, known, LOCAL_FORESIGHT_CHUNK)
    for index in answered:
        _guard(folder, index, known)
    return {i: SpilledPartition(p.head, [], None, guarded=True) for i, p in answered.items()}


def texts_passed(folder: Path, index: int, final: Callable[[pl.Series], pl.Series | None]) -> bool:
    """Partition `index`'s runs' and findings' texts in `folder` through `final` together
    (the JSON report's final pass, in the process that audited the partition:
    analyzer.render.report_json), each file written again only when a text changed; False
    when `final` could not give them back (None), the files left as they were."""
    texts = {name: _read(_spill_file(folder, name, index)) for name in STREAMED}
    given = pl.Series([text for name in STREAMED for text in texts[name]], dtype=pl.String)
    passed = final(given)
    if passed is None:
        return False
    start = 0
    for name in STREAMED:
        mine = slice(start, start + len(texts[name]))
        start = mine.stop
        if (passed[mine] != given[mine]).any():
            _write(_spill_file(folder, name, index), passed[mine].to_list())
    return True


def known_secrets(pieces: list[ForesightPiece]) -> Redactor:
    """Every partition's known secret values: each text of the merged report is masked with
    them all, as one process masks it."""
    return Redactor(values=set().union(*(p.secrets for p in pieces)))


def foresight_written(
    folder: Path,
    parts: dict[int, SpilledPartition],
    pieces: list[ForesightPiece],
    known: Redactor,
    chunk: int | None = None,
) -> dict[int, SpilledPartition]:
    """`parts` with the capacity foresight of each finding that asks for it worked out over
    every partition's `pieces` (emptied once read: they are freed) and masked with every
    partition's secret values (`known`), written into its partition's file in `folder`: the
    foresight of a finding depends on its own run and the shared facts alone, so the
    partitions may be answered together or a share in each process that audited them
    (analyzer.cluster.audit_partitions_locally). `chunk`: findings per call (FORESIGHT_CHUNK
    unless given)."""
    order = sorted(parts)
    asked = [(i, k) for i in order for k in parts[i].wanted]
    if not asked:
        pieces.clear()
        return parts
    heads = {i: parts[i].head for i in order}
    with stage("merging: the capacity foresight over every partition"):
        facts = foresight_frames(pieces)
        pieces.clear()
        answers: dict[tuple[int, int], Finding] = {}
        # who held the room at each failure, found for every finding at once: the jobs
        # placed on instances are every partition's, whatever the chunk (their ties in
        # timeline order), held for this alone, not through the chunks' work (100k runs:
        # some 70 MB)
        placed = placed_jobs(facts.frames.submissions, facts.frames.runs, ties=_TIMELINE_ORDER)
        holders = capacity_holders(
            [heads[i].findings[k] for i, k in asked], replace(facts.frames, placed=placed)
        )
        del placed
        keys = row_keys(facts.frames)
        wanted = {i: parts[i].wanted for i in order}
        for asking in _chunks(order, heads, wanted, chunk or FORESIGHT_CHUNK):
            # the foresight reads what the slim findings keep (culprits, root cause): its
            # answer is copied into the whole finding
            slim = [heads[i].findings[k] for i, k in asking]
            answered = foresight_answered(slim, facts, known, holders, keys)
            # held until every chunk is answered (100k runs: 13k answers, each its own copy)
            answers.update(zip(asking, map(_sharing_fields_set, answered), strict=True))
        del facts, keys
        return {
            i: SpilledPartition(_answer(folder, i, heads[i], wanted[i], answers), [], None)
            for i in order
        }


def _answer(
    folder: Path,
    index: int,
    head: Report,
    wanted: list[int],
    answers: dict[tuple[int, int], Finding],
) -> Report:
    """Partition `index`'s findings with their capacity foresight (and the root cause it may
    name), written out again in `folder`; what the summary reads of them kept (its head)."""
    changed = {k: answers[index, k] for k in wanted if answers[index, k] is not head.findings[k]}
    if not changed:
        return head
    path = _spill_file(folder, "findings", index)
    lines = _read(path)
    slim = list(head.findings)
    for k, answer in changed.items():
        lines[k] = _answered_text(lines[k], answer, head.findings[k])
        # the answer is a slim finding's copy: slim already, but for the answer itself
        slim[k] = _sharing_fields_set(answer.model_copy(update={"capacity_foresight": None}))
    _write(path, lines)
    return head.model_copy(update={"findings": slim})


_UNANSWERED = '\n  "capacity_foresight": null'


def _answered_text(text: str, answer: Finding, slim: Finding) -> str:
    """A finding's JSON `text` with the `answer`'s capacity foresight: put in the place of
    its null one as `model_dump_json(indent=2)` writes it there (a field of the finding: its
    lines two spaces further in), when that is all the answer changed (not its root cause);
    else the finding read, updated and written again whole."""
    if answer.root_cause is slim.root_cause and text.count(_UNANSWERED) == 1:
        shown = _text(answer.capacity_foresight).replace("\n", "\n  ")
        return text.replace(_UNANSWERED, f'\n  "capacity_foresight": {shown}')
    update = {"capacity_foresight": answer.capacity_foresight, "root_cause": answer.root_cause}
    return _text(Finding.model_validate_json(text).model_copy(update=update))


def _chunks(order: list[int], heads: dict[int, Report], wanted: dict[int, list[int]], size: int):
    """The findings that ask for the foresight, `size` or so at a time, a project's
    together (each chunk reads only its projects' facts: foresight.facts_of) and a run's
    together (the holders of the room named for a run are those of each of its findings,
    foresight.capacity_holders; a run is in one partition and one project)."""
    runs: dict[tuple, list[tuple[int, int]]] = {}
    for index in order:
        for k in wanted[index]:
            finding = heads[index].findings[k]
            place = (finding.server, finding.project or "", finding.project is None)
            runs.setdefault((*place, finding.run_id), []).append((index, k))
    chunk: list[tuple[int, int]] = []
    for run in sorted(runs):
        chunk += runs[run]
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Items(BaseModel):
    """Items of one list of a report, guarded together."""

    items: list[SerializeAsAny[BaseModel]]


class _Stop(NamedTuple):
    """What the summary reads of a victim (impact._summary_frames)."""

    terminated_at: datetime | None


class _Loss(NamedTuple):
    """What the summary reads of a victim's impact (impact._summary_frames)."""

    lost_seconds: float | None
    lost_cost: float | None
    lost_is_lower_bound: bool


class _Impact(NamedTuple):
    """What the summary (impact._summary_frames) and the findings' order (impact.impact_rank)
    read of a finding's impact."""

    outage_start: datetime | None
    outage_seconds: float | None
    outage_is_lower_bound: bool
    healthy_replica_seconds_lost: float | None
    lost_cost: float | None
    per_victim: list[_Loss]


class _Culprit(NamedTuple):
    """What the summary (impact._summary_frames) and the capacity foresight
    (foresight.wanted_findings, foresight, capacity_holders) read of a culprit."""

    termination_reason: str | None
    termination_reason_message: str | None
    deployment_num: int | None
    failed_at: datetime | None


class _RootCause(NamedTuple):
    """What the summary (impact._summary_frames) reads of the root cause of a finding that does
    not ask for the capacity foresight."""

    fleets: list[str]
    failure_class: str | None


# What the merge reads of a run verdict (analyzer.pipeline.assemble: its place in the report,
# its verdict and whether it is still in progress): one set of those names that every slim
# verdict shares (a set of its own would take 0.7 KB more a verdict).
_MERGED_RUN_FIELDS = set(
    ("server", "project", "run_name", "run_id", "verdict", "in_progress", "gaps")
)


def slim_verdict(verdict: RunVerdict) -> RunVerdict:
    """What the merge (merge_reports) reads of a run verdict; the rest of it (why, the gaps,
    its status) waits on disk, or in a fleet's server's rendered pieces. Its texts that
    repeat from run to run (server, project, name, verdict) are held once. About 0.4-0.5 KB in
    memory against a whole verdict's 1.5 KB (100k runs: some 100 MB less held for the merge).
    Only read, never validated or written out."""
    return RunVerdict.model_construct(
        _MERGED_RUN_FIELDS,
        server=sys.intern(verdict.server),
        project=verdict.project and sys.intern(verdict.project),
        run_name=sys.intern(verdict.run_name),
        run_id=verdict.run_id,
        verdict=sys.intern(verdict.verdict),
        in_progress=verdict.in_progress,
        gaps=[],  # given: pydantic would look at its default's signature each time (0.1 ms)
    )


_FINDING_FIELDS = set(Finding.model_fields)


def slim_finding(finding: Finding, foresight_asked: bool) -> Finding:
    """What the merge (merge_reports) reads of a finding: its order (impact_rank), the
    summary's figures (impact.summarise: its impact's, each victim's stop and loss, its
    culprits' failures and root cause's class and fleets, as plain tuples), its limitations,
    what the capacity foresight reads of its culprits, and, when `foresight_asked`
    (foresight.wanted_findings), its root cause whole (the foresight's answer may be a new one,
    a copy of it); the rest of it (its evidence chain, what-ifs, the
    victims' details) waits on disk, or in a fleet's server's rendered pieces. Only read, never
    validated or written out. 16k runs: 4.1k findings held in 8 KB each when only victims and
    losses were tuples, in 3 KB as these (100k runs, 26k findings: some 130 MB less)."""
    impact = finding.impact
    if impact is not None:
        impact = _Impact(
            impact.outage_start,
            impact.outage_seconds,
            impact.outage_is_lower_bound,
            impact.healthy_replica_seconds_lost,
            impact.lost_cost,
            [_Loss(v.lost_seconds, v.lost_cost, v.lost_is_lower_bound) for v in impact.per_victim],
        )
    update: dict = {
        "victims": [_Stop(v.terminated_at) for v in finding.victims],
        "culprits": [
            _Culprit(
                c.termination_reason, c.termination_reason_message, c.deployment_num, c.failed_at
            )
            for c in finding.culprits
        ],
        "impact": impact,
        "evidence": [],
        "counterfactuals": [],
        "also_stopped": [],
        "notes": [],
        "capacity_foresight": None,
    }
    if not foresight_asked:  # else its answer may be a new root cause (a copy of this one)
        cause = finding.root_cause
        update["root_cause"] = cause and _RootCause(cause.fleets, cause.failure_class)
    return _sharing_fields_set(finding.model_copy(update=update))


def _sharing_fields_set(slim: Finding) -> Finding:
    """`slim` (a slim finding, or a copy of one: an answer of the foresight) with the one set
    of its fields' names that every slim finding shares (a set of its own takes 2.2 KB)."""
    object.__setattr__(slim, "__pydantic_fields_set__", _FINDING_FIELDS)
    return slim


def _text(item: BaseModel) -> str:
    return item.model_dump_json(indent=2)


# A spill file is the JSON texts of a partition's items in its report's order (`indent=2`,
# which never holds an empty line: a string's newlines are escaped), each ended by an empty
# line. The texts lie in the file as they are, so the secret guard looks at the file's text
# itself; nothing in it is parsed to merge (the merged head's order says which partition's
# file holds each next item: MergedReport.sources).
_END = "\n\n"


def _write(path: Path, texts: list[str]) -> None:
    with path.open("wb") as handle:  # UTF-8, its newlines as they are, on any system
        handle.writelines((text + _END).encode("utf-8") for text in texts)


def _read(path: Path) -> list[str]:
    return list(_records(path))


def _records(path: Path) -> Iterator[str]:
    """The texts of a spill file in order, read a block at a time."""
    return (text.decode("utf-8") for text in _records_bytes(path))


def _records_bytes(path: Path) -> Iterator[bytes]:
    """`_records`, each text as its UTF-8 bytes (an ASCII separator: no character of UTF-8
    holds its bytes), never decoded."""
    end = _END.encode()
    with path.open("rb") as handle:
        rest = b""
        while block := handle.read(1 << 20):
            *whole, rest = (rest + block).split(end)
            yield from whole


@dataclass
class MergedReport:
    """The merged report of partitions: every field but the runs and findings (`head`, with
    the summary of them all), and the runs and findings as their JSON texts, read from the
    partitions' files in the report's order (`texts`) or into a whole Report (`report`);
    `passed`: those texts passed the JSON report's final pass in their partitions' processes
    (`texts_passed`), and are no longer the model's. `sources`: for each item of each list,
    in the report's order, which of its `files` holds it (the next text of that file)."""

    head: Report
    counts: dict[str, int]
    files: dict[str, list[Path]] = field(repr=False)
    sources: dict[str, list[int]] = field(repr=False)
    passed: bool = False

    def texts(self, name: str) -> Iterator[str]:
        """Each item of the list `name` as `model_dump_json(indent=2)` gives it, in order."""
        return (text.decode("utf-8") for text in self.texts_bytes(name))

    def texts_bytes(self, name: str) -> Iterator[bytes]:
        """`texts`, as their UTF-8 bytes: a report written from texts that passed the final
        pass already takes them as they lie in the files (16k runs: 0.10 s against 0.16 s to
        decode, indent and encode its 20k items again)."""
        files = [_records_bytes(path) for path in self.files[name]]
        return (next(files[source]) for source in self.sources[name])

    def report(self) -> Report:
        """The whole report, every item read back."""
        lists = {
            "runs": [RunVerdict.model_validate_json(t) for t in self.texts("runs")],
            "findings": [Finding.model_validate_json(t) for t in self.texts("findings")],
        }
        return self.head.model_copy(update=lists)
