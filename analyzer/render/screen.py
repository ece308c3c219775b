"""The terminal view of an audit (`--format table`): findings first, then the runs that need a
look, limitations and a summary of the inputs, laid out by rich to the terminal's width.

Columns shrink and wrap at spaces (never inside a word, as long as the word fits the column),
paths are shortened in the middle (the file name stays), and a finding's details fold under
its headline inside one cell instead of widening the table.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import tzinfo

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from analyzer.contract import Finding, InputRecord, Report, RunVerdict
from analyzer.render.format import (
    GROUP_HEADERS,
    cost_text,
    fmt_time,
    group_rows,
    outage_text,
    replica_time_text,
    undecided,
)
from analyzer.terminal import console as terminal_console

DEFAULT_WIDTH = 100
VERDICT_STYLE = {
    "collateral_termination": "bold red",
    "same_deployment_collateral": "red",
    "no_healthy_victim": "yellow",
    "inconclusive": "magenta",
    "no_incident": "green",
}


def middle_ellipsis(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut in the middle so both ends (a path's file
    name) stay readable."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    tail = (width - 1) * 2 // 3
    head = width - 1 - tail
    return text[:head] + "…" + text[len(text) - tail :]


def _run_label(item: Finding | RunVerdict) -> str:
    label = f"{item.project}/{item.run_name}" if item.project else item.run_name
    return f"{item.server}:{label}" if item.server != "default" else label


def _table(*headers: str, **options: object) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        header_style="bold",
        expand=False,
        **options,
    )
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _fill(table: Table, rows: Iterable[Sequence[str | Text]], width: int) -> Table:
    """Add `rows`; each column at least as wide as its longest word, so rich wraps between
    words instead of splitting one (only a word wider than the screen allows is folded)."""
    words = [len(c.header) for c in table.columns]
    for row in rows:
        cells = [c if isinstance(c, Text) else Text(str(c)) for c in row]
        for i, cell in enumerate(cells):
            words[i] = max([words[i], *(len(w) for w in cell.plain.split())])
        table.add_row(*cells)
    room = width - 2 * (len(words) - 1)
    while sum(words) > room and max(words) > 8:
        words[words.index(max(words))] -= 1
    for column, word in zip(table.columns, words, strict=True):
        column.min_width = word
    return table


def _finding_cell(finding: Finding, tz: tzinfo | None) -> Text:
    cell = Text()
    cell.append(finding.category, VERDICT_STYLE.get(finding.category, ""))
    cell.append(f" ({finding.confidence}) ")
    cell.append(_run_label(finding), "bold")
    cell.append(f" {finding.run_id[:8]}", "dim")
    victims = ", ".join(f"{v.job_name} (dep {v.deployment_num})" for v in finding.victims)
    culprits = ", ".join(
        f"{c.job_name} (dep {c.deployment_num}): {c.termination_reason}"
        + (f" '{c.termination_reason_message}'" if c.termination_reason_message else "")
        + (
            ", re-submitted after "
            + (
                f"submission {c.earlier_failures[0].submission_num}"
                if c.earlier_failures[0].submission_num is not None
                else "a submission whose row dstack deleted (its events kept)"
            )
            + ": "
            f"{c.earlier_failures[0].termination_reason} (the root cause)"
            if c.earlier_failures
            else ""
        )
        for c in finding.culprits
    )
    cell.append("\nvictims: ", "dim")
    cell.append(victims or "-")
    cell.append("\nculprit: ", "dim")
    cell.append(culprits or "-")
    if finding.changed_fields:
        cell.append("\nupdate: ", "dim")
        cell.append(f"{finding.updated_by or '?'} changed {finding.changed_fields}")
    return cell


def _impact_cell(finding: Finding, tz: tzinfo | None) -> Text:
    impact = finding.impact
    killed = max((v.terminated_at for v in finding.victims if v.terminated_at), default=None)
    cell = Text()
    cell.append("killed ", "dim")
    cell.append(fmt_time(killed, tz=tz))
    cell.append("\noutage ", "dim")
    cell.append(outage_text(impact) if impact else "unknown")
    if impact and impact.outage_seconds is not None and not impact.recovered:
        cell.append(" (not recovered)", "red")
    cell.append("\nlost ", "dim")
    cell.append(replica_time_text(impact) if impact else "unknown")
    cell.append(" replica-time")
    cell.append("\ncost ", "dim")
    cell.append(cost_text(impact) if impact else "unknown")
    return cell


def _findings(report: Report, tz: tzinfo | None, width: int) -> list:
    if not report.findings:
        why = undecided(report)
        if why is None:
            return [Text("FINDINGS: none", "bold green")]
        if report.summary.runs == 0:
            return [Text(f"FINDINGS: none, but {why}: nothing could be decided", "bold yellow")]
        return [Text(f"FINDINGS: none, but {why}", "bold yellow")]
    table = _fill(
        _table("#", "finding", "impact"),
        (
            (str(n), _finding_cell(f, tz), _impact_cell(f, tz))
            for n, f in enumerate(report.findings, 1)
        ),
        width,
    )
    summary = report.summary
    return [
        Text(
            "FINDINGS, worst first: healthy replicas terminated because another replica's "
            "failure failed the run",
            "bold",
        ),
        table,
        Text(
            f"IMPACT: {summary.victims} healthy replica(s) killed in {summary.incidents} "
            f"incident(s), outage {outage_text(summary)}, replica-time lost "
            f"{replica_time_text(summary)}, cost {cost_text(summary)} (until recovery, or "
            f"until the end of the evidence {fmt_time(report.end_of_evidence, tz=tz)})"
        ),
    ]


def _groups(report: Report, width: int) -> list:
    summary = report.summary
    if len(report.findings) <= 1 and len(summary.by_server) <= 1:
        return []
    sections = [
        ("BY SERVER", summary.by_server if len(summary.by_server) > 1 else []),
        ("BY PROJECT", summary.by_project),
        ("BY FLEET", summary.by_fleet),
        ("BY USER WHO APPLIED THE UPDATE", summary.by_user),
        ("BY DAY", summary.by_day),
        ("BY FAILURE CLASS", summary.by_failure_class),
    ]
    out: list = []
    for title, groups in sections:
        if not groups:
            continue
        rows = [[str(v) for v in row] for row in group_rows(groups)]
        others = [
            max([len(header), *(len(row[i]) for row in rows)])
            for i, header in enumerate(GROUP_HEADERS)
        ][1:]
        key_room = max(12, width - sum(others) - 2 * len(others))
        rows = [[middle_ellipsis(row[0], key_room), *row[1:]] for row in rows]  # a server's path
        table = _fill(_table(*GROUP_HEADERS), rows, width)
        out += [Text(""), Text(title, "bold"), table]
    return out


def _run_cell(v: RunVerdict) -> Text:
    cell = Text(_run_label(v), "bold")
    cell.append(f" {v.run_id[:8]} ", "dim")
    cell.append(
        f"{v.status}"
        + (f" ({v.termination_reason})" if v.termination_reason else "")
        + (" [in progress]" if v.in_progress else "")
        + f" deployment {v.deployment_num}"
    )
    cell.append("\nwhy: ", "dim")
    cell.append(v.why)
    return cell


def _runs(report: Report, shown: Sequence[RunVerdict], note: str, width: int) -> list:
    counts = ", ".join(
        f"{n} {v}" for v, n in sorted(Counter(r.verdict for r in report.runs).items())
    )
    out: list = [Text(""), Text(f"RUNS: {len(report.runs)} ({counts or 'none'}){note}", "bold")]
    if not shown:
        return out
    rows = ((Text(v.verdict, VERDICT_STYLE.get(v.verdict, "")), _run_cell(v)) for v in shown)
    out.append(_fill(_table("verdict", "run"), rows, width))
    return out


TABLE_KINDS = ("sqlite", "table-export", "postgresql")  # their unparsed records are values
UNKNOWN_LINES = re.compile(r"\b([1-9]\d*) unrecognised dstack lines?")


def _input_problems(item: InputRecord) -> list[str]:
    """What a reader must know about an input: damage, lines of unknown shape, not recognised."""
    unit = "value(s)" if item.kind in TABLE_KINDS else "line(s)"
    problems = [f"{item.unparsed} unparsed {unit}"] if item.unparsed else []
    problems += [n for n in item.notes if "truncated" in n and "damaged value" not in n]
    for note in item.notes:
        unknown = UNKNOWN_LINES.search(note)
        if unknown:
            problems.append(f"{unknown.group(1)} dstack line(s) of unknown shape")
    if item.kind == "unrecognised":
        problems.append("not recognised")
    return problems


def _bullets(mark: str, lines: Iterable[Text], style: str = "") -> Table:
    """Lines with a hanging indent under their mark."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for line in lines:
        grid.add_row(Text(mark, style), line)
    return grid


