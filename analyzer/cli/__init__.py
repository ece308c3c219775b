"""The `dstack-audit` command: options -> library call -> renderer. No audit logic here."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any, get_args

import click
import polars as pl

from analyzer._version import __version__
from analyzer.api import audit_in_partitions, open_sources
from analyzer.bundle import verify_bundle, write_bundle
from analyzer.contract import Verdict
from analyzer.dataset import write_dataset
from analyzer.errors import AuditInputError
from analyzer.outputs import plan
from analyzer.redact import Redactor, without_controls
from analyzer.render.markdown import render_markdown
from analyzer.render.text import render_timeline
from analyzer.sources import LIVE_URL
from analyzer.sources.live import use_token
from analyzer.terminal import SETTINGS, colour_wanted, reporting
from analyzer.times import EXAMPLES, parse_time

RENDERERS = {  # besides "table", the terminal view (it needs the width, colour and filters)
    "markdown": render_markdown,
    "json": lambda report: report.model_dump_json(indent=2) + "\n",
}
AUDIT_FORMATS = ["json", "markdown", "table"]
FORMAT_BY_SUFFIX = {".json": "json", ".md": "markdown", ".markdown": "markdown", ".txt": "table"}


class IsoTime(click.ParamType):
    """ISO 8601: 2026-11-02, 2026-11-02T09:00:00Z, ...+02:00, or the tool's own output."""

    name = "TIME"

    def convert(self, value: Any, param: Any, ctx: Any) -> datetime:
        try:
            return parse_time(value, param.name if param else "time")
        except AuditInputError:
            self.fail(f"{value!r} is not an ISO 8601 time ({EXAMPLES})", param, ctx)


def _ui(command: Callable[..., Any]) -> Callable[..., Any]:
    """-q, -v and --no-color on every command; progress bars on stderr while it runs."""

    @wraps(command)
    def wrapper(*args: Any, quiet: bool, verbose: bool, no_color: bool, **kwargs: Any) -> Any:
        SETTINGS.quiet, SETTINGS.verbose, SETTINGS.no_color = quiet, verbose, no_color
        with reporting():
            return command(*args, **kwargs)

    wrapper = click.option(
        "--no-color", is_flag=True, help="No colour (also when NO_COLOR is set or not a terminal)."
    )(wrapper)
    wrapper = click.option(
        "-v", "--verbose", is_flag=True, help="Say what is read and how long each stage took."
    )(wrapper)
    return click.option(
        "-q", "--quiet", is_flag=True, help="No progress bars and no notes on stderr."
    )(wrapper)


def _tz_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--tz", help="Show times in this zone (IANA name, e.g. Europe/Berlin); default UTC."
    )(command)


def _zone(tz: str | None):
    if not tz:
        return None
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise AuditInputError("--tz", f"unknown time zone {tz!r}", "e.g. Europe/Berlin") from None


def _screen_width(output: Path | None) -> int:
    """The terminal's width when printing to one; COLUMNS or 100 otherwise."""
    if output is None or str(output) == "-":
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
        if os.environ.get("COLUMNS", "").isdigit():
            return int(os.environ["COLUMNS"])
    return 100


def _inferred_format(fmt: str | None, output: Path | None, default: str, known) -> str:
    """--format when given, else the output file's extension, else `default`."""
    if fmt:
        return fmt
    if output is not None and str(output) != "-":
        return known.get(output.suffix.lower(), default)
    return default


