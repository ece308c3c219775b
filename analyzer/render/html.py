"""The incident report as one self-contained HTML file (and its markdown twin).

Everything is inside the file: CSS inline, figures as base64 SVG `data:` URIs, no script, no
font, no link; a Content-Security-Policy forbids fetching anything, so the report opens offline
and cannot call out. Every piece of text is escaped; the whole document (all but the image
payloads, which are pictures of already-redacted text) passes through `audit.redact` last.

Layout: a first page (what was audited: inputs and their SHA-256, tool version, end of the
evidence, display zone), a summary, the findings worst first (each with a generated narrative,
the swimlane, victims and culprits, the evidence chain with provenance, impact,
counterfactuals and root cause), the run verdicts, the limitations and the models.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from analyzer.contract import Finding, GroupSummary, Report
from analyzer.progress import stage
from analyzer.render.format import (
    GROUP_HEADERS,
    Clock,
    cost_text,
    fmt_bound,
    fmt_cost,
    group_rows,
    outage_text,
    prevention,
    replica_time_text,
    resolve_zone,
)
from analyzer.render.markdown import md_code, md_text, render_markdown
from analyzer.render.narrative import RunFrames, incident_facts, narrative, run_label

IMAGE_DPI = 100


def _plots() -> ModuleType:
    """The drawing module, imported when a picture is drawn (matplotlib is slow to import)."""
    from analyzer.render import plots

    return plots


def _swimlane_svg(audit: Any, finding: Finding, tz: str | None, frames: RunFrames) -> str:
    """A run's swimlane as SVG text, written without matplotlib's layout (plots/svg.py),
    from the run's story as the report told it."""
    from analyzer.render.plots.svg import run_svg

    return run_svg(audit, finding.run_id, tz=tz, story=frames.story(finding))


def figure_bytes(fig: Any, fmt: str = "png", *, dpi: int = IMAGE_DPI) -> bytes:
    """A picture of the report as file bytes (plots.figure_bytes, imported when drawing)."""
    return _plots().figure_bytes(fig, fmt, dpi=dpi)


# ---------------------------------------------------------------------------------------------
# HTML pieces


CSS = """
:root { --ink:#1d1d1f; --muted:#5f6368; --line:#d9dce1; --band:#f4f6f9; --bad:#b2182b;
        --victim:#7b3294; --culprit:#d7301f; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Arial, sans-serif;
       color: var(--ink); margin: 0; background: #fff; }
main { max-width: 1440px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px;
     border-bottom: 2px solid var(--line); }
h3 { font-size: 17px; margin: 28px 0 8px; }
h4 { font-size: 14px; margin: 18px 0 6px; text-transform: uppercase; letter-spacing: .04em;
     color: var(--muted); }
p { margin: 6px 0 10px; }
code, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 14px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 7px; text-align: left; vertical-align: top; }
th { background: var(--band); font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
td.time { white-space: nowrap; }
.sha { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 11px;
       word-break: break-all; }
table.inputs { table-layout: fixed; font-size: 12px; }
table.inputs td { padding: 2px 6px; word-break: break-word; }
table.inputs col.path { width: 34%; } table.inputs col.kind { width: 12%; }
table.inputs col.ver { width: 7%; } table.inputs col.n { width: 6.5%; }
table.inputs col.sha { width: 35%; }
.cover { border: 1px solid var(--line); border-radius: 6px; padding: 18px 22px;
         background: var(--band); }
.cover dl { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 10px 0; }
.cover dt { color: var(--muted); }
.cover dd { margin: 0; }
.lead { font-size: 15px; }
.narrative { font-size: 15px; background: #fff8f0; border-left: 4px solid #e66101;
             padding: 10px 14px; }
.finding { border-top: 1px solid var(--line); margin-top: 26px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; background: #e8eaed; color: var(--ink); white-space: nowrap; }
.badge.collateral_termination, .badge.same_deployment_collateral { background: #fde0dd;
  color: var(--bad); }
.badge.no_incident { background: #e5f5e0; color: #1a7837; }
.badge.inconclusive { background: #fff3bf; color: #7a5b00; }
.victim { color: var(--victim); font-weight: 600; white-space: nowrap; }
.culprit { color: var(--culprit); font-weight: 600; white-space: nowrap; }
table.compact { width: auto; min-width: 40%; }
.finding:first-of-type { border-top: none; }
figure { margin: 12px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 12.5px; margin-top: 4px; }
.prov { margin: 0; padding-left: 16px; font-size: 11.5px; color: var(--muted); }
.prov li { word-break: break-all; }
details summary { cursor: pointer; color: var(--muted); font-size: 12px; }
.muted { color: var(--muted); }
.kpis { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0 6px; }
.kpi { border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 150px; }
.kpi b { display: block; font-size: 20px; }
nav ol { margin: 4px 0; }
@media print {
  .cover { page-break-after: always; break-after: page; }
  .finding { page-break-before: always; break-before: page; }
  main { max-width: none; padding: 0; }
  details > *:not(summary) { display: block; }
}
"""

CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'"
)


def _e(value: object) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _code_spans(text: str) -> str:
    """Escape `text`, then turn `backticks` into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    classes: dict[int, str] | None = None,
    css: str | None = None,
    cols: Sequence[str] | None = None,
) -> str:
    classes = classes or {}
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            cell_css = classes.get(i)
            raw = value if isinstance(value, _Raw) else _e(value)
            cells.append(f'<td class="{cell_css}">{raw}</td>' if cell_css else f"<td>{raw}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    group = (
        "<colgroup>" + "".join(f'<col class="{_e(c)}">' for c in cols) + "</colgroup>"
        if cols
        else ""
    )
    attr = f' class="{_e(css)}"' if css else ""
    return (
        f"<table{attr}>{group}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


class _Raw(str):
    """Already-escaped HTML for a table cell."""


class _Images:
    """Figures kept out of the text until the text is redacted; then put in as data: URIs (SVG
    text: a vector picture the browser lays out, drawn in milliseconds, issue 38)."""

    def __init__(self) -> None:
        self.payloads: list[str] = []

    def add(self, svg: str, alt: str) -> str:
        """An SVG picture, written without matplotlib (plots/svg.py, plots/fleet_svg.py)."""
        data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
        self.payloads.append(f"data:image/svg+xml;base64,{data}")
        return f'<img src="@@DSTACK-AUDIT-IMAGE-{len(self.payloads) - 1}@@" alt="{_e(alt)}">'

    def fill(self, text: str) -> str:
        return re.sub(
            r"@@DSTACK-AUDIT-IMAGE-(\d+)@@", lambda m: self.payloads[int(m.group(1))], text
        )


def _groups_table(groups: Sequence[GroupSummary]) -> str:
    return _table(
        GROUP_HEADERS,
        group_rows(groups),
        classes={1: "num", 2: "num", 3: "num", 4: "num", 5: "num"},
        css="compact",
    )


def _time_cell(clock: Clock, value: datetime | None) -> str:
    return clock.full(value, ms=True) if value is not None else "-"


def _no_hash(item: Any) -> str:
    if item.kind == "unrecognised":
        return "not hashed: not recognised, so not read"
    return "not hashed: not a file (a URL or standard input)"


def _appendix(report: Report) -> str:
    inputs = _table(
        ["path", "kind", "version", "records", "unparsed", "SHA-256"],
        [
            [
                i.path,
                i.kind,
                i.server_version,
                i.records,
                i.unparsed,
                _Raw(f'<span class="sha">{_e(i.sha256 or _no_hash(i))}</span>'),
            ]
            for i in report.inputs
        ],
        classes={3: "num", 4: "num"},
        css="inputs",
        cols=["path", "kind", "ver", "n", "n", "sha"],
    )
    return (
        '<section id="appendix"><h2>Appendix: inputs and their SHA-256</h2>'
        f"<p>{len(report.inputs)} input(s), opened read-only; the SHA-256 of each file as read."
        f'</p><div id="inputs">{inputs}</div></section>'
    )


def _cover(report: Report, clock: Clock, audit: Any, tz: str | None, frames: RunFrames) -> str:
    end = report.end_of_evidence
    scope = []
    for name in ("project", "run", "since", "until"):
        value = getattr(audit, name, None)
        if value:
            scope.append(f"{name} = {value}")
    story = ""
    if report.findings:
        worst = report.findings[0]
        story = (
            f'<div id="what-happened"><h2>What happened</h2><p class="narrative story">'
            f"<b>{_e(run_label(worst))}</b>: "
            f"{_code_spans(narrative(audit, worst, tz=tz, frames=frames))}</p>"
            + (
                f'<p class="muted">The worst of {len(report.findings)} findings; every one is '
                'listed below (<a href="#findings">findings</a>).</p>'
                if len(report.findings) > 1
                else ""
            )
            + "</div>"
        )
    zone = clock.zone_label(end) if end is not None else clock.name
    schema = report.schema_version
    end_text = Clock(clock.zone).full(end, ms=True) if end else "unknown (no dated record)"
    return f"""
