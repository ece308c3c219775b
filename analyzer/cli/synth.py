"""`dstack-audit synth`: a synthetic dstack server, for benchmarks and fleet-scale tests (the
'synth' extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from analyzer.cli.options import clean_errors, ui_options


@click.command(short_help="Generate a synthetic dstack server, for benchmarks and tests.")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--runs", default=1000, show_default=True, help="How many runs to generate.")
@click.option("--seed", default=0, show_default=True, help="Random seed (same seed, same bytes).")
@click.option(
    "--log-tz",
    default="UTC",
    show_default=True,
    help="Local zone the generated logs are written in.",
)
@click.option("--rich-width", default=80, show_default=True, help="Console width of the rich log.")
@click.option("--force", is_flag=True, help="Replace a non-empty OUT whole.")
@ui_options
@clean_errors
def synth(out: Path, runs: int, seed: int, log_tz: str, rich_width: int, force: bool) -> None:
    """Generate a synthetic dstack server in OUT: server.db (dstack 0.22.5's schema), its logs in
    the three formats, and the truth.json of every run (for benchmarks and fleet-scale tests).
    Needs the 'synth' extra: pip install 'dstack-audit[synth]'.

    \b
    Exit status: 0 written, 2 wrong usage or the extra missing.
    """
    try:
        from analyzer.synth import synthesize
        from analyzer.synth.templates import Templates
    except ModuleNotFoundError as missing:
        if missing.name != "numpy":
            raise
        click.echo(
            "dstack-audit: synth needs the 'synth' extra (numpy): "
            "pip install 'dstack-audit[synth]'",
            err=True,
        )
        sys.exit(2)
    from analyzer.outputs import plan

    templates = Templates()
    outputs = plan([templates.root], folders=(out,), force=force)  # never over a folder kept
    with outputs.build(out) as folder:  # written beside OUT, which it replaces once complete
        summary = synthesize(
            folder, runs=runs, seed=seed, log_tz=log_tz, rich_width=rich_width, templates=templates
        )
    click.echo(
        f"wrote {summary.runs} runs, {summary.rows.get('jobs', 0)} jobs, "
        f"{summary.rows.get('events', 0)} events and {summary.log_records} log records per "
        f"format to {out} in {summary.seconds:.1f}s"
    )


def register(cli: click.Group) -> None:
    """Add `synth` to `cli`."""
    cli.add_command(synth)
