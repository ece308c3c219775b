"""`dstack-audit exposure`: which running services the next failed rollout would take down.

`register(main)` adds the command to the `dstack-audit` click group.
"""

from __future__ import annotations

import sys
import textwrap
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

import click

from analyzer.cli.options import (
    IsoTime,
    clean_errors,
    format_option,
    log_options,
    open_audit,
    output_format,
    output_option,
    screen_width,
    source_token_option,
    sources_argument,
    time_zone,
    tz_option,
    ui_options,
    width_option,
    wrote,
)

EXPOSURE_FORMATS = ("table", "markdown", "json")


def _when(report, tz: tzinfo | None) -> str:
    from analyzer.render.format import fmt_time

    return fmt_time(report.as_of, tz=tz) if report.as_of else "unknown (no evidence)"


def _fitted(line: str, width: int, indent: str) -> list[str]:
    """`line` wrapped at words to `width` columns, its continuations under `indent` (a word
    longer than the line, such as a path, stays whole)."""
    return textwrap.wrap(
        line,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [line]


def _now_if_live(sources: tuple[str, ...], opened: Any) -> datetime | None:
    """A live server is assessed as of now (it was just asked), not as of the last moment its
    answers record; never before that moment (a server whose clock is behind its records)."""
    from datetime import UTC

    from analyzer.sources.live import LIVE_URL

    if not any(LIVE_URL.match(source) for source in sources):
        return None
    now = datetime.now(UTC)
    end = opened.end_of_evidence
    return now if end is None or now > end else end


def render_table(report, *, width: int = 100, tz: tzinfo | None = None) -> str:
    """One block per service: the verdicts, then the facts behind them, fitted to `width`."""
    blocks: list[tuple[str, str]] = [
        (f"Exposure as of {_when(report, tz)}: {len(report.services)} running service(s)", ""),
        ("", ""),
    ]
    for s in report.services:
        blocks.append(
            (
                f"{s.project or '-'}/{s.run_name} ({s.run_id[:8]}): exposed {s.exposed}, "
                f"surge capacity {s.surge_capacity}, {s.healthy_replicas} healthy replica(s) at "
                f"stake, {s.past_incidents} past incident(s)",
                "  ",
            )
        )
        blocks.append(
            (
                f"  replicas: {s.active_replicas} active, {s.desired_replicas} desired; "
                f"resources: {'; '.join(s.resources) or 'unknown'}",
                "    ",
            )
        )
        for fleet in s.fleets:
            held = ", ".join(f"{i.instance_name} {i.state} {i.blocks}" for i in fleet.instances)
            blocks.append(
                (
                    f"  fleet {fleet.fleet_name}: nodes {fleet.nodes}, {fleet.active_instances} "
                    f"instance(s) at T ({held or 'none'})",
                    "    ",
                )
            )
        blocks.extend((f"  - {reason}", "    ") for reason in s.reasons)
        blocks.append((f"  recommendation: {s.recommendation}", "    "))
        blocks.append(("", ""))
    blocks.extend((f"limitation: {lim.message} ({lim.source})", "  ") for lim in report.limitations)
    return "\n".join(out for line, indent in blocks for out in _fitted(line, width, indent)) + "\n"


def render_markdown(report, *, tz: tzinfo | None = None) -> str:
    """Every data value (names, reasons, limitations) inert markdown (md_text)."""
    from analyzer.render.markdown import md_text

    lines = [
        f"# Exposure as of {_when(report, tz)}",
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
    "json": lambda report, **_: report.model_dump_json(indent=2) + "\n",
}


def register(main: click.Group) -> None:
    @main.command(short_help="Find running services a failed rollout would take down.")
    @sources_argument
    @click.option(
        "--as-of",
        type=IsoTime(),
        help="The moment to assess (ISO 8601; UTC without a zone; default: the end of the "
        "evidence).",
    )
    @click.option("--project", help="Only runs of this project.")
    @format_option(EXPOSURE_FORMATS, "table")
    @output_option("Write to FILE (- is standard output).")
    @click.option(
        "--fail-on-exposed", is_flag=True, help="Exit 1 when any running service is exposed."
    )
    @tz_option
    @width_option
    @log_options
    @source_token_option
    @ui_options
    @clean_errors
    def exposure(
        sources: tuple[str, ...],
        as_of: datetime | None,
        project: str | None,
        fmt: str | None,
        output: Path | None,
        fail_on_exposed: bool,
        tz: str | None,
        width: int | None,
        log_tz: str | None,
        log_date: Any,
    ) -> None:
        """Find running services a failed rollout would take down (dstack #4186).

        For every service running at --as-of: would a failed rollout take its healthy replicas
        down (by dstack release), and is there room for the surge replica?

        \b
        Exit status: 0 done, 1 with --fail-on-exposed when a service is exposed,
        2 unusable input or wrong usage.
        """
        from analyzer.outputs import plan
        from analyzer.pipeline.exposure import exposure_report

        outputs = plan(sources, files=(output,))
        fmt = output_format(fmt, output, EXPOSURE_FORMATS, "table", "exposure")
        zone = time_zone(tz)
        opened = open_audit(sources, log_tz, log_date, project=project)
        outputs.add_inputs(i.path for i in opened.evidence.inputs)
        report = exposure_report(opened, as_of or _now_if_live(sources, opened))
        if fmt == "table":
            text = render_table(report, width=screen_width(output, width), tz=zone)
        else:
            text = RENDERERS[fmt](report, tz=zone)
        outputs.write_text(output, opened.redact(text))
        wrote(output)
        if fail_on_exposed and any(s.exposed == "yes" for s in report.services):
            sys.exit(1)
