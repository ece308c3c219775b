"""`dstack-audit audit` (the report of every run and finding) and `dstack-audit verify` (the
bundle or collection it wrote, checked again)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from analyzer.cli.options import (
    PARTITION_BYTES,
    PARTITIONED_BYTES,
    clean_errors,
    default_partitions,
    format_option,
    log_options,
    open_audit,
    output_format,
    output_option,
    parse_partition,
    parse_server_labels,
    polars_for_small_inputs,
    run_selection_options,
    screen_width,
    time_zone,
    token_option,
    tz_option,
    ui_options,
    width_option,
    wrote,
)
from analyzer.collector import kept, paused
from analyzer.errors import AuditInputError
from analyzer.vocabulary import VERDICTS

if TYPE_CHECKING:
    from analyzer.cluster_local import Workers
    from analyzer.contract import InputRecord

AUDIT_FORMATS = ("table", "markdown", "json", "csv", "jsonl")
ROWS = ("findings", "victims")  # what csv and jsonl hold: one row a finding, or a victim
WORKER_PRELOAD = ("analyzer.api", "analyzer.render.report_json")  # what the tasks import


def _markdown(report: Any) -> str:
    from analyzer.render.markdown import render_markdown

    return render_markdown(report)


def _json(report: Any) -> Iterable[str]:
    from analyzer.render.report_json import json_pieces

    return json_pieces(report)


RENDERERS: dict[str, Callable[[Any], Iterable[str]]] = {  # besides "table", the terminal view
    "markdown": lambda report: [_markdown(report)],  # (it needs the width, colour and filters)
    "json": _json,  # piece by piece: a huge report is never one text
}


@click.command(short_help="Audit SOURCE... and report every run's verdict and every finding.")
@click.argument("sources", nargs=-1, metavar="SOURCE...")  # none: one line, exit 2
@format_option(AUDIT_FORMATS, "table")
@click.option(
    "--rows",
    type=click.Choice(ROWS),
    default="findings",
    show_default=True,
    help="csv and jsonl: one row a finding, or one row a healthy replica killed (a victim).",
)
@output_option("Write to FILE (- is standard output).")
@run_selection_options
@click.option("--all-runs", is_flag=True, help="Table: list every run (not only the incidents).")
@click.option("--inputs", "full_inputs", is_flag=True, help="Table: list every input, hashed.")
@click.option(
    "--verdict",
    "verdicts",
    multiple=True,
    type=click.Choice(VERDICTS),
    metavar="VERDICT",
    help="Table: only runs and findings with this verdict (repeatable): "
    + ", ".join(VERDICTS)
    + ".",
)
@tz_option
@width_option
@click.option(
    "--fail-on-findings",
    is_flag=True,
    help="Exit 1 when there is any finding, and when nothing could be decided (no run evidence "
    "in the inputs, or inconclusive runs): no findings is no all-clear then.",
)
@click.option(
    "--allow-undecided",
    is_flag=True,
    help="With --fail-on-findings: exit 0 when there is no finding even if runs could not be "
    "decided.",
)
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
    "largest partition instead of the whole input. Default: a local SQLite database over "
    f"{PARTITIONED_BYTES >> 30} GiB alone, one per {PARTITION_BYTES >> 20} MiB of it; "
    "anything else, one process (as --partitions 1).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Audit on N local processes (this one among them): several databases one server "
    "per task, else the partitions as tasks (--partitions defaults to one per worker).",
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
@token_option
@log_options
@ui_options
@clean_errors
def audit(
    sources: tuple[str, ...],
    fmt: str | None,
    rows: str,
    output: Path | None,
    project: str | None,
    run: str | None,
    since: datetime | None,
    until: datetime | None,
    all_runs: bool,
    full_inputs: bool,
    verdicts: tuple[str, ...],
    tz: str | None,
    width: int | None,
    fail_on_findings: bool,
    allow_undecided: bool,
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
    """Audit SOURCE... and report every run's verdict and every finding.

    SOURCE: dstack SQLite databases, folders of table exports, server logs (rich, standard or
    json; plain, .gz, docker/kubectl --timestamps, journalctl -o json), or folders of these.

    \b
    Exit status: 0 audit completed, 1 with --fail-on-findings and findings
    (or runs not decided, unless --allow-undecided), 2 unusable input or wrong
    usage.
    """
    if not (workers or cluster):  # before polars is imported
        polars_for_small_inputs(sources)
    # the local workers, started before the pipeline is imported (none for an audit refused
    # below)
    refused = cluster or partition or quarantine or bundle
    local = (
        _local_workers(sources, workers, partitions, server_labels)
        if workers and not refused
        else None
    )
    # the library's objects live as long as the process: set aside, not walked by each pass
    with paused(keep=True):
        from analyzer.api import partitions_merged
        from analyzer.contract import Report
        from analyzer.outputs import plan
        from analyzer.redact import Redactor, redact_pieces, without_controls
        from analyzer.sources.live import LIVE_URL, use_token
        from analyzer.terminal import colour_wanted

    click.get_current_context().call_on_close(use_token(token))
    if bundle is not None and any(LIVE_URL.match(source) for source in sources):
        raise AuditInputError(
            "--bundle",
            "a live server's answers cannot be checked again later",
            "collect them first (dstack-audit collect URL --to DIR), then audit DIR --bundle",
        )
    if bundle is not None:
        from analyzer.bundle import unverifiable

        for source in sources:
            if (why := unverifiable(source)) is not None:
                hint = (
                    "save it to a file and audit the file"
                    if source == "-"
                    else "ingest it first (dstack-audit ingest SOURCE --to DIR), then audit DIR"
                )
                raise AuditInputError("--bundle", why, hint)
    zone = time_zone(tz)

    def render(report: Any) -> Iterable[str]:
        if fmt in ("csv", "jsonl"):
            from analyzer.render.rows import report_rows

            return [report_rows(report, rows, fmt)]
        if fmt != "table":
            return RENDERERS[fmt](report)
        from analyzer.render.screen import render_table

        to_terminal = output is None or str(output) == "-"
        return [
            render_table(
                report,
                width=screen_width(output, width),
                colour=to_terminal and colour_wanted(sys.stdout),
                terminal=to_terminal and sys.stdout.isatty(),
                all_runs=all_runs,
                full_inputs=full_inputs,
                verdicts=verdicts,
                tz=zone,
            )
        ]

    def write(
        report: Any, redact: Callable[[str], str], rendered: Iterable[str] | None = None
    ) -> None:
        """The report to `output` through the final redaction pass, rendered (unless it was:
        `rendered`), redacted and written piece by piece (analyzer.redact.redact_pieces: every
        byte written passes it)."""
        pieces = render(report) if rendered is None else rendered
        outputs.write_pieces(output, redact_pieces(pieces, redact))
        wrote(output)

    labels = parse_server_labels(server_labels)
    sources = tuple(dict.fromkeys([*sources, *labels]))
    outputs = plan(sources, files=(output, quarantine), folders=(bundle,), force=force)
    fmt = output_format(fmt, output, AUDIT_FORMATS, "table", "audit")  # after: evidence first
    options = {
        "server_labels": labels,
        "project": project,
        "run": run,
        "since": since,
        "until": until,
    }
    styled = fmt == "table" and (output is None or str(output) == "-")  # colour on a terminal
    if partitions is None and not (workers or cluster or partition or quarantine or bundle):
        partitions = default_partitions(sources)  # a large database: in partitions
    if (partitions and partitions > 1) or workers or cluster:
        if partition or quarantine or bundle:
            raise AuditInputError(
                "--partitions/--workers/--cluster",
                "cannot be combined with --partition, --quarantine or --bundle",
            )
        if workers and cluster:
            raise AuditInputError("--workers", "cannot be combined with --cluster")
        options.update(log_tz=log_tz, log_date=log_date.date() if log_date else None)
        shapes = Redactor()  # each partition's report is redacted already: secret shapes only

        def clean(text: str) -> str:
            return shapes.apply(without_controls(text, keep_styles=styled))

        from analyzer.render.report_json import finished_json, json_fleet, json_partitions

        if workers or cluster:
            from analyzer.api import cluster_merged

            merging = cluster_merged(
                sources,
                workers=workers,
                address=cluster,
                partitions=partitions,
                fleet=json_fleet() if fmt == "json" else None,
                partitioned=json_partitions() if fmt == "json" else None,
                started=local,
                **options,
            )
        else:
            merging = partitions_merged(sources, partitions, **options)
        with merging as merged:
            # rendered and redacted in the servers' or the partitions' tasks, but the head
            if (finished := finished_json(merged)) is not None:
                head, pieces = finished
                _refused_if_damaged(head.inputs, strict)
                outputs.add_inputs(i.path for i in head.inputs)
                outputs.write_pieces(output, pieces)
                wrote(output)
            else:
                head = merged if isinstance(merged, Report) else merged.head
                _refused_if_damaged(head.inputs, strict)
                outputs.add_inputs(i.path for i in head.inputs)
                # JSON streams the runs and findings from the merge's files; the others read them
                streamed = fmt == "json" or isinstance(merged, Report)
                write(merged if streamed else merged.report(), clean)
        kept(merged)
        _gate(head, fail_on_findings, allow_undecided)
        return
    rendered = None
    with paused(keep=True):  # the audit and its report live as long as the command
        opened = open_audit(
            sources, log_tz, log_date, partition=parse_partition(partition), **options
        )
        final = partial(opened.redact, keep_styles=styled)
        if fmt == "json":  # the guard looks at the JSON written (rendered once)
            from analyzer.api import rendered_report

            json_report = rendered_report(opened, RENDERERS["json"])
            report, final = json_report.report, json_report.redact
            rendered = _written_once(json_report.texts)  # each chunk let go once written
            del json_report
        else:
            report = opened.report
    outputs.add_inputs(i.path for i in report.inputs)
    _refused_if_damaged(report.inputs, strict)
    write(report, final, rendered)
    kept(opened, report)
    if bundle is not None:
        from analyzer.bundle import write_bundle

        options = {
            "project": project,
            "run": run,
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "log_tz": log_tz,
            "log_date": log_date.date().isoformat() if log_date else None,
            "server_labels": labels or None,
            "partition": parse_partition(partition),
        }
        markdown = opened.redact(_markdown(report))
        # the bundle's report.json is written from the model, with no final pass over its
        # text: the whole rule set walks the model instead (Audit.report only guards it)
        walked = opened.evidence.redactor.apply_model(report, controls=True)
        with outputs.build(bundle) as folder:
            write_bundle(folder, sources, options, walked, markdown, location=bundle)
    if quarantine is not None:
        from analyzer.sources.logs.reader import QUARANTINE_NOT_KEPT as NOT_KEPT

        lines = [
            f"{row['file']}:{row['line']}\t{row['text'] if row['text'] is not None else NOT_KEPT}"
            for row in opened.evidence.unparsed.iter_rows(named=True)
        ]
        outputs.write_text(quarantine, opened.redact("".join(line + "\n" for line in lines)))
    _gate(report, fail_on_findings, allow_undecided)


def _refused_if_damaged(inputs: list[InputRecord], strict: bool) -> None:
    """--strict: exit 2 before anything is written when an input is damaged (an unparsed line,
    a truncated file, a damaged table value), naming the first; in partitions too, whose merged
    inputs count what one process counts."""
    if not strict:
        return
    damaged = [i for i in inputs if i.unparsed or any("truncated" in n for n in i.notes)]
    if not damaged:
        return
    first = damaged[0]
    values = [n for n in first.notes if "damaged value(s)" in n]
    more = f", and {len(damaged) - 1} more damaged input(s)" if len(damaged) > 1 else ""
    if values:  # a table's values: the first place is named
        raise AuditInputError(
            first.path,
            f"damaged input under --strict: {'; '.join(values)}{more}",
            "the damaged_values limitation lists them; drop --strict to audit leniently",
        )
    raise AuditInputError(
        first.path,
        f"damaged input under --strict: {first.unparsed} unparsed line(s){more}",
        "see --quarantine FILE for the lines, or drop --strict to audit leniently",
    )


def _local_workers(
    sources: tuple[str, ...], workers: int, partitions: int | None, labelled: tuple[str, ...]
) -> Workers | None:
    """The local processes a `--workers` audit runs on besides this one, started first,
    before this one imports the pipeline, so that theirs import while it does
    (analyzer.cluster_local): one a server for what may be a fleet of databases, else one a
    partition; stopped when the command ends, also on an error or Ctrl-C. None when this
    process alone is enough."""
    from analyzer.cluster_local import may_be_a_fleet, started

    distinct = list(dict.fromkeys(sources))
    fleet = not partitions and not labelled and may_be_a_fleet(distinct)
    count = min(workers, len(distinct) if fleet else partitions or workers) - 1
    if count < 1:
        return None
    return click.get_current_context().with_resource(started(count, WORKER_PRELOAD))


def _written_once(texts: list[str]) -> Iterator[str]:
    """The texts in order, each dropped from the list as it is handed on: a report's text is
    not held whole while it is written."""
    texts.reverse()
    while texts:
        yield texts.pop()


def _gate(report: Any, fail_on_findings: bool, allow_undecided: bool) -> None:
    """--fail-on-findings: exit 1 on findings, and on an audit that decided nothing (a CI gate
    must not read "no findings" from no evidence as safe) unless --allow-undecided."""
    if not fail_on_findings:
        return
    if report.summary.findings:
        sys.exit(1)
    from analyzer.render.format import undecided
    from analyzer.terminal import SETTINGS

    why = undecided(report)
    if why and not allow_undecided:
        if not SETTINGS.quiet:
            click.echo(
                f"dstack-audit: --fail-on-findings: no findings, but {why} "
                "(--allow-undecided to pass)",
                err=True,
            )
        sys.exit(1)


@click.command(short_help="Re-run a bundle's audit and confirm the same findings.")
@click.argument("bundle", type=click.Path(path_type=Path))
@ui_options
@clean_errors
def verify(bundle: Path) -> None:
    """Re-run the audit recorded in BUNDLE and confirm the same findings, or name the difference.

    BUNDLE may also be a folder `dstack-audit collect` wrote: every page is checked against
    the SHA-256 its manifest recorded.

    \b
    Exit status: 0 same inputs and same findings, 1 something differs,
    2 unusable bundle.
    """
    from analyzer.bundle import verify_bundle
    from analyzer.outputs import plan
    from analyzer.sources.live import read_manifest, verify_collection

    plan([bundle])  # its lines never go into the bundle it checks (`> BUNDLE/out.txt`)
    result = verify_collection(bundle) if read_manifest(bundle) else verify_bundle(bundle)
    for line in result.lines:
        click.echo(line)
    sys.exit(0 if result.same else 1)


def register(cli: click.Group) -> None:
    """Add `audit` and `verify` to `cli`."""
    cli.add_command(audit)
    cli.add_command(verify)