def _clean_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Unusable input: one line on stderr, exit 2, never a traceback."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AuditInputError as error:
            click.echo(without_controls(Redactor().apply(f"dstack-audit: {error}")), err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as error:  # a bug of ours: still one line, still exit 2
            click.echo(
                without_controls(
                    Redactor().apply(
                        f"dstack-audit: internal error while auditing ({type(error).__name__}: "
                        f"{error}); please report it with the command line"
                    )
                ),
                err=True,
            )
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="dstack-audit")
def main() -> None:
    """Find healthy dstack service replicas killed because a newer deployment failed.

    \b
    SOURCE, detected by content (any mix; every input opened read-only):
      a dstack SQLite database (server.db), a PostgreSQL URL (postgresql://...),
      a folder of table exports (CSV or Parquet), API exports (/api/runs/list JSON,
      `dstack ps --json`, `dstack event` text), server logs (rich, standard or json;
      plain, .gz, rotated, docker/kubectl --timestamps, journalctl -o json; - for stdin),
      an ingested dataset (a folder or a URL polars reads), or a folder of any of these.

    \b
    Exit status: 0 done, 1 findings with --fail-on-findings (verify: a difference),
    2 unusable input or wrong usage (one line on stderr, never a traceback).
    -o FILE picks the format from FILE's extension; -o - is standard output.
    """


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


def _token_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--token",
        help="A dstack user token for a server URL (prefer DSTACK_TOKEN: a command line is "
        "visible to other users). Never printed or stored.",
    )(command)


def _open(sources: tuple[str, ...], log_tz: str | None, log_date: Any, **options: Any):
    return open_sources(
        sources, log_tz=log_tz, log_date=log_date.date() if log_date else None, **options
    )


