"""`dstack-audit exposure`: which running services the next failed rollout would take down.

`register(main)` adds the command to the `dstack-audit` click group.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from analyzer.cli.options import clean_errors

DATETIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f"]


def render_table(report) -> str:
    """One block per service: the verdicts, then the facts behind them."""
    when = f"{report.as_of:%Y-%m-%d %H:%M:%S} UTC" if report.as_of else "unknown (no evidence)"
    lines = [f"Exposure as of {when}: {len(report.services)} running service(s)", ""]
    for s in report.services:
        lines.append(
            f"{s.project or '-'}/{s.run_name} ({s.run_id[:8]}): exposed {s.exposed}, "
            f"surge capacity {s.surge_capacity}, {s.healthy_replicas} healthy replica(s) at "
            f"stake, {s.past_incidents} past incident(s)"
        )
        lines.append(
            f"  replicas: {s.active_replicas} active, {s.desired_replicas} desired; "
            f"resources: {'; '.join(s.resources) or 'unknown'}"
        )
        for fleet in s.fleets:
            held = ", ".join(f"{i.instance_name} {i.state} {i.blocks}" for i in fleet.instances)
            lines.append(
                f"  fleet {fleet.fleet_name}: nodes {fleet.nodes}, {fleet.active_instances} "
                f"instance(s) at T ({held or 'none'})"
            )
        lines.extend(f"  - {reason}" for reason in s.reasons)
        lines.append(f"  recommendation: {s.recommendation}")
        lines.append("")
    lines.extend(f"limitation: {lim.message} ({lim.source})" for lim in report.limitations)
    return "\n".join(lines) + "\n"


def render_markdown(report) -> str:
    """Every data value (names, reasons, limitations) inert markdown (md_text)."""
    from analyzer.render.markdown import md_text

    when = f"{report.as_of:%Y-%m-%d %H:%M:%S} UTC" if report.as_of else "unknown"
    lines = [
        f"# Exposure as of {when}",
        "",
        "| service | exposed | surge capacity | healthy replicas | fleets | past incidents | "
        "recommendation |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in report.services:
        fleets = ", ".join(f"{f.fleet_name} ({f.active_instances} of {f.nodes})" for f in s.fleets)
        lines.append(
            f"| {md_text(s.project or '-')}/{md_text(s.run_name)} | {md_text(s.exposed)} | "
            f"{md_text(s.surge_capacity)} | {s.healthy_replicas} | {md_text(fleets or '-')} | "
            f"{s.past_incidents} | {md_text(s.recommendation)} |"
        )
    for s in report.services:
        lines.extend(["", f"## {md_text(s.project or '-')}/{md_text(s.run_name)}", ""])
        lines.extend(f"- {md_text(reason)}" for reason in s.reasons)
    if report.limitations:
        lines.extend(["", "## Limitations", ""])
        lines.extend(
            f"- {md_text(lim.message)} ({md_text(lim.source)})" for lim in report.limitations
        )
    return "\n".join(lines) + "\n"


RENDERERS = {
    "table": render_table,
    "markdown": render_markdown,
    "json": lambda report: report.model_dump_json(indent=2) + "\n",
}


def register(main: click.Group) -> None:
    @main.command()
    @click.argument("sources", nargs=-1, required=True)
    @click.option(
        "--as-of",
        type=click.DateTime(formats=DATETIME_FORMATS),
        help="The UTC moment to assess (default: the end of the evidence).",
    )
    @click.option(
        "--format",
        "fmt",
        type=click.Choice(sorted(RENDERERS)),
        default="table",
        show_default=True,
        help="Output format.",
    )
    @click.option(
        "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE."
    )
    @click.option(
        "--fail-on-exposed", is_flag=True, help="Exit 1 when any running service is exposed."
    )
    @clean_errors
    def exposure(
        sources: tuple[str, ...],
        as_of: datetime | None,
        fmt: str,
        output: Path | None,
        fail_on_exposed: bool,
    ) -> None:
        """For every service running at --as-of: would a failed rollout take its healthy
        replicas down (dstack #4186, by release), and is there room for the surge replica?

        Exit status: 0 done, 1 with --fail-on-exposed when a service is exposed, 2 unusable
        input.
        """
        from analyzer.api import open_sources
        from analyzer.pipeline.exposure import exposure_report

        opened = open_sources(sources)
        report = exposure_report(opened, as_of.replace(tzinfo=UTC) if as_of else None)
        text = opened.redact(RENDERERS[fmt](report))
        if output is None:
            click.echo(text, nl=False)
        else:
            output.write_text(text, encoding="utf-8")
        if fail_on_exposed and any(s.exposed == "yes" for s in report.services):
            sys.exit(1)
