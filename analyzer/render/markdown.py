"""Markdown rendering of a report: for incident tickets and post-mortems."""

from __future__ import annotations

import re

from analyzer.contract import Report
from analyzer.render.format import (
    GROUP_HEADERS,
    cost_text,
    fmt_bound,
    fmt_time,
    group_rows,
    outage_text,
    prevention,
    replica_time_text,
    undecided,
)

# Markdown's active characters: data (a termination message is the workload's free text) must
# never become raw HTML (`<img onerror=...>`), a link or an image (`[x](javascript:...)`,
# `![x](http://...)`, which a viewer fetches), emphasis, a heading or a table break. Only what
# would change the rendering is escaped, so Slack, Jira and mail show no stray backslashes:
# with `[` and `]` escaped no link or image can form (`!` and `(` stay, but a `(` right after a
# `]`, where a link's target would open), an underscore inside a word is no emphasis
# (`failed_to_start`), a `#` only heads a line.
_ALWAYS = r"\\*\[\]<>|~"
_IN_PLACE = r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|^#|(?<=\])\("
_ACTIVE = re.compile(rf"[{_ALWAYS}`]{_IN_PLACE}")
_ACTIVE_BUT_CODE = re.compile(rf"[{_ALWAYS}]{_IN_PLACE}")


def md_text(value: object, *, keep_code: bool = False) -> str:
    """`value` as inert markdown text: every active character backslash-escaped, bare URLs
    (which GitHub-flavoured viewers turn into links) broken, newlines made spaces.
    `keep_code` leaves backticks alone, for our own texts that mark `code` with them."""
    text = "-" if value is None else str(value)
    text = (_ACTIVE_BUT_CODE if keep_code else _ACTIVE).sub(lambda m: "\\" + m.group(0), text)
    text = re.sub(r"(?i)(?<=[a-z0-9])://", r":\\/\\/", text)
    text = re.sub(r"(?i)\bwww\.", r"www\\.", text)
    return text.replace("\r", " ").replace("\n", " ")


