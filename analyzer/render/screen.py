"""The terminal view of an audit (`--format table`): findings first, then the runs that need a
look, limitations and a summary of the inputs, laid out by rich to the terminal's width.

Columns shrink and wrap at spaces (never inside a word, as long as the word fits the column),
paths are shortened in the middle (the file name stays), and a finding's details fold under
its headline inside one cell instead of widening the table.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import tzinfo

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from analyzer.contract import Finding, InputRecord, Report, RunVerdict
from analyzer.render.format import (
    EXPOSURE_NOW,
    GROUP_HEADERS,
    GUARD_HOW,
    cost_text,
    fmt_time,
    group_rows,
    outage_text,
    prevention,
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


KEEP = "\u00a0"  # joins a figure's parts while its line is wrapped, so a figure never breaks
FINDING_ROOM = 30  # the narrowest finding column beside the impact; narrower: impact below
MESSAGE_ROOM = 100  # a culprit's message in the table: one line (the whole text: timeline, reports)


def whole(text: str) -> str:
    """`text` (a figure, a time, an id) kept on one line when the line holding it wraps."""
    return text.replace(" ", KEEP)


def wrapped(text: str, width: int, indent: str = "  ") -> str:
    """`text` wrapped at spaces to `width` columns, a figure made `whole` never split."""
    lines = textwrap.wrap(
        text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return "\n".join(lines or [text]).replace(KEEP, " ")


def one_line(message: str, room: int = MESSAGE_ROOM) -> str:
    """A message as one line of at most `room` columns: its first line, cut at a word with "…"
    when longer (a cloud's no-capacity error runs to many lines); the whole text is in
    `timeline`, the reports and the JSON."""
    text = message.strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if len(first) > room:
        first = first[: room - 2].rsplit(" ", 1)[0]
    return first if first == text else first + " …"


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
    words instead of splitting one (only a word wider than the screen allows is folded). A
    column of fixed width keeps it."""
    words = [len(c.header) for c in table.columns]
    for row in rows:
        cells = [c if isinstance(c, Text) else Text(str(c)) for c in row]
        for i, cell in enumerate(cells):
            words[i] = max([words[i], *(len(w) for w in cell.plain.split())])
        table.add_row(*cells)
    fixed = [i for i, column in enumerate(table.columns) if column.width is not None]
    room = width - 2 * (len(words) - 1) - sum(words[i] for i in fixed)
    free = [i for i in range(len(words)) if i not in fixed]
    while sum(words[i] for i in free) > room and max(words[i] for i in free) > 8:
        widest = max(free, key=lambda i: words[i])
        words[widest] -= 1
    for i in free:
        table.columns[i].min_width = words[i]
    return table


def _finding_cell(finding: Finding, tz: tzinfo | None) -> Text:
    cell = Text()
    cell.append(finding.category, VERDICT_STYLE.get(finding.category, ""))
    cell.append(f" ({finding.confidence}) ")
    cell.append(_run_label(finding), "bold")
    cell.append(f" {finding.run_id[:8]}", "dim")
    victims = ", ".join(whole(f"{v.job_name} (dep {v.deployment_num})") for v in finding.victims)
    culprits = ", ".join(
        whole(f"{c.job_name} (dep {c.deployment_num})")
        + f": {c.termination_reason}"
        + (f" '{one_line(c.termination_reason_message)}'" if c.termination_reason_message else "")
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
    cell.append("\nguard: ", "dim")
    cell.append(prevention(finding).guard_short)
    return cell


def _impact_lines(finding: Finding, tz: tzinfo | None) -> list[Text]:
    """The impact of a finding, one figure a line (a line is never wrapped inside a figure)."""
    impact = finding.impact
    killed = max((v.terminated_at for v in finding.victims if v.terminated_at), default=None)
    outage = Text.assemble(("outage ", "dim"), whole(outage_text(impact)) if impact else "unknown")
    if impact and impact.outage_seconds is not None and not impact.recovered:
        outage.append(" (not recovered)", "red")
    return [
        Text.assemble(("killed ", "dim"), whole(fmt_time(killed, tz=tz))),
        outage,
        Text.assemble(
            ("lost ", "dim"),
            whole(replica_time_text(impact)) if impact else "unknown",
            " replica-time",
        ),
        Text.assemble(("cost ", "dim"), whole(cost_text(impact)) if impact else "unknown"),
    ]


def _findings(report: Report, tz: tzinfo | None, width: int) -> list:
    if not report.findings:
        why = undecided(report)
        if why is None:
            return [Text("FINDINGS: none", "bold green")]
        if report.summary.runs == 0:
            return [Text(f"FINDINGS: none, but {why}: nothing could be decided", "bold yellow")]
        return [Text(f"FINDINGS: none, but {why}", "bold yellow")]
    table = _findings_table(report.findings, tz, width)
    summary = report.summary
    return [
        Text(
            "FINDINGS, worst first: healthy replicas terminated because another replica's "
            "failure failed the run",
            "bold",
        ),
        table,
        Text(
            wrapped(
                f"IMPACT: {summary.victims} healthy replica(s) killed in {summary.incidents} "
                f"incident(s), outage {whole(outage_text(summary))}, replica-time lost "
                f"{whole(replica_time_text(summary))}, cost {whole(cost_text(summary))} (until "
                "recovery, or until the end of the evidence "
                f"{whole(fmt_time(report.end_of_evidence, tz=tz))})",
                width,
                indent="",
            )
        ),
        Text(
            wrapped(
                f"PREVENT THE NEXT: `{EXPOSURE_NOW}` shows the services exposed now, "
                f"`{GUARD_HOW}` refuses such an update at `dstack apply` (docs/guard.md)",
                width,
                indent="",
            )
        ),
    ]


def _findings_table(findings: Sequence[Finding], tz: tzinfo | None, width: int) -> Table:
    """The findings beside their impact, each impact line whole in a column of its own; when
    that leaves the finding less than FINDING_ROOM columns, the impact goes under the finding
    instead, each figure on its own line: no figure, id or time is ever cut."""
    impacts = [_impact_lines(f, tz) for f in findings]
    number = len(str(len(findings)))
    impact_width = max(len(line.plain) for lines in impacts for line in lines)
    room = width - number - impact_width - 4
    beside = room >= FINDING_ROOM
    table = _table("#", "finding", *(["impact"] if beside else []))
    if beside:
        column = table.columns[2]
        column.no_wrap, column.width = True, impact_width
    else:
        room = width - number - 2
    rows = []
    for n, (finding, lines) in enumerate(zip(findings, impacts, strict=True), 1):
        cell = _finding_cell(finding, tz)
        impact = Text("\n").join(lines)
        if not beside:
            cell.append("\n")
            cell.append(impact)
        rows.append([str(n), _wrap_text(cell, room), impact])
    longest = max(len(line) for row in rows for line in row[1].plain.splitlines())
    table.columns[1].width = min(room, longest)
    return _fill(table, (row if beside else row[:2] for row in rows), width)


def _wrap_text(text: Text, width: int) -> Text:
    """`text` wrapped at its spaces to `width` columns, styles kept (rich would also break a
    figure made `whole`); a word wider than `width` is left for rich to fold."""
    lines = []
    for line in text.split("\n"):
        offsets, start = [], 0
        for word in re.finditer(r"[^ ]+", line.plain):
            if word.end() - start > width and word.start() > start:
                offsets.append(word.start())
                start = word.start()
        for piece in line.divide(offsets):
            piece.rstrip()
            lines.append(piece)
    return Text("\n").join(lines)


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
        widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(GROUP_HEADERS)]
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            table = _fill(_table(*GROUP_HEADERS), rows, width)
        else:  # too narrow for the columns: one line a group, every figure whole
            table = Text(
                "\n".join(
                    wrapped(
                        f"{whole(row[0])}: "
                        + ", ".join(
                            f"{header} {whole(value)}"
                            for header, value in zip(GROUP_HEADERS[1:], row[1:], strict=True)
                        ),
                        width,
                    )
                    for row in rows
                )
            )
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
        problems += [n for n in item.notes if n.startswith("a pg_dump")]
    return problems


def _bullets(mark: str, lines: Iterable[str], width: int, style: str = "") -> Text:
    """Lines with a hanging indent under their mark, wrapped at spaces: a word longer than the
    line (a whole path in a pipe) overruns the width instead of being cut."""
    out = Text(no_wrap=True, overflow="ignore")
    indent = " " * (len(mark) + 1)
    for n, line in enumerate(lines):
        first, *rest = wrapped(line, width - len(indent), indent="").split("\n")
        out.append("\n" if n else "")
        out.append(mark, style)
        out.append(" " + first + "".join("\n" + indent + more for more in rest))
    return out


def _whole(text: str, width: int) -> str:
    return text


def _inputs(
    report: Report, full: bool, width: int, short: Callable[[str, int], str] = middle_ellipsis
) -> list:
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
                Text(short(item.path, path_width), "bold")
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
    skipped = [i.path for i, p in problems if p == ["not recognised"]]
    lines = [
        short(item.path, max(20, width - 6 - len("; ".join(found)))) + ": " + "; ".join(found)
        for item, found in problems
        if found and found != ["not recognised"]
    ]
    if skipped:  # said once: files beside the evidence (manifests, notes) are no problem
        lines.append(f"not recognised, skipped ({len(skipped)}): {', '.join(skipped)}")
    problems = lines
    if lines:
        out.append(_bullets(" !", lines[:20], width, "bold yellow"))
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
    terminal: bool = False,
) -> str:
    """The audit for a terminal of `width` columns (no line is wider); ANSI colour only when
    `colour`. Paths are shortened in the middle on a `terminal` only: a pipe or a file gets
    them whole. Runs are listed when their verdict is not no_incident (all with `all_runs`);
    `verdicts` keeps only runs and findings of those verdicts."""
    width = width or DEFAULT_WIDTH
    short = middle_ellipsis if terminal else _whole
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
        folded = "; in full: --format markdown or json" if terminal else ""
        parts += [Text(""), Text(f"LIMITATIONS (what the evidence cannot show{folded})", "bold")]
        said = (f"[{lim.code}] {lim.message} ({lim.source})" for lim in report.limitations)
        if terminal:  # on a terminal, a line each: the code and how it begins
            said = (one_line(text, width - 2) for text in said)
        parts.append(_bullets("-", said, width))
    parts += _inputs(report, full_inputs, width, short)
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
    console.print(Group(*parts), crop=False)
    shown = buffer.getvalue().replace(KEEP, " ")
    return "\n".join(line.rstrip() for line in shown.splitlines()) + "\n"