@main.command()
@click.argument("sources", nargs=-1)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(AUDIT_FORMATS),
    help="Output format: a readable table (default), markdown, or the JSON report contract; "
    "without it, -o FILE's extension decides (.json, .md).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Write to FILE (- is standard output).",
)
@click.option("--project", help="Only runs of this project.")
@click.option("--run", help="Only runs with this name, project/name or id prefix.")
@click.option(
    "--since",
    type=IsoTime(),
    help="Only runs still active at or after this time (ISO 8601; UTC without a zone).",
)
@click.option(
    "--until",
    type=IsoTime(),
    help="Only runs submitted at or before this time (ISO 8601; UTC without a zone).",
)
@click.option("--all-runs", is_flag=True, help="Table: list every run (not only the incidents).")
@click.option("--inputs", "full_inputs", is_flag=True, help="Table: list every input, hashed.")
@click.option(
    "--verdict",
    "verdicts",
    multiple=True,
    type=click.Choice(get_args(Verdict)),
    metavar="VERDICT",
    help="Table: only runs and findings with this verdict (repeatable): "
    + ", ".join(get_args(Verdict))
    + ".",
)
@_tz_option
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
@click.option("--force", is_flag=True, help="Replace a non-empty --bundle DIR whole.")
@_token_option
@_log_options
@_ui
@_clean_errors
def audit(
    sources: tuple[str, ...],
    fmt: str | None,
    output: Path | None,
    project: str | None,
    run: str | None,
    since: datetime | None,
    until: datetime | None,
    all_runs: bool,
    full_inputs: bool,
    verdicts: tuple[str, ...],
    tz: str | None,
    fail_on_findings: bool,
    quarantine: Path | None,
    server_labels: tuple[str, ...],
    partition: str | None,
    partitions: int | None,
    workers: int | None,
    cluster: str | None,
    strict: bool,
    bundle: Path | None,
    force: bool,
    log_tz: str | None,
    log_date: Any,
    token: str | None,
) -> None:
    """Audit SOURCES and report every run's verdict and every finding.

    SOURCES: dstack SQLite databases, folders of table exports, server logs (rich, standard or
    json; plain, .gz, docker/kubectl --timestamps, journalctl -o json), or folders of these.

    \b
    Exit status: 0 audit completed, 1 with --fail-on-findings and findings,
    2 unusable input or wrong usage.
    """
    click.get_current_context().call_on_close(use_token(token))
    if bundle is not None and any(LIVE_URL.match(source) for source in sources):
        raise AuditInputError(
            "--bundle",
            "a live server's answers cannot be checked again later",
            "collect them first (dstack-audit collect URL --to DIR), then audit DIR --bundle",
        )
    fmt = _inferred_format(fmt, output, "table", FORMAT_BY_SUFFIX)
    zone = _zone(tz)

    def render(report: Any) -> str:
        if fmt != "table":
            return RENDERERS[fmt](report)
        from analyzer.render.screen import render_table

        to_terminal = output is None or str(output) == "-"
        return render_table(
            report,
            width=_screen_width(output),
            colour=to_terminal and colour_wanted(sys.stdout),
            all_runs=all_runs,
            full_inputs=full_inputs,
            verdicts=verdicts,
            tz=zone,
        )

    labels = _server_labels(server_labels)
    sources = tuple(dict.fromkeys([*sources, *labels]))
    outputs = plan(sources, files=(output, quarantine), folders=(bundle,), force=force)
    options = {
        "server_labels": labels,
        "project": project,
        "run": run,
        "since": since,
        "until": until,
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
            from analyzer.api import audit_on_cluster

            report = audit_on_cluster(
                sources, workers=workers, address=cluster, partitions=partitions, **options
            )
        else:
            report = audit_in_partitions(sources, partitions, **options)
        outputs.add_inputs(i.path for i in report.inputs)
        outputs.write_text(output, without_controls(Redactor().apply(render(report))))
        if fail_on_findings and report.findings:
            sys.exit(1)
        return
    opened = _open(sources, log_tz, log_date, partition=_partition(partition), **options)
    report = opened.report
    outputs.add_inputs(i.path for i in report.inputs)
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
    styled = fmt == "table" and (output is None or str(output) == "-")  # colour on a terminal
    outputs.write_text(output, opened.redact(render(report), keep_styles=styled))
    if bundle is not None:
        options = {
            "project": project,
            "run": run,
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "log_tz": log_tz,
            "log_date": log_date.date().isoformat() if log_date else None,
            "server_labels": labels or None,
            "partition": _partition(partition),
        }
        markdown = opened.redact(render_markdown(report))
        with outputs.build(bundle) as folder:
            write_bundle(folder, sources, options, report, markdown, location=bundle)
    if quarantine is not None:
        from analyzer.sources.logs.reader import QUARANTINE_NOT_KEPT as NOT_KEPT

        lines = [
            f"{row['file']}:{row['line']}\t{row['text'] if row['text'] is not None else NOT_KEPT}"
            for row in opened.evidence.unparsed.iter_rows(named=True)
        ]
        outputs.write_text(quarantine, opened.redact("".join(line + "\n" for line in lines)))
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
@click.option("--force", is_flag=True, help="Replace a non-empty --to DIR whole.")
@_log_options
@_ui
@_clean_errors
def ingest(
    sources: tuple[str, ...],
    target: Path,
    buckets: int,
    force: bool,
    log_tz: str | None,
    log_date: Any,
) -> None:
    """Read SOURCES once and write the canonical tables as a Parquet dataset partitioned by run.

    `dstack-audit audit DIR` (or a URL polars reads) then audits it; `--partition I/N` audits a
    part of it, so a huge audit can be split and the reports compared or merged.

    \b
    Exit status: 0 written, 2 unusable input or wrong usage.
    """
    outputs = plan(sources, folders=(target,), force=force)
    opened = _open(sources, log_tz, log_date)
    outputs.add_inputs(i.path for i in opened.evidence.inputs)
    with outputs.build(target) as folder:
        written = write_dataset(opened.evidence, folder, buckets=buckets)
    rows = ", ".join(f"{count} {table}" for table, count in written.items())
    click.echo(f"wrote {rows} to {target} in {buckets} bucket(s)")


@main.command()
@click.argument("url")
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="New folder to write the server's answers to (it appears only once complete).",
)
@click.option("--project", help="Only this project (default: every project the token sees).")
@_token_option
@_ui
@_clean_errors
def collect(url: str, target: Path, project: str | None, token: str | None) -> None:
    """Collect a running dstack server's API (URL, or dstack:[PROJECT]) into a folder.

    Read-only list/get calls; every page byte for byte with its SHA-256 in a manifest (never
    the token). `dstack-audit audit DIR` audits it offline, `dstack-audit verify DIR` checks it.

    \b
    Exit status: 0 collected, 2 unreachable server, bad token, not a dstack server, a server
    that failed mid-collection (nothing is left in DIR) or wrong usage.
    """
    from analyzer.collect import collect as collect_server
    from analyzer.sources.live import target_of

    click.get_current_context().call_on_close(use_token(token))
    found = target_of(url)
    if not found.token:
        raise AuditInputError(url, "no token given", "set DSTACK_TOKEN or give --token")
    result = collect_server(found.url, target, found.token, project=project or found.project)
    pages = len(result.pages)
    click.echo(
        f"collected {pages} pages ({result.bytes} bytes) of {len(result.projects)} project(s) "
        f"from {result.url} (dstack {result.server_version}) in {result.seconds:.2f}s "
        f"({pages / max(result.seconds, 1e-9):.0f} pages/s) to {target}"
    )


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
@_ui
@_clean_errors
def synth(out: Path, runs: int, seed: int, log_tz: str, rich_width: int) -> None:
    """Generate a synthetic dstack server in OUT: server.db (dstack 0.22.5's schema), its logs in
    the three formats, and the truth.json of every run (for benchmarks and fleet-scale tests).

    \b
    Exit status: 0 written, 2 wrong usage.
    """
    from analyzer.synth import synthesize

    summary = synthesize(out, runs=runs, seed=seed, log_tz=log_tz, rich_width=rich_width)
    click.echo(
        f"wrote {summary.runs} runs, {summary.rows.get('jobs', 0)} jobs, "
        f"{summary.rows.get('events', 0)} events and {summary.log_records} log records per "
        f"format to {out} in {summary.seconds:.1f}s"
    )


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@_ui
@_clean_errors
def verify(bundle: Path) -> None:
    """Re-run the audit recorded in BUNDLE and confirm the same findings, or name the difference.

    BUNDLE may also be a folder `dstack-audit collect` wrote: every page is checked against
    the SHA-256 its manifest recorded.

    \b
    Exit status: 0 same inputs and same findings, 1 something differs, 2 unusable bundle.
    """
    from analyzer.sources.live import read_manifest, verify_collection

    result = verify_collection(bundle) if read_manifest(bundle) else verify_bundle(bundle)
    for line in result.lines:
        click.echo(line)
    sys.exit(0 if result.same else 1)


