"""`dstack-audit timeline`: one run's deployments, replica slots, submissions and events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from analyzer.cli.options import (
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

TIMELINE_FORMATS = ("text", "json", "jsonl", "csv", "timesketch")


@click.command(short_help="Print a run's timeline: deployments, replicas and events.")
@click.argument("run")
@sources_argument
@click.option("--project", help="The run's project, when several projects have a run of that name.")
@output_option("Write to FILE (- is standard output); its extension picks the format.")
@format_option(TIMELINE_FORMATS, "text")
@click.option("--sources", "show_sources", is_flag=True, help="List each line's provenance.")
@width_option
@tz_option
@log_options
@source_token_option
@ui_options
@clean_errors
def timeline(
    run: str,
    sources: tuple[str, ...],
    project: str | None,
    output: Path | None,
    fmt: str | None,
    show_sources: bool,
    width: int | None,
    tz: str | None,
    log_tz: str | None,
    log_date: Any,
) -> None:
    """Print RUN's timeline: deployments, replica slots, every submission, every event.

    RUN is a run name, project/name or a run id prefix (add --project when several projects
    have a run of that name). The same event seen in several sources is one line; victims and
    culprits are marked.

    \b
    Exit status: 0 printed, 2 unusable input, no such run or several runs match.
    """
    import polars as pl

    from analyzer.outputs import plan
    from analyzer.pipeline.selectors import one_run
    from analyzer.render.text import render_timeline
    from analyzer.render.timeline_view import export, merged_events, roles

    outputs = plan(sources, files=(output,))
    fmt = output_format(fmt, output, TIMELINE_FORMATS, "text", "timeline")
    zone = time_zone(tz)
    opened = open_audit(sources, log_tz, log_date, project=project, run=run)
    outputs.add_inputs(i.path for i in opened.evidence.inputs)
    row = one_run(opened.runs, run)
    key = (pl.col("server") == row["server"]) & (pl.col("run_id") == row["run_id"])
    verdict = next((v.verdict for v in opened.verdicts if v.run_id == row["run_id"]), None)
    found = [f for f in opened.findings if (f.server, f.run_id) == (row["server"], row["run_id"])]
    marked = roles(found)
    events = opened.events.filter(key)
    if fmt == "text":
        text = render_timeline(
            row,
            verdict,
            opened.deployments.filter(key),
            opened.submissions.filter(key),
            events,
            width=screen_width(output, width),
            sources=show_sources,
            roles=marked,
            findings=found,
            tz=zone,
        )
    else:
        text = export(row, merged_events(events, marked), fmt)
    outputs.write_text(output, opened.redact(text))
    wrote(output)


def register(cli: click.Group) -> None:
    """Add `timeline` to `cli`."""
    cli.add_command(timeline)
