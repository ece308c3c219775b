"""The report, assembled in one place: from one audit's verdicts and findings, and from the
reports of disjoint partitions of the same audit (merged as if audited whole).

Both paths share the order of runs, findings and limitations and the one summary, so a
merged report equals the whole audit's (tests/test_integrity.py, tests/test_cluster.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from analyzer._version import __version__
from analyzer.contract import (
    Finding,
    InputRecord,
    LimitationRecord,
    Report,
    RunVerdict,
    Summary,
)
from analyzer.errors import AuditInputError
from analyzer.pipeline.counterfactual import describe_models
from analyzer.pipeline.impact import impact_rank, summarise
from analyzer.redact import RULE_SET

if TYPE_CHECKING:
    from analyzer.sources.base import InputInfo, SourceData

END_BOUND = "end_of_evidence_lower_bound"
NO_RUN_EVIDENCE = "no_run_evidence"


def summary_of(
    findings: list[Finding], verdicts: list[RunVerdict], *, figures: bool = True
) -> Summary:
    """The counts and the fleet-wide figures of a report (analyzer.pipeline.impact); without
    `figures`, the counts alone: a part of a merge, which works the figures out again over
    every part's findings (merge_reports)."""
    base = Summary(
        runs=len(verdicts),
        findings=len(findings),
        victims=sum(len(f.victims) for f in findings),
        by_verdict=dict(Counter(v.verdict for v in verdicts)),
    )
    return summarise(findings, verdicts, base) if figures else base


def end_bounds(ends: dict[str, datetime], findings: list[Finding]) -> list[LimitationRecord]:
    """For each server with a finding: its end of the evidence is a lower bound of when it was
    captured, so an outage not recovered by then lasted at least that long."""
    servers = {f.server for f in findings}
    return [
        LimitationRecord(
            code=END_BOUND,
            message=f"the end of the evidence, {end.isoformat()}, is the latest "
            "moment any input shows the server alive (every table's times, every "
            "log line): a lower bound of when it was captured, so an outage not "
            "recovered by then lasted at least that long",
            source=f"server {server}",
        )
        for server, end in sorted(ends.items())
        if server in servers
    ]


NO_RUN_EVIDENCE_RECORD = LimitationRecord(
    code=NO_RUN_EVIDENCE,
    message="the inputs hold no run or job records: the audit cannot decide "
    "whether any incident happened",
    source="audit",
)


def _ordered_limitations(
    limitations: Iterable[LimitationRecord], has_runs: bool
) -> list[LimitationRecord]:
    """Each limitation once, in the order first said; the end-of-evidence bounds last, by
    server; "no run evidence" dropped once any run is known."""
    unique: dict[tuple[str, str, str | None], LimitationRecord] = {}
    for item in limitations:
        unique.setdefault((item.code, item.message, item.source), item)
    kept = [lim for lim in unique.values() if not (has_runs and lim.code == NO_RUN_EVIDENCE)]
    return [lim for lim in kept if lim.code != END_BOUND] + sorted(
        (lim for lim in kept if lim.code == END_BOUND), key=lambda lim: lim.source or ""
    )


def run_order(verdict: RunVerdict) -> tuple:
    """A run verdict's place in the report: by server, project and name."""
    return (verdict.server, verdict.project or "", verdict.run_name, verdict.run_id)


def assemble(
    *,
    inputs: list[InputRecord],
    limitations: Iterable[LimitationRecord],
    verdicts: Iterable[RunVerdict],
    findings: Iterable[Finding],
    end_of_evidence: datetime | None,
    figures: bool = True,
) -> Report:
    """The report: runs by server, project and name; findings worst first (impact_rank);
    what a finding cannot prove said for the whole audit too; the summary of both (without
    its `figures`: a part of a merge, summary_of)."""
    runs = sorted(verdicts, key=run_order)
    ranked = sorted(findings, key=impact_rank)
    said = [*limitations, *(lim for f in ranked for lim in f.limitations)]
    return Report(
        generated_by=f"dstack-audit {__version__}",
        redaction_rules=RULE_SET,
        inputs=inputs,
        limitations=_ordered_limitations(said, has_runs=bool(runs)),
        summary=summary_of(ranked, runs, figures=figures),
        end_of_evidence=end_of_evidence,
        counterfactual_models=describe_models(),
        runs=runs,
        findings=ranked,
    )


