"""The `dstack-audit` command: options -> library call -> renderer. No audit logic here."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from pathlib import Path
from typing import Any

import click
import polars as pl

from analyzer import __version__
from analyzer.api import audit_in_partitions, open_sources
from analyzer.bundle import verify_bundle, write_bundle
from analyzer.dataset import write_dataset
from analyzer.errors import AuditInputError
from analyzer.redact import Redactor
from analyzer.report.markdown import render_markdown
from analyzer.report.text import render_table, render_timeline

RENDERERS = {
    "table": render_table,
    "markdown": render_markdown,
    "json": lambda report: report.model_dump_json(indent=2) + "\n",
}


def _clean_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Unusable input: one line on stderr, exit 2, never a traceback."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AuditInputError as error:
            click.echo(Redactor().apply(f"dstack-audit: {error}"), err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as error:  # a bug of ours: still one line, still exit 2
            click.echo(
                Redactor().apply(
                    f"dstack-audit: internal error while auditing ({type(error).__name__}: "
                    f"{error}); please report it with the command line"
                ),
                err=True,
            )
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dstack-audit")
def main() -> None:
    """Find healthy dstack service replicas killed because a newer deployment failed.

    SOURCE is a dstack SQLite database (server.db), a folder of table exports (CSV/Parquet),
    or a folder holding any of these. Inputs are opened read-only.
    """


def _write(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


def _log_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--log-tz",
        help="The zone of the server's local log times (IANA name such as Europe/Berlin, or "
        "+02:00), when no database in the audit lets the tool infer it.",
    )(command)
    command = click.option(
        "--log-date",
        type=click.DateTime(formats=["%Y-%m-%d"]),
        help="The date of a rich log's first line (rich logs carry times of day only).",
    )(command)
    return command


def _open(sources: tuple[str, ...], log_tz: str | None, log_date: Any, **options: Any):
    return open_sources(
        sources, log_tz=log_tz, log_date=log_date.date() if log_date else None, **options
    )


@main.command()
@click.argument("sources", nargs=-1)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(sorted(RENDERERS)),
    default="table",
    show_default=True,
    help="Output format: a readable table, markdown, or the JSON report contract.",
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE."
)
@click.option("--project", help="Only runs of this project.")
@click.option("--run", help="Only runs with this name or id prefix.")
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    help="Only runs still active at or after this UTC time.",
)
@click.option(
    "--until",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    help="Only runs submitted at or before this UTC time.",
)
@click.option("--fail-on-findings", is_flag=True, help="Exit 1 when there is any finding.")
@click.option(
    "--quarantine",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every log line that could not be parsed to FILE, as file:line<TAB>text.",
)
@click.option(
    "--server-label",
    "server_labels",
    multiple=True,
    metavar="NAME=SOURCE",
    help="Name the dstack server SOURCE belongs to (repeatable): several servers in one audit "
    "stay apart and the report summarises per server. Label every source of a server alike.",
)
@click.option(
    "--partition",
    help="I/N: audit only partition I of N (whole services; pushed down into SQLite and "
    "ingested datasets) to split a huge audit across processes or machines.",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    help="Audit N partitions one after the other and merge them: memory bounded by the "
    "largest partition instead of the whole input.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Audit the partitions as tasks on a new local Dask cluster of N worker processes "
    "(needs the 'cluster' extra; --partitions defaults to one per worker thread).",
)
@click.option(
    "--cluster",
    metavar="tcp://HOST:PORT",
    help="Audit the partitions as tasks on the running Dask scheduler at this address; its "
    "workers open the sources from the same paths or URLs.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Treat any damage (unparsed log lines, truncated files) as unusable input: exit 2.",
)
@click.option(
    "--bundle",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write DIR with the JSON and markdown reports and a manifest (inputs' SHA-256, "
    "tool version, options) that `dstack-audit verify DIR` re-checks.",
)
@_log_options
@_clean_errors
def audit(
    sources: tuple[str, ...],
    fmt: str,
    output: Path | None,
    project: str | None,
    run: str | None,
    since: datetime | None,
    until: datetime | None,
    fail_on_findings: bool,
    quarantine: Path | None,
    server_labels: tuple[str, ...],
    partition: str | None,
    partitions: int | None,
    workers: int | None,
    cluster: str | None,
    strict: bool,
    bundle: Path | None,
    log_tz: str | None,
    log_date: Any,
) -> None:
    """Audit SOURCES and report every run's verdict and every finding.

    SOURCES: dstack SQLite databases, folders of table exports, server logs (rich, standard or
    json; plain, .gz, docker/kubectl --timestamps, journalctl -o json), or folders of these.

    Exit status: 0 audit completed, 1 with --fail-on-findings and findings, 2 unusable input.
    """
    labels = _server_labels(server_labels)
    sources = tuple(dict.fromkeys([*sources, *labels]))
    options = {
        "server_labels": labels,
        "project": project,
        "run": run,
        "since": since.replace(tzinfo=UTC) if since else None,
        "until": until.replace(tzinfo=UTC) if until else None,
    }
    if (partitions and partitions > 1) or workers or cluster:
        if partition or quarantine or bundle:
            raise AuditInputError(
                "--partitions/--workers/--cluster",
                "cannot be combined with --partition, --quarantine or --bundle",
            )
        if workers and cluster:
            raise AuditInputError("--workers", "cannot be combined with --cluster")
        options.update(log_tz=log_tz, log_date=log_date.date() if log_date else None)
        if workers or cluster:
            from analyzer.cluster import audit_on_cluster

            report = audit_on_cluster(
                sources, workers=workers, address=cluster, partitions=partitions, **options
            )
        else:
            report = audit_in_partitions(sources, partitions, **options)
        _write(RENDERERS[fmt](report), output)
        if fail_on_findings and report.findings:
            sys.exit(1)
        return
    opened = _open(sources, log_tz, log_date, partition=_partition(partition), **options)
    report = opened.report
    if strict:
        damaged = [i for i in report.inputs if i.unparsed or any("truncated" in n for n in i.notes)]
        if damaged:
            first = damaged[0]
            raise AuditInputError(
                first.path,
                f"damaged input under --strict: {first.unparsed} unparsed line(s)"
                + (f", and {len(damaged) - 1} more damaged input(s)" if len(damaged) > 1 else ""),
                "see --quarantine FILE for the lines, or drop --strict to audit leniently",
            )
    _write(opened.redact(RENDERERS[fmt](report)), output)
    if bundle is not None:
        options = {
            "project": project,
            "run": run,
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "log_tz": log_tz,
            "log_date": log_date.date().isoformat() if log_date else None,
        }
        write_bundle(bundle, sources, options, report, opened.redact(render_markdown(report)))
    if quarantine is not None:
        lines = [
            f"{row['file']}:{row['line']}\t{row['text']}"
            for row in opened.evidence.unparsed.iter_rows(named=True)
        ]
        quarantine.write_text(opened.redact("".join(line + "\n" for line in lines)), "utf-8")
    if fail_on_findings and report.findings:
        sys.exit(1)


def _server_labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        name, _, source = pair.partition("=")
        if not name or not source:
            raise AuditInputError(
                "--server-label", f"{pair!r} is not NAME=SOURCE", "e.g. prod=prod.db"
            )
        labels[source] = name
    return labels


def _partition(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise AuditInputError("--partition", f"{text!r} is not I/N with 0 <= I < N", "e.g. 0/4")
    return int(match.group(1)), int(match.group(2))


@main.command()
@click.argument("sources", nargs=-1, required=True)
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write the dataset to (runs/, jobs/, events/ partitioned by bucket).",
)
@click.option("--buckets", default=16, show_default=True, help="How many run buckets.")
@_log_options
@_clean_errors
def ingest(
    sources: tuple[str, ...], target: Path, buckets: int, log_tz: str | None, log_date: Any
) -> None:
    """Read SOURCES once and write the canonical tables as a Parquet dataset partitioned by run.

    `dstack-audit audit DIR` (or a URL polars reads) then audits it; `--partition I/N` audits a
    part of it, so a huge audit can be split and the reports compared or merged.
    """
    opened = _open(sources, log_tz, log_date)
    written = write_dataset(opened.evidence, target, buckets=buckets)
    rows = ", ".join(f"{count} {table}" for table, count in written.items())
    click.echo(f"wrote {rows} to {target} in {buckets} bucket(s)")


@main.command()
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
@_clean_errors
def synth(out: Path, runs: int, seed: int, log_tz: str, rich_width: int) -> None:
    """Generate a synthetic dstack server in OUT: server.db (dstack 0.22.5's schema), its logs in
    the three formats, and the truth.json of every run (for benchmarks and fleet-scale tests)."""
    from analyzer.synth import synthesize

    summary = synthesize(out, runs=runs, seed=seed, log_tz=log_tz, rich_width=rich_width)
    click.echo(
        f"wrote {summary.runs} runs, {summary.rows.get('jobs', 0)} jobs, "
        f"{summary.rows.get('events', 0)} events and {summary.log_records} log records per "
        f"format to {out} in {summary.seconds:.1f}s"
    )


@main.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_clean_errors
def verify(bundle: Path) -> None:
    """Re-run the audit recorded in BUNDLE and confirm the same findings, or name the difference.

    Exit status: 0 same inputs and same findings, 1 something differs, 2 unusable bundle.
    """
    result = verify_bundle(bundle)
    for line in result.lines:
        click.echo(line)
    sys.exit(0 if result.same else 1)


@main.command()
@click.argument("run")
@click.argument("sources", nargs=-1, required=True)
@click.option("--project", help="The run's project, when several projects have a run of that name.")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE."
)
@_clean_errors
def timeline(run: str, sources: tuple[str, ...], project: str | None, output: Path | None) -> None:
    """Print RUN's timeline: deployments, replica slots, every submission, every event.

    RUN is a run name (add --project when several projects have one) or a run id prefix.
    """
    opened = open_sources(sources, project=project, run=run)
    runs = opened.runs
    if runs.height == 0:
        raise AuditInputError(run, "no run with this name or id prefix in the given sources")
    if runs.height > 1:
        listed = "; ".join(
            f"{r['project']}/{r['run_name']} id {r['run_id'][:8]} submitted {r['submitted_at']}"
            for r in runs.iter_rows(named=True)
        )
        raise AuditInputError(
            run, f"{runs.height} runs match: {listed}", "give --project or an id prefix"
        )
    row = runs.row(0, named=True)
    key = (pl.col("server") == row["server"]) & (pl.col("run_id") == row["run_id"])
    verdict = next((v.verdict for v in opened.verdicts if v.run_id == row["run_id"]), None)
    text = render_timeline(
        row,
        verdict,
        opened.deployments.filter(key),
        opened.submissions.filter(key),
        opened.events.filter(key),
    )
    _write(opened.redact(text), output)


from analyzer.cli_visual import register as _register_visual  # noqa: E402

_register_visual(main)