def _inputs(report: Report, full: bool, width: int) -> list:
    inputs = report.inputs
    kinds = Counter(i.kind for i in inputs)
    families = Counter(i.kind.split(" (")[0] for i in inputs)
    records: Counter[str] = Counter()
    for item in inputs:
        records[item.kind] += item.records
    out: list = [
        Text(""),
        Text(
            f"INPUTS: {len(inputs)} ("
            + ", ".join(f"{n} {kind}" for kind, n in sorted(families.items()))
            + ")",
            "bold",
        ),
    ]
    if full:
        path_width = max(20, width - 20)
        rows = (
            (
                (item.sha256 or "-")[:16],
                Text(middle_ellipsis(item.path, path_width), "bold")
                + Text(
                    f"\n{item.kind}, version {item.server_version or '?'}, {item.records} "
                    f"records, {item.unparsed} unparsed"
                ),
            )
            for item in inputs
        )
        out.append(_fill(_table("sha256", "input"), rows, width))
        return out
    rows = (
        (kind, str(n), str(records[kind]), str(sum(i.unparsed for i in inputs if i.kind == kind)))
        for kind, n in sorted(kinds.items())
    )
    out.append(_fill(_table("kind", "inputs", "records", "unparsed"), rows, width))
    problems = [(i, _input_problems(i)) for i in inputs]
    problems = [(i, p) for i, p in problems if p]
    out.append(
        _bullets(
            " !",
            (
                Text(
                    middle_ellipsis(item.path, max(20, width - 6 - len("; ".join(found))))
                    + ": "
                    + "; ".join(found)
                )
                for item, found in problems[:20]
            ),
            "bold yellow",
        )
    )
    if len(problems) > 20:
        out.append(Text(f"  ... and {len(problems) - 20} more input(s) with problems"))
    out.append(Text("  (every input with its SHA-256: --inputs)", "dim"))
    return out