def md_code(value: object) -> str:
    """`value` as a code span that data cannot leave (its backticks become quotes)."""
    text = "-" if value is None else str(value)
    return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _cell(value: object) -> str:
    return md_text(value)


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(report: Report) -> str:
    s = report.summary
    out = [
        "# dstack-audit report",
        "",
        f"{report.generated_by}, report schema {report.schema_version}: {s.runs} run(s), "
        f"{s.findings} finding(s) in {s.incidents} incident(s), {s.victims} healthy replica(s) "
        "killed.",
        "",
        "## Findings",
        "",
    ]
    if not report.findings:
        why = undecided(report)
        out += ["None." if why is None else f"None, but {why}.", ""]
    for n, f in enumerate(report.findings, 1):
        out += [
            f"### {n}. {md_code(f.category)} in {md_text(f.project)}/{md_text(f.run_name)} "
            f"({f.confidence})",
            "",
            f"- run id {md_code(f.run_id)} on server {md_code(f.server)}; run termination reason "
            f"{md_code(f.run_termination_reason)}",
        ]
        if f.update_deployment_num is not None:
            out.append(
                f"- update to deployment {f.update_deployment_num}"
                + (
                    f" by {md_text(f.updated_by)}, changed {md_code(f.changed_fields)}"
                    if f.changed_fields
                    else ""
                )
            )
        out += ["", "Victims:", ""]
        out += _table(
            ["job", "job id", "replica", "deployment", "healthy since", "terminated at", "proof"],
            [
                [
                    v.job_name,
                    v.job_id,
                    v.replica_num,
                    v.deployment_num,
                    fmt_time(v.healthy_since),
                    fmt_time(v.terminated_at),
                    v.health_proof,
                ]
                for v in f.victims
            ],
        )
        out += ["", "Culprits:", ""]
        out += _table(
            ["job", "job id", "replica", "deployment", "reason", "message", "failed at"],
            [
                [
                    c.job_name,
                    c.job_id,
                    c.replica_num,
                    c.deployment_num,
                    c.termination_reason,
                    c.termination_reason_message,
                    fmt_time(c.failed_at),
                ]
                for c in f.culprits
            ],
        )
        if f.also_stopped:
            out += ["", "Also stopped by the cascade, not victims:", ""]
            out += [
                f"- {md_text(o.job_name)} ({md_code(o.job_id)}): {md_text(o.why_not_victim)}"
                for o in f.also_stopped
            ]
        out += ["", "Evidence, in time order:", ""]
        out += _table(
            ["time", "what", "source"],
            [[fmt_time(e.time) if e.time else "-", e.text, e.source] for e in f.evidence],
        )
        if f.impact:
            i = f.impact
            out += [
                "",
                "Impact:",
                "",
                f"- outage from {fmt_time(i.outage_start)} for {md_text(outage_text(i))}"
                + (
                    f", recovered at {fmt_time(i.recovered_at)} "
                    f"(run {md_code(i.recovered_by_run_id)})"
                    if i.recovered
                    else ", not recovered as of the end of the evidence "
                    + fmt_time(i.end_of_evidence)
                ),
                *(f"  - a lower bound: {md_text(reason)}" for reason in i.lower_bound_reasons),
                f"- {i.replicas_lost} healthy replica(s) lost, replica-time lost "
                f"{md_text(replica_time_text(i))}, cost {md_text(cost_text(i))}"
                + (
                    f" (price known for {i.cost_known_for} of {i.replicas_lost})"
                    if i.cost_known_for < i.replicas_lost
                    else ""
                ),
            ]
        if f.root_cause:
            rc = f.root_cause
            out += [
                f"- root cause: {md_code(rc.failure_class)}: {md_text(rc.detail)}; "
                + (f"trigger {md_code(rc.trigger_class)}; " if rc.trigger_class else "")
                + "changed fields "
                f"{md_code(rc.changed_fields)}; fleets {md_text(', '.join(rc.fleets) or 'unknown')}"
            ]
        if f.capacity_foresight:
            cf = f.capacity_foresight
            answer = {True: "yes", False: "no"}.get(cf.foreseeable, "cannot tell")
            out += [
                f"- foreseeable before the update: {answer} (surge capacity "
                f"{md_code(cf.surge_capacity)} as of {fmt_time(cf.as_of)}: "
                f"{md_text(cf.reasons[0] if cf.reasons else 'no facts')})"
            ]
        prevent = prevention(f)
        out += [
            f"- would `dstack-audit guard` have refused the update: "
            f"{md_text(prevent.guard, keep_code=True)}",
            f"- check now: {prevent.check_now}",  # our own words, no data in them
        ]
        if f.counterfactuals:
            out += ["", "What a well-behaved rollout would have done:", ""]
            out += [
                f"- {md_code(c.model)} "
                f"({md_text(', '.join(f'{k}={v}' for k, v in c.parameters.items()))}): "
                + (
                    f"declared failed at {fmt_time(c.declared_failed_at)}; "
                    if c.applies
                    else "does not apply to this sequence; "
                )
                + f"keeps {c.old_replicas_kept} replica(s) serving ("
                + md_text(fmt_bound(c.serving_seconds_kept, c.serving_seconds_kept_is_lower_bound))
                + f" of replica-time); {md_text(c.explanation, keep_code=True)}"
                for c in f.counterfactuals
            ]
        if f.notes:
            out += ["", "Notes:", ""] + [f"- {md_text(note)}" for note in f.notes]
        out.append("")
    if report.findings:
        out += ["## Impact by group", ""]
        for title, groups in (
            ("Server", s.by_server),
            ("Project", s.by_project),
            ("Fleet", s.by_fleet),
            ("User who applied the update", s.by_user),
            ("Day", s.by_day),
            ("Failure class", s.by_failure_class),
        ):
            out += [f"### {title}", ""]
            out += _table(GROUP_HEADERS, group_rows(groups))
            out.append("")
    out += ["## Runs", ""]
    out += _table(
        ["verdict", "project", "run", "run id", "type", "status", "deployment", "why"],
        [
            [
                v.verdict,
                v.project,
                v.run_name,
                v.run_id,
                v.run_type,
                (v.status or "unknown")
                + (f" ({v.termination_reason})" if v.termination_reason else ""),
                v.deployment_num,
                v.why,
            ]
            for v in report.runs
        ],
    )
    out += ["", "## Limitations", ""]
    out += [
        f"- {md_code(lim.code)}: {md_text(lim.message)} ({md_text(lim.source)})"
        for lim in report.limitations
    ] or ["None."]
    out += ["", "## Inputs", ""]
    out += _table(
        ["path", "kind", "server version", "records", "unparsed", "sha256"],
        [
            [i.path, i.kind, i.server_version, i.records, i.unparsed, i.sha256]
            for i in report.inputs
        ],
    )
    return "\n".join(out) + "\n"