<section class="cover" id="cover">
<h1>dstack-audit incident report</h1>
<p class="lead">Healthy dstack service replicas terminated because a replica of a (newer)
deployment failed: {report.summary.findings} finding(s), {report.summary.victims} healthy
replica(s) killed, {report.summary.runs} run(s) audited.</p>
{story}
<dl>
<dt>tool</dt><dd id="tool-version">{_e(report.generated_by)} (report schema {schema})</dd>
<dt>end of the evidence</dt><dd id="end-of-evidence">{_e(end_text)}</dd>
<dt>times shown in</dt><dd>{_e(zone)}</dd>
<dt>scope</dt><dd>{_e("; ".join(scope) or "everything in the inputs")}</dd>
<dt>inputs</dt><dd>{len(report.inputs)}, opened read-only (hashes in the
<a href="#appendix">appendix</a>)</dd>
</dl>
</section>"""


def _summary(report: Report, images: _Images) -> str:
    s = report.summary
    kpis = [
        ("incidents", s.incidents),
        ("findings", s.findings),
        ("healthy replicas killed", s.victims),
        ("outage, summed", outage_text(s)),
        ("replica-time lost", replica_time_text(s)),
        ("cost lost", cost_text(s)),
        ("runs audited", s.runs),
    ]
    out = ['<section id="summary"><h2>Summary</h2><div class="kpis">']
    out += [f'<div class="kpi"><b>{_e(v)}</b>{_e(k)}</div>' for k, v in kpis]
    out.append("</div>")
    out.append(
        "<p>Outage and lost time run until the service served again, or until the end of the "
        "evidence when it did not; a price that is unknown stays unknown (never zero).</p>"
    )
    out.append(
        _table(
            ["verdict", "runs"],
            [
                [_Raw(f'<span class="badge {_e(k)}">{_e(k)}</span>'), v]
                for k, v in sorted(s.by_verdict.items())
            ],
            classes={1: "num"},
            css="compact",
        )
    )
    if report.findings:
        out.append("<h4>findings, worst first</h4><nav><ol>")
        for n, f in enumerate(report.findings, 1):
            out.append(
                f'<li><a href="#finding-{n}">{_e(run_label(f))} (run {_e(f.run_id[:8])})</a>: '
                f'<span class="badge {_e(f.category)}">{_e(f.category)}</span> '
                f"{_e(len(f.victims))} victim(s), outage "
                f"{_e(outage_text(f.impact) if f.impact else 'unknown')}</li>"
            )
        out.append("</ol></nav>")
        runs = {(f.server, f.run_id) for f in report.findings}
        if len(runs) > 1 or len(s.by_day) > 1:
            from analyzer.render.plots.fleet_svg import fleet_svg

            out.append(
                "<figure>"
                + images.add(
                    fleet_svg(report),
                    "fleet-wide charts: incidents per day, outage and cost by "
                    "project and fleet, failure classes",
                )
                + "<figcaption>Fleet-wide: incidents per day, outage time and lost cost by "
                "project and by fleet, culprit failure classes.</figcaption></figure>"
            )
        several = len(report.findings) > 1
        for title, groups in (
            ("by server", s.by_server if len(s.by_server) > 1 else []),
            ("by project", s.by_project),
            ("by fleet", s.by_fleet),
            ("by user who applied the update", s.by_user),
            ("by day (UTC)", s.by_day),
            ("by culprit failure class", s.by_failure_class),
        ):
            if groups and several:
                out.append(f"<h4>{_e(title)}</h4>{_groups_table(groups)}")
    out.append("</section>")
    return "\n".join(out)


def _prevention(n: int, f: Finding) -> str:
    """Could it have been prevented: foreseeable before the update, would the guard have
    refused the update, and how to check the services exposed now."""
    answer = prevention(f)
    return (
        f'<div class="prevention" id="prevention-{n}"><h4>could it have been prevented?</h4><ul>'
        f"<li>foreseeable before the update: {_code_spans(answer.foreseeable)}</li>"
        "<li>would <code>dstack-audit guard</code> have refused the update: "
        f"{_code_spans(answer.guard)}</li>"
        f"<li>check now: {_code_spans(answer.check_now)}</li></ul></div>"
    )


def _finding(
    n: int,
    f: Finding,
    audit: Any,
    tz: str | None,
    images: _Images,
    swimlanes: dict,
    max_plots: int | None,
    step: Any,
    frames: RunFrames,
) -> str:
    clock = incident_facts(audit, f, tz, frames).clock
    out = [
        f'<article class="finding" id="finding-{n}">',
        f'<h3>{n}. {_e(run_label(f))} <span class="muted">run {_e(f.run_id[:8])}</span> '
        f'<span class="badge {_e(f.category)}">{_e(f.category)}</span> '
        f'<span class="badge">{_e(f.confidence)}</span></h3>',
        f'<p class="narrative">{_code_spans(narrative(audit, f, tz=tz, frames=frames))}</p>',
        _prevention(n, f),
        f'<p class="muted">run id <code>{_e(f.run_id)}</code> on server <code>{_e(f.server)}'
        f"</code>; run termination reason <code>{_e(f.run_termination_reason)}</code>"
        + (
            f"; update to deployment {_e(f.update_deployment_num)}"
            + (f" by {_e(f.updated_by)}" if f.updated_by else "")
            + (f", changed <code>{_e(f.changed_fields)}</code>" if f.changed_fields else "")
            if f.update_deployment_num is not None
            else ""
        )
        + "</p>",
    ]
    key = (f.server, f.run_id)
    if key in swimlanes:
        out.append(
            f'<p class="muted">The run\'s swimlane is shown with '
            f'<a href="#finding-{swimlanes[key]}">finding {swimlanes[key]}</a>.</p>'
        )
    elif max_plots is not None and len(swimlanes) >= max_plots:
        out.append(
            f'<p class="muted">No swimlane: pictures are drawn for the worst {max_plots} '
            f"runs (--max-plots); draw this one with <code>dstack-audit plot {_e(f.run_id)} "
            "SOURCE...</code>.</p>"
        )
    else:
        swimlanes[key] = n
        try:
            picture = images.add(
                _swimlane_svg(audit, f, tz, frames),
                f"swimlane of run {run_label(f)}: lanes per job submission by deployment, "
                "status bars, healthy interval hatched, markers, serving capacity and outage",
            )
        except Exception as error:  # a picture must never cost the report
            picture = f'<p class="muted">(no picture: {_e(type(error).__name__)}: {_e(error)})</p>'
        step()
        out.append(
            f"<figure>{picture}<figcaption>The run's lanes, one per job submission, grouped by "
            "deployment; hatched: healthy (serving); numbered markers in time order; below, the "
            "healthy replicas over time with the outage shaded.</figcaption></figure>"
        )
    out.append("<h4>victims (healthy replicas killed)</h4>")
    out.append(
        _table(
            [
                "job",
                "job id",
                "replica",
                "deployment",
                "submission",
                "healthy since",
                "terminated at",
                "proof of health",
            ],
            [
                [
                    _Raw(f'<span class="victim">{_e(v.job_name)}</span>'),
                    _Raw(f"<code>{_e(v.job_id)}</code>"),
                    v.replica_num,
                    v.deployment_num,
                    v.submission_num,
                    _time_cell(clock, v.healthy_since),
                    _time_cell(clock, v.terminated_at),
                    v.health_proof,
                ]
                for v in f.victims
            ],
            classes={5: "time", 6: "time"},
        )
    )
    out.append("<h4>culprits (the failure that failed the run)</h4>")
    out.append(
        _table(
            [
                "job",
                "job id",
                "replica",
                "deployment",
                "submission",
                "reason",
                "message",
                "exit status",
                "failed at",
            ],
            [
                [
                    _Raw(f'<span class="culprit">{_e(c.job_name)}</span>'),
                    _Raw(f"<code>{_e(c.job_id)}</code>"),
                    c.replica_num,
                    c.deployment_num,
                    c.submission_num,
                    c.termination_reason,
                    c.termination_reason_message,
                    c.exit_status,
                    _time_cell(clock, c.failed_at),
                ]
                for c in f.culprits
            ],
            classes={8: "time"},
        )
    )
    if f.also_stopped:
        out.append("<h4>also stopped by the cascade, not victims</h4>")
        out.append(
            _table(
                ["job", "job id", "deployment", "status", "why not a victim"],
                [
                    [
                        o.job_name,
                        _Raw(f"<code>{_e(o.job_id)}</code>"),
                        o.deployment_num,
                        o.status,
                        o.why_not_victim,
                    ]
                    for o in f.also_stopped
                ],
            )
        )
    out.append("<h4>evidence chain, in time order</h4>")
    rows = []
    for item in f.evidence:
        sources = [s for s in item.source.split("; ") if s]
        listed = "".join(f"<li>{_e(s)}</li>" for s in sources[:2])
        more = "".join(f"<li>{_e(s)}</li>" for s in sources[2:])
        prov = f'<ul class="prov">{listed}</ul>'
        if more:
            prov += (
                f"<details><summary>{len(sources) - 2} more source(s) of the same record"
                f'</summary><ul class="prov">{more}</ul></details>'
            )
        rows.append([_time_cell(clock, item.time), item.text, _Raw(prov)])
    out.append(_table(["time", "what", "provenance"], rows, classes={0: "time"}))
    if f.impact:
        i = f.impact
        outage = (
            f"from {_e(_time_cell(clock, i.outage_start))} for {_e(outage_text(i))}, "
            + (
                f"served again at {_e(_time_cell(clock, i.recovered_at))} "
                f"(run <code>{_e(i.recovered_by_run_id)}</code>)"
                if i.recovered
                else "not recovered as of the end of the evidence "
                + _e(_time_cell(clock, i.end_of_evidence))
            )
            if i.outage_start
            else "unknown (the stop times of the victims are not all dated)"
        )
        out.append("<h4>impact</h4><ul>")
        out.append(f"<li>outage: {outage}</li>")
        out += [f"<li>a lower bound: {_e(reason)}</li>" for reason in i.lower_bound_reasons]
        out.append(
            f"<li>{_e(i.replicas_lost)} healthy replica(s) lost, replica-time lost "
            f"{_e(replica_time_text(i))}, cost {_e(cost_text(i))}"
            + (
                f" (price known for {_e(i.cost_known_for)} of {_e(i.replicas_lost)})"
                if i.cost_known_for < i.replicas_lost
                else ""
            )
            + "</li></ul>"
        )
        names = {v.job_id: v.job_name for v in f.victims}
        out.append(
            _table(
                ["victim", "price per hour", "serving time lost", "cost lost"],
                [
                    [
                        names.get(p.job_id, p.job_id),
                        fmt_cost(p.price_per_hour),
                        fmt_bound(p.lost_seconds, p.lost_is_lower_bound),
                        fmt_cost(p.lost_cost, lower_bound=p.lost_is_lower_bound),
                    ]
                    for p in i.per_victim
                ],
                classes={1: "num", 2: "num", 3: "num"},
                css="compact",
            )
        )
    if f.counterfactuals:
        out.append("<h4>what a well-behaved rollout would have done</h4>")
        out.append(
            _table(
                [
                    "model",
                    "parameters",
                    "declared failed at",
                    "rolled back",
                    "old replicas kept",
                    "serving time kept",
                    "why",
                ],
                [
                    [
                        _Raw(f"<code>{_e(c.model)}</code>"),
                        ", ".join(f"{k}={v}" for k, v in c.parameters.items()),
                        _time_cell(clock, c.declared_failed_at) if c.applies else "does not apply",
                        "yes" if c.rolled_back else "no",
                        c.old_replicas_kept,
                        fmt_bound(c.serving_seconds_kept, c.serving_seconds_kept_is_lower_bound),
                        c.explanation,
                    ]
                    for c in f.counterfactuals
                ],
                classes={2: "time", 4: "num", 5: "num"},
            )
        )
    if f.root_cause:
        rc = f.root_cause
        out.append(
            "<h4>root cause</h4>"
            f"<p><code>{_e(rc.failure_class)}</code>: {_e(rc.detail)}; "
            + (f"trigger <code>{_e(rc.trigger_class)}</code>; " if rc.trigger_class else "")
            + "changed fields "
            f"<code>{_e(rc.changed_fields)}</code>; fleets "
            f"{_e(', '.join(rc.fleets) or 'unknown')}</p>"
        )
    if f.notes:
        out.append("<h4>notes</h4><ul>" + "".join(f"<li>{_e(n)}</li>" for n in f.notes) + "</ul>")
    out.append("</article>")
    return "\n".join(out)


def _runs(report: Report) -> str:
    return (
        '<section id="runs"><h2>Run verdicts</h2>'
        + _table(
            ["verdict", "run", "run id", "type", "status", "deployment", "why", "evidence gaps"],
            [
                [
                    _Raw(f'<span class="badge {_e(v.verdict)}">{_e(v.verdict)}</span>'),
                    run_label(v),
                    _Raw(f"<code>{_e(v.run_id)}</code>"),
                    v.run_type,
                    (v.status or "?")
                    + (f" ({v.termination_reason})" if v.termination_reason else "")
                    + (" [in progress]" if v.in_progress else ""),
                    v.deployment_num,
                    v.why,
                    "; ".join(v.gaps) or "-",
                ]
                for v in report.runs
            ],
            classes={5: "num"},
        )
        + "</section>"
    )


def _limitations(report: Report) -> str:
    items = "".join(
        f"<li><code>{_e(lim.code)}</code>: {_e(lim.message)} <span class='muted'>"
        f"({_e(lim.source)})</span></li>"
        for lim in report.limitations
    )
    return (
        '<section id="limitations"><h2>Limitations (what the evidence cannot show)</h2>'
        + (f"<ul>{items}</ul>" if items else "<p>None.</p>")
        + "</section>"
    )


def _models(report: Report) -> str:
    if not report.counterfactual_models:
        return ""
    return (
        '<section id="models"><h2>Counterfactual models</h2>'
        + _table(
            ["model", "parameters", "description"],
            [
                [
                    _Raw(f"<code>{_e(m.name)}</code>"),
                    ", ".join(f"{k}={v}" for k, v in m.parameters.items()),
                    m.description,
                ]
                for m in report.counterfactual_models
            ],
        )
        + "</section>"
    )


def render_html(audit: Any, *, tz: str | None = None, max_plots: int | None = 20) -> str:
    """The whole report as one self-contained HTML document (a string): the incident first,
    inputs and hashes in the appendix; swimlanes (one per run) for the runs of the worst
    `max_plots` findings (None: every run)."""
    clock = Clock(resolve_zone(tz))
    report: Report = audit.report
    images = _Images()
    swimlanes: dict = {}
    runs = len({(f.server, f.run_id) for f in report.findings})
    drawn = runs if max_plots is None else min(runs, max_plots)
    frames = RunFrames(audit, report.findings)
    body = [_cover(report, clock, audit, tz, frames), _summary(report, images)]
    body.append('<section id="findings"><h2>Findings, worst first</h2>')
    if not report.findings:
        body.append(
            "<p>None: no healthy replica was terminated because another replica's failure "
            "failed its run.</p>"
        )
    with stage("drawing the report", total=drawn, unit="swimlanes") as step:
        for n, finding in enumerate(report.findings, 1):
            body.append(_finding(n, finding, audit, tz, images, swimlanes, max_plots, step, frames))
    body.append("</section>")
    body += [_runs(report), _limitations(report), _models(report), _appendix(report)]
    title = (
        f"dstack-audit: {report.summary.findings} finding(s), "
        f"{report.summary.victims} healthy replica(s) killed"
    )
    document = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="{_e(report.generated_by)}">
<title>{_e(title)}</title>
<style>{CSS}</style>
</head>
<body>
<main>
{chr(10).join(body)}
<footer class="muted"><p>Generated by {_e(report.generated_by)} from the inputs listed in the
appendix; self-contained: this file fetches nothing.</p></footer>
</main>
</body>
</html>
"""
    # redact the text, then put the pictures in (their bytes are not text to redact)
    return images.fill(audit.redact(document))