def merge_reports(
    reports: list[Report], complete: Callable[[list[Finding]], list[Finding]] | None = None
) -> Report:
    """One report from the reports of disjoint partitions of the same audit. Partitions that
    share a run are refused: an input read whole by every partition (a log, a table export, an
    API or CLI capture) would count its runs and victims once per partition."""
    _refuse_overlap(reports)
    ends = [r.end_of_evidence for r in reports if r.end_of_evidence is not None]
    findings = [f for r in reports for f in r.findings]
    merged = assemble(
        inputs=_merge_inputs(reports),
        limitations=(lim for r in reports for lim in r.limitations),
        verdicts=(v for r in reports for v in r.runs),
        findings=complete(findings) if complete else findings,
        end_of_evidence=max(ends) if ends else None,
    )
    first = reports[0]
    return merged.model_copy(
        update={
            "generated_by": first.generated_by,
            "redaction_rules": first.redaction_rules,
            "counterfactual_models": first.counterfactual_models,
        }
    )


_PARTITION_NOTE = re.compile(r"partition \d+/\d+ \(whole services\)")
_PARTITION_KIND = re.compile(r" \(partition \d+/\d+\)$")


def _refuse_overlap(reports: list[Report]) -> None:
    seen: set[tuple[str, str]] = set()
    for report in reports:
        runs = {(v.server, v.run_id) for v in report.runs}
        if runs & seen:
            whole = _read_whole(report.inputs)
            raise _unsplittable(whole[0] if whole else "--partitions")
        seen |= runs


def refuse_unsplit(parts: Iterable[SourceData]) -> None:
    """A partition's inputs, before it is audited: one that holds runs, jobs or events yet is
    read whole by every partition is refused. A log beside a database is the case the merge's
    check of the runs cannot see: its runs of this partition join the database's, its runs of
    the others become runs of the log alone, under other ids, in every partition."""
    for part in parts:
        if any(map(_shared, part.inputs)) or not (whole := _read_whole(part.inputs)):
            continue
        if part.runs.height or part.jobs.height or part.events.height:
            raise _unsplittable(whole[0])


def _shared(item: InputInfo | InputRecord) -> bool:
    """Whether a partition read its share of this input only (a database, a dataset)."""
    return bool(_PARTITION_KIND.search(item.kind)) or any(
        _PARTITION_NOTE.fullmatch(note) for note in item.notes
    )


def _read_whole(inputs: Iterable[InputInfo | InputRecord]) -> list[str]:
    """The paths of the inputs with records that no partition read a share of."""
    return [i.path for i in inputs if i.records and not _shared(i)]


def _unsplittable(path: str) -> AuditInputError:
    return AuditInputError(
        path,
        "cannot be read one partition at a time (only databases and ingested datasets "
        "can): every partition would count its runs again",
        "audit without --partitions/--workers/--cluster, or `dstack-audit ingest` the "
        "inputs into a dataset and audit the dataset in partitions",
    )


def _merge_inputs(reports: list[Report]) -> list[InputRecord]:
    """Each input once, as the whole audit lists it: an input read one partition at a time (a
    database, a dataset) counts the records of every partition, keeps each note a partition
    adds (the damage each found in its own selection) and no longer names one; an input every
    partition reads whole is listed as the first partition read it."""
    merged: dict[tuple[str, str], InputRecord] = {}
    for item in (i for r in reports for i in r.inputs):
        kind = _PARTITION_KIND.sub("", item.kind)
        notes = [note for note in item.notes if not _PARTITION_NOTE.fullmatch(note)]
        key = (item.path, kind)
        if key not in merged:
            merged[key] = item.model_copy(update={"kind": kind, "notes": notes})
        elif kind != item.kind or notes != item.notes:
            seen = merged[key]
            merged[key] = seen.model_copy(
                update={
                    "records": seen.records + item.records,
                    "unparsed": seen.unparsed + item.unparsed,
                    "notes": seen.notes + [note for note in notes if note not in seen.notes],
                }
            )
    return list(merged.values())
