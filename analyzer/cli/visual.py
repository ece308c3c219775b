"""The picture commands: `dstack-audit plot` (a run's swimlane or the fleet charts) and
`dstack-audit report` (the self-contained HTML report, or markdown with PNGs beside it).

`register(main)` adds them to the `dstack-audit` click group; calling it twice is harmless.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import click

from analyzer.cli.options import (
    clean_errors,
    format_option,
    log_options,
    open_audit,
    output_format,
    run_selection_options,
    source_token_option,
    sources_argument,
    tz_option,
    ui_options,
    wrote,
)

PLOT_FORMATS = ("png", "svg", "pdf")
MAX_PLOTS = 20
REPORT_FORMATS = ("html", "markdown")


def _only_images(folder: Path) -> bool:
    """An earlier markdown report's image folder (PNGs only): replaced whole by the new one."""
    return all(p.is_file() and p.suffix == ".png" for p in folder.iterdir())


def register(main: click.Group) -> None:
    """Add `plot` and `report` to `main` (once)."""
    if "plot" in main.commands and "report" in main.commands:
        return

    @click.command("plot", short_help="Draw a run's swimlane, or the fleet-wide charts.")
    @click.argument("args", nargs=-1, required=True, metavar="RUN SOURCE...")
    @click.option(
        "--output",
        "-o",
        required=True,
        type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
        help="The picture to write: FILE.png, FILE.svg or FILE.pdf (- is standard output).",
    )
    @format_option(PLOT_FORMATS, None)
    @click.option("--project", help="The run's project (when several projects have the name).")
    @tz_option
    @click.option(
        "--fleet",
        is_flag=True,
        help="Plot the fleet-wide charts instead of a run (then every argument is a SOURCE).",
    )
    @click.option(
        "--dpi",
        type=click.IntRange(50, 600),
        default=110,
        show_default=True,
        help="The picture's resolution in dots per inch (PNG).",
    )
    @log_options
    @source_token_option
    @ui_options
    @clean_errors
    def plot(
        args: tuple[str, ...],
        output: Path,
        fmt: str | None,
        project: str | None,
        tz: str | None,
        fleet: bool,
        dpi: int,
        log_tz: str | None,
        log_date: Any,
    ) -> None:
        """Draw RUN's swimlane: one lane per job submission grouped by deployment, status
        bars, the healthy interval, markers for the update, the culprit's failure, the run
        going TERMINATING and each victim's stop, and the serving capacity with the outage.

        RUN is a run name, project/name or a run id prefix (add --project when several
        projects have a run of that name). With --fleet: incidents per day, outage and cost by
        project and fleet, failure classes.

        \b
        Exit status: 0 drawn, 2 unusable input, no such run or wrong usage.
        """
        from analyzer.outputs import plan
        from analyzer.render.format import resolve_zone
        from analyzer.render.plots import figure_bytes, plot_fleet, plot_run

        fmt = output_format(fmt, output, PLOT_FORMATS, None, "plot")
        resolve_zone(tz)
        if fleet:
            outputs = plan(args, files=(output,))
            opened = open_audit(args, log_tz, log_date, project=project)
            outputs.add_inputs(i.path for i in opened.evidence.inputs)
            fig = plot_fleet(opened.report)
        else:
            if len(args) < 2:
                raise click.UsageError("give RUN and at least one SOURCE (or --fleet)")
            run, sources = args[0], args[1:]
            outputs = plan(sources, files=(output,))
            opened = open_audit(sources, log_tz, log_date, project=project, run=run)
            outputs.add_inputs(i.path for i in opened.evidence.inputs)
            fig = plot_run(opened, run, tz=tz)
        outputs.write_bytes(output, figure_bytes(fig, fmt, dpi=dpi))
        wrote(output)

    @click.command(
        "report", short_help="Write the incident report of SOURCE..., in HTML or markdown."
    )
    @sources_argument
    @click.option(
        "--output",
        "-o",
        required=True,
        type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
        help="FILE.html (one self-contained file) or FILE.md (PNGs in FILE-images/ beside it); "
        "- writes the HTML to standard output.",
    )
    @format_option(REPORT_FORMATS, None)
    @click.option(
        "--max-plots",
        type=click.IntRange(min=0),
        default=MAX_PLOTS,
        show_default=True,
        help="Draw swimlanes for the worst N findings' runs (the rest are listed with their "
        "evidence, without a picture).",
    )
    @tz_option
    @run_selection_options
    @click.option(
        "--force", is_flag=True, help="Replace FILE-images/ whole even when it holds other files."
    )
    @log_options
    @source_token_option
    @ui_options
    @clean_errors
    def report(
        sources: tuple[str, ...],
        output: Path,
        fmt: str | None,
        max_plots: int,
        tz: str | None,
        project: str | None,
        run: str | None,
        since: datetime | None,
        until: datetime | None,
        force: bool,
        log_tz: str | None,
        log_date: Any,
    ) -> None:
        """Write the incident report of SOURCE...: the inputs' SHA-256, a summary, every finding
        with its story, swimlane, evidence chain, impact and counterfactuals, the run verdicts
        and the limitations. HTML opens offline and fetches nothing.

        \b
        Exit status: 0 written, 2 unusable input or wrong usage.
        """
        from analyzer.outputs import plan
        from analyzer.render.format import resolve_zone
        from analyzer.render.html import render_html, render_report_markdown

        fmt = output_format(fmt, output, REPORT_FORMATS, None, "report")
        if fmt == "markdown" and str(output) == "-":
            raise click.BadParameter(
                "a markdown report needs a file (its PNGs go beside it)", param_hint="'--output'"
            )
        resolve_zone(tz)
        images = output.with_name(f"{output.stem}-images")
        outputs = plan(sources, files=(output,))
        if fmt == "markdown":
            outputs.folder(images, force=force, replaceable=_only_images)
        opened = open_audit(
            sources,
            log_tz,
            log_date,
            project=project,
            run=run,
            since=since,
            until=until,
        )
        outputs.add_inputs(i.path for i in opened.evidence.inputs)
        if fmt == "html":
            outputs.write_text(output, render_html(opened, tz=tz, max_plots=max_plots))
        else:
            with outputs.build(images, drop_if_empty=True) as staging:
                text = render_report_markdown(
                    opened, tz=tz, image_dir=staging, image_link=images.name, max_plots=max_plots
                )
                outputs.write_text(output, text)
        wrote(output)

    for command in (plot, report):
        if command.name not in main.commands:
            main.add_command(command)