# ---------------------------------------------------------------------------------------------
# Markdown


def render_report_markdown(
    audit: Any,
    tz: str | None = None,
    *,
    image_dir: Path | None = None,
    image_link: str | None = None,
    max_plots: int | None = 20,
) -> str:
    """The same report as markdown: narratives and (when `image_dir` is given) swimlane and
    fleet PNGs written into `image_dir`, linked as `image_link/<name>.png` (default: the
    folder's name, for a markdown file written beside it); then the detailed tables of
    `render_markdown` (times there in UTC)."""
    clock = Clock(resolve_zone(tz))
    report: Report = audit.report
    frames = RunFrames(audit, report.findings)
    s = report.summary
    link = image_link if image_link is not None else (image_dir.name if image_dir else "")
    written: dict[tuple[str, str], str] = {}

    def save(fig: Any, name: str) -> str | None:
        if image_dir is None:
            return None
        image_dir.mkdir(parents=True, exist_ok=True)
        (image_dir / name).write_bytes(figure_bytes(fig, "png", dpi=IMAGE_DPI))
        return f"{link}/{name}" if link else name

    out = [
        "# dstack-audit incident report",
        "",
        f"{report.generated_by}, report schema {report.schema_version}: {s.runs} run(s), "
        f"{s.findings} finding(s), {s.victims} healthy replica(s) killed.",
        "",
        "- end of the evidence: "
        + (
            Clock(clock.zone).full(report.end_of_evidence, ms=True)
            if report.end_of_evidence
            else "unknown"
        ),
        f"- times in the narratives: {clock.zone_label(report.end_of_evidence)}; tables below: UTC",
        f"- inputs: {len(report.inputs)}, each with its SHA-256 in the appendix",
        "",
    ]
    if len({(f.server, f.run_id) for f in report.findings}) > 1 or len(s.by_day) > 1:
        path = save(_plots().plot_fleet(report), "fleet.png")
        if path:
            out += [f"![fleet-wide charts]({path})", ""]
    if report.findings:
        out += ["## What happened", ""]
    for n, finding in enumerate(report.findings, 1):
        out += [
            f"### {n}. {md_text(run_label(finding))} (run {md_text(finding.run_id[:8])}): "
            f"{md_code(finding.category)} "
            f"({finding.confidence})",
            "",
            md_text(narrative(audit, finding, tz=tz, frames=frames), keep_code=True),
            "",
        ]
        key = (finding.server, finding.run_id)
        if key not in written and max_plots is not None and len(written) >= max_plots:
            written[key] = ""
        if key not in written:
            name = (
                f"run-{finding.run_id[:8]}-{re.sub(r'[^A-Za-z0-9_.-]', '_', finding.run_name)}.png"
            )
            try:
                written[key] = save(_plots().plot_run(audit, finding.run_id, tz=tz), name) or ""
            except Exception:  # a picture must never cost the report
                written[key] = ""
        if written[key]:
            out += [f"![swimlane of {md_text(run_label(finding))}]({written[key]})", ""]
    details = render_markdown(report).splitlines()
    first = next((i for i, line in enumerate(details) if line.startswith("## ")), len(details))
    details = [("#" + line if line.startswith("#") else line) for line in details[first:]]
    out += ["## Details", "", *details, "", "## Appendix: inputs and their SHA-256", ""]
    out += ["| input | kind | SHA-256 |", "|---|---|---|"]
    out += [
        f"| {md_text(i.path)} | {md_text(i.kind)} | {md_code(i.sha256 or 'not computed')} |"
        for i in report.inputs
    ]
    return audit.redact("\n".join(out).rstrip("\n") + "\n")
