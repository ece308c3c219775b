"""`dstack-audit ingest` and `dstack-audit collect`: write a folder (--to DIR) that the audit
reads later, from files already at hand or from a running server's API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from analyzer.cli.options import (
    clean_errors,
    log_options,
    open_audit,
    source_token_option,
    sources_argument,
    target_option,
    token_option,
    ui_options,
)
from analyzer.errors import AuditInputError


@click.command(short_help="Write SOURCE... as a Parquet dataset partitioned by run.")
@sources_argument
@target_option("Folder to write the dataset to (runs/, jobs/, events/ partitioned by bucket).")
@click.option("--buckets", default=16, show_default=True, help="How many run buckets.")
@click.option("--force", is_flag=True, help="Replace a non-empty --to DIR whole.")
@log_options
@source_token_option
@ui_options
@clean_errors
def ingest(
    sources: tuple[str, ...],
    target: Path,
    buckets: int,
    force: bool,
    log_tz: str | None,
    log_date: Any,
) -> None:
    """Read SOURCE... once and write the canonical tables as a Parquet dataset partitioned by run.

    `dstack-audit audit DIR` (or a URL polars reads) then audits it; `--partition I/N` audits a
    part of it, so a huge audit can be split and the reports compared or merged.

    \b
    Exit status: 0 written, 2 unusable input or wrong usage.
    """
    from analyzer.dataset import write_dataset
    from analyzer.outputs import plan

    outputs = plan(sources, folders=(target,), force=force)
    opened = open_audit(sources, log_tz, log_date)
    outputs.add_inputs(i.path for i in opened.evidence.inputs)
    with outputs.build(target) as folder:
        written = write_dataset(opened.evidence, folder, buckets=buckets)
    rows = ", ".join(f"{count} {table}" for table, count in written.items())
    click.echo(f"wrote {rows} to {target} in {buckets} bucket(s)")


@click.command(short_help="Collect a running dstack server's API into a folder.")
@click.argument("url")
@target_option("New folder to write the server's answers to (it appears only once complete).")
@click.option("--project", help="Only this project (default: every project the token sees).")
@click.option(
    "--time-limit",
    type=click.FloatRange(min=1),
    default=3600,
    show_default=True,
    metavar="SECONDS",
    help="Stop (writing nothing) when the collection takes longer than this.",
)
@click.option(
    "--size-limit",
    type=click.IntRange(min=1),
    default=8192,
    show_default=True,
    metavar="MIB",
    help="Stop (writing nothing) when the server's answers would take more room than this.",
)
@token_option
@ui_options
@clean_errors
def collect(
    url: str,
    target: Path,
    project: str | None,
    time_limit: float,
    size_limit: int,
    token: str | None,
) -> None:
    """Collect a running dstack server's API (URL, or dstack:[PROJECT]) into a folder.

    Read-only list/get calls; every page byte for byte with its SHA-256 in a manifest (never
    the token). `dstack-audit audit DIR` audits it offline, `dstack-audit verify DIR` checks it.

    \b
    Exit status: 0 collected, 2 unreachable server, bad token, not a dstack
    server, a server that failed mid-collection or passed a limit (nothing is
    left in DIR) or wrong usage.
    """
    from analyzer.sources.collect import collect as collect_server
    from analyzer.sources.live import target_of, use_token

    click.get_current_context().call_on_close(use_token(token))
    found = target_of(url)
    if not found.token:
        raise AuditInputError(url, "no token given", "set DSTACK_TOKEN or give --token")
    result = collect_server(
        found.url,
        target,
        found.token,
        project=project or found.project,
        time_limit=time_limit,
        size_limit=size_limit * 2**20,
    )
    pages = len(result.pages)
    click.echo(
        f"collected {pages} pages ({result.bytes} bytes) of {len(result.projects)} project(s) "
        f"from {result.url} (dstack {result.server_version}) in {result.seconds:.2f}s "
        f"({pages / max(result.seconds, 1e-9):.0f} pages/s) to {target}"
    )
    if result.echoed:
        click.echo(
            f"dstack-audit: the server put the token back in its answers to "
            f"{', '.join(result.echoed)}: masked as *** in those pages (see the manifest)",
            err=True,
        )


def register(cli: click.Group) -> None:
    """Add `ingest` and `collect` to `cli`."""
    cli.add_command(ingest)
    cli.add_command(collect)