TIMELINE_FORMATS = ["text", "json", "jsonl", "csv", "timesketch"]
TIMELINE_BY_SUFFIX = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".txt": "text"}


@main.command()
@click.argument("run")
@click.argument("sources", nargs=-1, required=True)
@click.option("--project", help="The run's project, when several projects have a run of that name.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Write to FILE (- is standard output); its extension picks the format.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(TIMELINE_FORMATS),
    help="text (default), json, jsonl, csv, or timesketch (JSONL with message, datetime and "
    "timestamp_desc for Timesketch); without it, -o FILE's extension decides.",
)
@click.option("--sources", "show_sources", is_flag=True, help="List each line's provenance.")
@click.option(
    "--width", type=click.IntRange(min=40), help="Text: fit this many columns (default 100)."
)
@_tz_option
@_log_options
@_ui
@_clean_errors
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
    from analyzer.pipeline.selectors import one_run
    from analyzer.render.timeline_view import export, merged_events, roles

    fmt = _inferred_format(fmt, output, "text", TIMELINE_BY_SUFFIX)
    zone = _zone(tz)
    outputs = plan(sources, files=(output,))
    opened = _open(sources, log_tz, log_date, project=project, run=run)
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
            width=width or 100,
            sources=show_sources,
            roles=marked,
            findings=found,
            tz=zone,
        )
    else:
        text = export(row, merged_events(events, marked), fmt)
    outputs.write_text(output, opened.redact(text))


from analyzer.cli.visual import register as _register_visual  # noqa: E402

_register_visual(main)

from analyzer.cli.exposure import register as _register_exposure  # noqa: E402

_register_exposure(main)