def render_table(
    report: Report,
    *,
    width: int | None = None,
    colour: bool = False,
    all_runs: bool = False,
    full_inputs: bool = False,
    verdicts: Iterable[str] = (),
    tz: tzinfo | None = None,
) -> str:
    """The audit for a terminal of `width` columns (no line is wider); ANSI colour only when
    `colour`. Runs are listed when their verdict is not no_incident (all with `all_runs`);
    `verdicts` keeps only runs and findings of those verdicts."""
    width = width or DEFAULT_WIDTH
    wanted = set(verdicts)
    if wanted:
        report = report.model_copy(
            update={"findings": [f for f in report.findings if f.category in wanted]}
        )
        shown = [v for v in report.runs if v.verdict in wanted]
        note = f"; shown: {', '.join(sorted(wanted))}"
    elif all_runs:
        shown, note = list(report.runs), ""
    else:
        shown = [v for v in report.runs if v.verdict != "no_incident"]
        note = "; no_incident runs not listed (--all-runs)" if shown != report.runs else ""
    summary = report.summary
    parts: list = [
        Text(
            f"{report.generated_by}: {len(report.inputs)} input(s), {summary.runs} run(s), "
            f"{summary.findings} finding(s), {summary.victims} healthy replica(s) killed"
        ),
        Text(""),
        *_findings(report, tz, width),
        *_groups(report, width),
        *_runs(report, shown, note, width),
    ]
    if report.limitations:
        parts += [Text(""), Text("LIMITATIONS (what the evidence cannot show)", "bold")]
        parts.append(
            _bullets(
                "-",
                (
                    Text(f"[{lim.code}] {lim.message} ({middle_ellipsis(lim.source, width - 6)})")
                    for lim in report.limitations
                ),
            )
        )
    parts += _inputs(report, full_inputs, width)
    if report.findings:
        parts += [
            Text(""),
            Text(
                "Details: --format markdown or json; a run's story: "
                "dstack-audit timeline RUN SOURCE...",
                "dim",
            ),
        ]
    buffer = io.StringIO()
    console = terminal_console(buffer, width=width, colour=colour, color_system="standard")
    console.print(Group(*parts))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
