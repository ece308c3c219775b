"""Log records -> canonical events, with an account of every record.

Two kinds of dstack lines carry a run's story: "Emitting event: ..." lines (0.20.0+, the same
messages as the events table) and the older `{run}: ...` / `{job}: ...` status lines (0.19.x,
and a few pipeline-era lines). Every other dstack line is either known and irrelevant, or
counted as unrecognised by its template shape, so a new dstack release shows up as a gap.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

import analyzer.catalogue as catalogue
from analyzer.model import EVENTS_SCHEMA, UTC_TIME
from analyzer.sources.logs.masking import RecordRun, redact_record_run
from analyzer.sources.logs.quiet import SetAside
from analyzer.sources.logs.reader import detached

EVENT_LINE = (
    r"^Emitting ?event: ?(?P<body>.*)\. ?Event ?targets: ?(?P<targets>.*)\. ?Actor: ?"
    r"(?P<actor>system|user\([0-9a-f]{6}\)\S*)\s*$"
)
TARGET = r"(run|job)\(([0-9a-f]{6})\)([A-Za-z0-9._-]+)"
EVENT_PREFIX = "Emitting event: "
TARGETS_SEPARATOR = ". Event targets: "
ACTOR_SEPARATOR = ". Actor: "
ACTOR = r"^(?:system|user\([0-9a-f]{6}\)\S*)$"
ADMIN_TOKEN = r"The admin token is (\S+)"
EVENT_START = r"^Emitting ?event:"
SERVER_VERSION = r"The dstack server (?P<version>\S+) is running at"

# What each kind of line says about the server version (reference sections 0 and 9.6).
VERSION_MARKERS: tuple[tuple[str, str, str], ...] = (
    (EVENT_START, "0.20.0", ""),
    (r"run status has changed|now is [A-Z_]+$|job status is [A-Z_]+, reason", "", "0.19.40"),
    (r"Run ?updated\. ?Deployment:", "0.20.8", ""),
    (r"Job ?created ?on ?retry", "0.20.14", ""),
    (r"Service ?replica ?ready ?to ?receive ?requests", "0.21.1", ""),
    (r"Service ?replica ?registered ?to ?receive ?requests\. ?Event", "0.20.8", "0.21.0"),
    (r"Job ?created ?on ?new ?replica ?submission|Job ?created ?when ?re-running", "", "0.20.16"),
)
LOGGER_MARKERS: tuple[tuple[str, str, str], ...] = (
    (r"\.background\.tasks\.", "", "0.20.9"),
    (r"\.background\.scheduled_tasks\.", "0.20.10", "0.20.16"),
    (r"\.background\.pipeline_tasks\.", "0.20.13", ""),
)


# What can make a one-line record more to the audit than its level and time: every line these
# match holds one of MATTER_WORDS (analyzer.magic, where the command sizing polars reads them
# too; tests/test_log_reader.py generates lines of every pattern).
MATTER_TEXT_PATTERNS: tuple[str, ...] = (
    EVENT_START,
    r"^(?:run|job)\([0-9a-f]{6}\)",
    SERVER_VERSION,
    ADMIN_TOKEN,
    *(pattern for pattern, _, _ in VERSION_MARKERS),
)
MATTER_LOGGER_PATTERNS: tuple[str, ...] = (
    r"^dstack",
    *(pattern for pattern, _, _ in LOGGER_MARKERS),
)


# What ``finish`` and the events frame need of a kept line (the rest, the line's whole text
# above all, would only be copied and dropped by the events schema).
_KEPT_COLUMNS = (
    *(name for name in EVENTS_SCHEMA if name not in ("time", "time_text", "time_basis")),
    "file",
    "line",
    "local_time",
    "time_of_day",
    "day_offset",
    "wrapper_time",
)


# A record's own columns that the kept events carry (its place and times).
_PLACE_COLUMNS = ("file", "line", "local_time", "time_of_day", "day_offset", "wrapper_time")
_PLACE = pl.format("{}:{}", pl.col("file"), pl.col("line")).alias("place")
_COMPACT_ROWS = 200_000  # kept rows (about 40 MB) before identical records are folded
_PLACES_KEPT = 16  # places of one repeated record kept as its provenance
# what tells two kept records apart most often (their times, entity and message), tested first
# (not the kind: a rich log's times are whole seconds, in which a job can change status twice)
_UNIQUE_FIRST = ("local_time", "time_of_day", "day_offset", "wrapper_time", "entity_id", "message")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


@dataclass
class LogFacts:
    """What the log's records were, counted, and what the log says about its server."""

    records: int = 0
    relevant: int = 0
    irrelevant: int = 0
    unrecognised: int = 0
    unrecognised_shapes: dict[str, int] = field(default_factory=dict)
    unrecognised_first: dict[str, str] = field(default_factory=dict)  # shape -> file:line
    server_version: str | None = None
    levels: dict[str, int] = field(default_factory=dict)
    ambiguous_jobs: int = 0  # jobs that more than one same-name run could own
    last_time: datetime | None = None  # the latest line's time, as written (any line, kept or not)
    repeated_records: int = 0  # identical to an earlier record: kept once (EventCollector)
    probe_lines_unattributed: int = 0  # probe results naming a job no line of the log names


def _shape(message: pl.Expr) -> pl.Expr:
    """A line's template shape: ids, names, numbers and quoted text replaced by placeholders.
    Its first 200 characters, cut at a space (never inside a token a later redaction must see
    whole)."""
    cut = (
        pl.when(message.str.len_chars() > 200)
        .then(message.str.slice(0, 200).str.replace(r"\S+$", "…"))
        .otherwise(message)
    )
    return (
        cut.str.replace_all(
            r"\b(run|job|instance|fleet|gateway|user|project)\([0-9a-f]{6}\)[A-Za-z0-9._-]+",
            "$1(…)",
        )
        .str.replace_all(r"'[^']*'", "'…'")
        .str.replace_all(r"[0-9a-f]{32}|[0-9a-f-]{36}", "<id>")
        .str.replace_all(r"\d+(\.\d+)?", "N")
    )


def records_to_events(
    records: pl.DataFrame, source: str, server: str
) -> tuple[pl.DataFrame, LogFacts]:
    """The events and facts of one log's records held at once (see ``EventCollector``)."""
    collector = EventCollector(source, server)
    collector.add(records)
    return collector.finish()


SERVICE_REGISTERED = "service is registered as "


# The catalogue's answer for each distinct text, shared by the logs one thread reads (a text is
# classified alike in every log): the next log of an audit (another format, a rotated file)
# pays for none of the texts classified already. Not kept past this many texts.
_SHARED_KNOWN_TEXTS = 20_000
_shared = threading.local()


def _known_messages() -> tuple[catalogue.KnownMessages, catalogue.KnownMessages]:
    """The event lines' and the run and job lines' known messages of this thread."""
    known = getattr(_shared, "known", None)
    if known is None:
        known = _shared.known = (
            catalogue.KnownMessages(
                catalogue.EVENT_TEMPLATES, catalogue.KNOWN_IRRELEVANT, fold_tolerant=True
            ),
            catalogue.KnownMessages(
                catalogue.LOG_LINE_TEMPLATES, catalogue.LOG_LINE_IRRELEVANT, fold_tolerant=True
            ),
        )
    return known


class EventCollector:
    """A log's records, chunk after chunk, reduced to what the audit keeps: the event and
    status lines (with their places), counts of every other kind, the unrecognised lines'
    template shapes with their counts and first places, and the version markers seen. Memory
    grows with the kept events, never with the log's other lines."""

    def __init__(self, source: str, server: str) -> None:
        self.source = source
        self.server = server
        self.facts = LogFacts()
        self._kept: list[pl.DataFrame] = []
        self._kept_rows = 0
        self._compact_at = _COMPACT_ROWS
        self._shapes: dict[str, list] = {}  # shape -> [count, first place]
        self._explicit_version: str | None = None
        self._markers: set[int] = set()
        self._record_run = RecordRun()  # a secret left open by one chunk for the next
        self._events, self._lines = _known_messages()

    def add(self, records: pl.DataFrame, aside: SetAside | None = None) -> None:
        """One chunk's records, and the irrelevant one-line records set aside from it
        (``LogStream.chunks``): counted, and numbered in the sequence as if read."""
        facts = self.facts
        seq_offset = facts.records
        if aside is not None and aside.height:
            self._count_set_aside(aside)
        if records.height == 0:
            return
        self._count_records(records)
        seq = pl.int_range(pl.len(), dtype=pl.Int64) + seq_offset
        if aside is not None and aside.height:
            seq = seq + aside.lines.search_sorted(records["line"]).cast(pl.Int64)
        frame = records.select(
            seq.alias("seq"),
            *_PLACE_COLUMNS,
            pl.col("message").str.strip_chars().alias("text"),
            pl.col("logger").fill_null("").alias("logger"),
        ).with_columns(pl.col("text").str.contains(EVENT_START).alias("is_event"))
        # an entity line never opens with "Emitting": only the other lines are matched
        lines = frame.filter(~pl.col("is_event"))
        entity = pl.col("text").str.extract_groups(catalogue.ENTITY_LINE)
        lines = lines.with_columns(
            entity.struct.field("etype").alias("line_etype"),
            entity.struct.field("hex").alias("line_hex"),
            entity.struct.field("name").alias("line_name"),
            entity.struct.field("body").alias("line_body"),
        )

        events = _event_lines(
            frame.filter(pl.col("is_event")).drop("is_event", "logger"), self._events
        )
        status = _status_lines(
            lines.filter(pl.col("line_etype").is_not_null()).drop("is_event", "logger"),
            self._lines,
        )
        plain = lines.filter(pl.col("line_etype").is_null()).with_columns(
            pl.col("text").str.extract_groups(catalogue.PROBE_LINE).alias("_probe")
        )
        probes = _probe_lines(plain.filter(pl.col("_probe").struct.field("hex").is_not_null()))
        plain = plain.filter(pl.col("_probe").struct.field("hex").is_null()).drop("_probe")

        # the known patterns as one regex: polars keeps a thread's last 32 regexes compiled,
        # and twenty of their own, compiled anew for each chunk, cost a small log a millisecond
        plain_known = plain.select(
            pl.col("text").str.contains(_either(catalogue.LOG_PLAIN_IRRELEVANT)).alias("known"),
            (pl.col("logger").str.starts_with("dstack") | (pl.col("logger") == "")).alias("dstack"),
            pl.col("text"),
            "seq",
            _PLACE,
        )
        unrecognised = pl.concat(
            [
                plain_known.filter(~pl.col("known") & pl.col("dstack")).select(
                    "text", "seq", "place"
                ),
                status.filter(pl.col("kind") == "unrecognised").select("text", "seq", _PLACE),
                events.filter(pl.col("kind") == "unrecognised").select(
                    pl.col("message").alias("text"), "seq", _PLACE
                ),
                probes.filter(pl.col("kind") == "unrecognised").select("text", "seq", _PLACE),
            ]
        ).sort("seq")
        facts.unrecognised += unrecognised.height
        if unrecognised.height:
            # secret shapes masked in the raw text, before templating can hide them, also
            # one split across the record's lines or over records (a key block, a label and
            # its value), in the order they were written
            unrecognised = unrecognised.with_columns(
                redact_record_run(unrecognised["text"], self._record_run)
            )
            shapes = unrecognised.group_by(_shape(pl.col("text")).alias("shape")).agg(
                pl.len(), pl.col("place").first()
            )
            for shape, count, place in shapes.iter_rows():
                known = self._shapes.setdefault(shape, [0, place])
                known[0] += count

        # "other" run/job events stay: they tell a service from a task ("Service ..." messages),
        # and so does 0.19's `{run}: service is registered as <url>` (services.register_service).
        kept_status = ~pl.col("kind").is_in(["other", "unrecognised"]) | (
            (pl.col("kind") == "other") & pl.col("message").str.starts_with(SERVICE_REGISTERED)
        )
        relevant = pl.concat(
            [events, status.filter(kept_status), probes.filter(pl.col("kind") != "other")],
            how="diagonal_relaxed",
        )
        kept = [name for name in _KEPT_COLUMNS if name in relevant.columns]
        # only the kept columns are filtered (not the lines' whole text, nor what it was cut
        # into); eagerly: polars' lazy filter of these concatenated string views made views
        # that a later string function over them failed on (tests/test_integrity.py's fuzzing)
        relevant = relevant.select(kept).filter(pl.col("kind") != "unrecognised")
        lifecycle = pl.col("seq").filter(pl.col("kind") != "other")
        relevant_here = relevant.select(lifecycle.n_unique()).item()
        facts.relevant += relevant_here
        facts.irrelevant += records.height - relevant_here - unrecognised.height
        explicit, markers = _version_markers(frame, self._markers)
        self._explicit_version = explicit or self._explicit_version
        self._markers |= markers
        if relevant.height:
            # the places are written anew (format), so only the kept columns need their own
            # text; unless most of the chunk is kept and nothing was set aside from it: the
            # chunk's text is then mostly theirs, and a copy would only double it for a while
            mostly_kept = relevant.height * 2 >= records.height and not (aside and aside.height)
            self._kept.append(
                (relevant if mostly_kept else detached(relevant)).with_columns(
                    relevant.select(pl.concat_list([_PLACE]).alias("places"))
                )
            )
            self._kept_rows += relevant.height
            if self._kept_rows >= self._compact_at:
                self._compact()

    def _compact(self) -> None:
        """Identical records (the same line twice: an overlapping rotated file, a log
        concatenated with itself) kept once, with their places (up to ``_PLACES_KEPT``) as
        provenance: memory grows with the distinct events, not with the copies. The next
        compaction waits until the kept rows have doubled, so each row is grouped O(1) times."""
        frame = pl.concat(self._kept, how="diagonal_relaxed")
        key = [c for c in frame.columns if c not in ("seq", "file", "line", "places")]
        # records unique in a few of the key's columns are unique in all of them: that cheap
        # test first, the whole key only when it finds a pair
        few = [c for c in _UNIQUE_FIRST if c in key]
        if (
            frame.select(pl.struct(few).is_unique().all()).item()
            or frame.select(pl.struct(key).is_unique().all()).item()
        ):
            compacted = frame
        else:
            compacted = (
                frame.group_by(key, maintain_order=True)
                .agg(
                    pl.col("seq").min(),
                    pl.col("file").first(),
                    pl.col("line").min(),
                    pl.col("places")
                    .list.explode(keep_nulls=False, empty_as_null=False)
                    .head(_PLACES_KEPT),
                )
                .select(frame.columns)
            )
            seqs = pl.col("seq").n_unique()
            self.facts.repeated_records += frame.select(seqs).item() - compacted.select(seqs).item()
        self._kept = [compacted]
        self._kept_rows = compacted.height
        self._compact_at = max(_COMPACT_ROWS, 2 * compacted.height)

    def _count_records(self, records: pl.DataFrame) -> None:
        facts = self.facts
        facts.records += records.height
        latest = records.select(_times()[0])["time"].max()
        if latest is not None and (facts.last_time is None or latest > facts.last_time):
            facts.last_time = latest
        for level, count in records.group_by("level", maintain_order=True).len().iter_rows():
            facts.levels[level] = facts.levels.get(level, 0) + count

    def _count_set_aside(self, aside: SetAside) -> None:
        """``_count_records`` of set-aside records (their levels' counts and latest times)."""
        facts = self.facts
        facts.records += aside.height
        facts.irrelevant += aside.height
        latest = aside.levels["latest"].max()
        if latest is not None and (facts.last_time is None or latest > facts.last_time):
            facts.last_time = latest
        for level, count in aside.levels.select("level", "lines").iter_rows():
            facts.levels[level] = facts.levels.get(level, 0) + count

    def finish(self) -> tuple[pl.DataFrame, LogFacts]:
        facts = self.facts
        if max(len(self._events), len(self._lines)) > _SHARED_KNOWN_TEXTS:
            _shared.known = None  # a busy log's many texts are not held after it
        ordered = sorted(self._shapes.items(), key=lambda item: -item[1][0])
        facts.unrecognised_shapes = {shape: count for shape, (count, _) in ordered}
        facts.unrecognised_first = {shape: place for shape, (_, place) in ordered}
        facts.server_version = _fingerprint(self._explicit_version, self._markers)
        if facts.records == 0:
            return pl.DataFrame(), facts
        if self._kept:
            self._compact()
        relevant = self._kept[0] if self._kept else pl.DataFrame()
        if relevant.height == 0:
            return relevant, facts
        out = relevant.rename({"places": "provenance"}).with_columns(
            pl.lit(self.server).alias("server"),
            pl.lit(self.source).alias("source"),
            *_times(every_local=relevant["local_time"].null_count() == 0),
        )
        out, facts.probe_lines_unattributed = _attach_probe_results(out)
        attached = _attach_job_runs(out)
        if "ambiguous_run" in attached.columns:
            ambiguous = attached.filter(pl.col("ambiguous_run").fill_null(False))
            facts.ambiguous_jobs = (
                ambiguous.select("entity_id").n_unique() if ambiguous.height else 0
            )
            attached = attached.drop("ambiguous_run")
        return attached, facts


def _times(*, every_local: bool = False) -> list[pl.Expr]:
    """A record's time, its basis and its text as written. `every_local`: every record has
    its local time (a standard or json log), the whole of its text (the text of a time of day
    alone is not worked out)."""
    pseudo_day = pl.datetime(1970, 1, 1, time_zone="UTC") + pl.duration(
        days=pl.col("day_offset").fill_null(0)
    )
    time_of_day = pl.col("time_of_day").cast(pl.Duration("us"))
    local_text = pl.col("local_time").dt.to_string("%Y-%m-%d %H:%M:%S%.3f")
    return [
        pl.when(pl.col("wrapper_time").is_not_null())
        .then(pl.col("wrapper_time"))
        .when(pl.col("local_time").is_not_null())
        .then(pl.col("local_time").cast(pl.Datetime("us")).dt.replace_time_zone("UTC"))
        .when(pl.col("time_of_day").is_not_null())
        .then(pseudo_day + time_of_day)
        .cast(UTC_TIME)
        .alias("time"),
        pl.when(pl.col("wrapper_time").is_not_null())
        .then(pl.lit("log_wrapper_utc"))
        .when(pl.col("local_time").is_not_null())
        .then(pl.lit("log_local_unaligned"))
        .otherwise(pl.lit("time_of_day_only"))
        .alias("time_basis"),
        (
            local_text
            if every_local
            else pl.coalesce(
                local_text,
                pl.col("time_of_day").dt.to_string("%H:%M:%S")
                + pl.when(pl.col("day_offset").fill_null(0) > 0)
                .then(pl.format(" (+{} days)", pl.col("day_offset")))
                .otherwise(pl.lit("")),
            )
        ).alias("time_text"),
    ]


def _split_event_lines(frame: pl.DataFrame) -> pl.DataFrame:
    """Body, targets and actor of "Emitting event" lines. Literal cuts first (the common case,
    fast); the fold-tolerant regex only for lines they cannot cut (rich joins that lost a
    space) and for lines that are not ASCII: ``str.find`` counts bytes and ``str.slice``
    characters, so a cut of such a line can miss (a body of 13 extra UTF-8 bytes made
    ``user(abcdef)zsystem`` the actor ``system``)."""
    text = pl.col("text")
    targets_at, actor_at = pl.col("_targets_at"), pl.col("_actor_at")
    # each separator found once (an expression used in several columns is worked out for each)
    fast = (
        frame.with_columns(
            text.str.find(TARGETS_SEPARATOR, literal=True).alias("_targets_at"),
            text.str.find(ACTOR_SEPARATOR, literal=True).alias("_actor_at"),
        )
        .with_columns(
            text.str.slice(len(EVENT_PREFIX), targets_at - len(EVENT_PREFIX)).alias("message"),
            text.str.slice(
                targets_at + len(TARGETS_SEPARATOR),
                actor_at - targets_at - len(TARGETS_SEPARATOR),
            ).alias("_targets"),
            text.str.slice(actor_at + len(ACTOR_SEPARATOR)).str.strip_chars().alias("actor"),
        )
        .with_columns(
            (
                text.str.starts_with(EVENT_PREFIX)
                & (text.str.len_bytes() == text.str.len_chars())
                & (actor_at > targets_at)
                & pl.col("actor").str.contains(ACTOR)
            )
            .fill_null(False)
            .alias("_cut")
        )
        .drop("_targets_at", "_actor_at")
    )
    if bool(fast["_cut"].all()):
        return fast.drop("_cut")
    slow = fast.filter(~pl.col("_cut")).drop("message", "_targets", "actor")
    parts = text.str.extract_groups(EVENT_LINE)
    slow = slow.with_columns(
        parts.struct.field("body").alias("message"),
        parts.struct.field("targets").alias("_targets"),
        parts.struct.field("actor").alias("actor"),
    )
    return pl.concat([fast.filter(pl.col("_cut")), slow], how="diagonal_relaxed").drop("_cut")


def _event_lines(frame: pl.DataFrame, known: catalogue.KnownMessages) -> pl.DataFrame:
    lines = _split_event_lines(frame).with_columns(
        pl.col("_targets").str.extract_all(TARGET).alias("target")
    )
    broken = lines.filter(pl.col("message").is_null())
    targeted = (
        lines.filter(pl.col("message").is_not_null())
        .explode("target")
        .filter(pl.col("target").is_not_null())
    )
    # every target matched TARGET whole: "run" or "job", "(", 6 hex, ")", the name
    targeted = targeted.with_columns(
        pl.col("target").str.slice(0, 3).alias("entity_type"),
        pl.col("target").str.slice(4, 6).alias("entity_id"),
        pl.col("target").str.slice(11).alias("entity_name"),
        pl.col("actor").str.replace(r"^user\([0-9a-f]{6}\)", "user "),
    )
    parsed = known.classify(targeted, "message")
    unparsed_events = broken.select("seq", pl.col("text").alias("message")).with_columns(
        pl.lit("unrecognised").alias("kind")
    )
    return pl.concat([parsed, unparsed_events], how="diagonal_relaxed").with_columns(
        pl.when(pl.col("entity_type") == "run").then(pl.col("entity_id")).alias("run_id"),
        pl.lit("event_line").alias("origin"),
    )


def _status_lines(frame: pl.DataFrame, known: catalogue.KnownMessages) -> pl.DataFrame:
    body = pl.col("line_body")
    classified = known.classify(frame, "line_body")
    return classified.with_columns(
        pl.col("line_etype").alias("entity_type"),
        pl.col("line_hex").alias("entity_id"),
        pl.col("line_name").alias("entity_name"),
        pl.when(pl.col("line_etype") == "run").then(pl.col("line_hex")).alias("run_id"),
        body.alias("message"),
        pl.lit("system").alias("actor"),
        pl.lit("status_line").alias("origin"),
    )


PROBE_RESULTS = ("probe_passed", "probe_failed")


def _probe_lines(frame: pl.DataFrame) -> pl.DataFrame:
    """DEBUG probe lines (catalogue.PROBE_LINE): a 2xx status code passed, any other code or
    a failure to connect failed (scheduled_tasks/probes.py, `_execute_probe`); the job is the
    one named, told from the job lines later (``_attach_probe_results``)."""
    parts = pl.col("_probe")
    body = parts.struct.field("body")
    code = body.str.extract(catalogue.PROBE_STATUS_CODE, 1).cast(pl.Int64)
    kind = (
        pl.when(code.is_between(200, 299))
        .then(pl.lit("probe_passed"))
        .when(code.is_not_null() | body.str.contains(catalogue.PROBE_FAILED))
        .then(pl.lit("probe_failed"))
        .when(body.str.contains(catalogue.PROBE_IRRELEVANT))
        .then(pl.lit("other"))
        .otherwise(pl.lit("unrecognised"))
    )
    columns = [
        "seq",
        *_PLACE_COLUMNS,
        "text",
        kind.alias("kind"),
        pl.lit("job").alias("entity_type"),
        pl.lit(None, pl.String).alias("entity_id"),
        parts.struct.field("job").alias("entity_name"),
        pl.format("{}-{}", parts.struct.field("job"), parts.struct.field("num")).alias("probe"),
        body.alias("message"),
        pl.lit("system").alias("actor"),
        pl.lit("status_line").alias("origin"),
    ]
    if frame.height == 0:  # most logs: the columns alone, without compiling the regexes
        return pl.DataFrame(schema=frame.lazy().select(columns).collect_schema())
    return frame.select(columns)


def _attach_probe_results(events: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Each probe result given to its job: a probe line names its job by name only, and a
    slot's name is reused by every submission. dstack probes only RUNNING jobs
    (scheduled_tasks/probes.py, `process_probes`) and a run holds one active job of a name,
    so the job is the one of that name whose RUNNING line came last before the result; where
    the log writes no RUNNING line (0.19), the job of that name seen last before it, or first
    after it (a log that starts late). Results naming no job of the log are counted, dropped."""
    is_result = pl.col("kind").is_in(PROBE_RESULTS)
    results = events.filter(is_result & pl.col("entity_id").is_null())
    if results.height == 0:
        return events, 0
    jobs = events.filter((pl.col("entity_type") == "job") & ~is_result)
    running = (pl.col("kind") == "job_status") & (pl.col("new_status") == "running")
    lines = jobs.select("entity_name", pl.col("seq").alias("_at"), "entity_id")
    results = results.sort("seq").drop("entity_id")
    for right, strategy, alias in (
        (lines.filter(jobs.select(running.fill_null(False)).to_series()), "backward", "_a"),
        (lines, "backward", "_b"),
        (lines, "forward", "_c"),
    ):
        results = results.join_asof(
            right.rename({"entity_id": alias}).sort("_at"),
            left_on="seq",
            right_on="_at",
            by="entity_name",
            strategy=strategy,
            check_sortedness=False,
        ).drop("_at")
    results = results.with_columns(pl.coalesce("_a", "_b", "_c").alias("entity_id")).drop(
        "_a", "_b", "_c"
    )
    attached = results.filter(pl.col("entity_id").is_not_null())
    return (
        pl.concat([events.filter(~is_result), attached.select(events.columns)]).sort("seq"),
        results.height - attached.height,
    )


def _attach_job_runs(events: pl.DataFrame) -> pl.DataFrame:
    """A job line names no run. Of the runs with the job's name prefix that are alive when the
    job first appears (submitted, not yet finished), the job belongs to the one whose last
    job-creating event (submission, update, scaling, resubmission) came last: dstack creates
    jobs in the same pass as that event. All the job's lines then follow its id. Two runs may
    share a name (other projects, re-submissions): their prefixes keep them apart.

    Not analyzer.sources.attach: a log has no run or job rows (no job ids of runs, no
    submitted_at/last_processed_at), only its own lines in order, so a run's life here is the
    sequence of its lines, and a guess among several live runs is marked ambiguous."""
    if events.height == 0:
        return events
    run_events = events.filter(pl.col("entity_type") == "run").select(
        pl.col("entity_id").alias("_run"),
        pl.col("entity_name").alias("_run_name"),
        pl.col("seq").alias("_seq"),
        "kind",
        "new_status",
        pl.col("time").alias("_time"),
    )
    stopping = (pl.col("kind") == "job_status") & pl.col("new_status").is_in(
        ["terminating", "terminated", "failed", "done", "aborted"]
    )
    jobs = (
        events.filter(pl.col("entity_type") == "job")
        .group_by("entity_id", "entity_name")
        .agg(
            pl.col("seq").min().alias("_first"),
            pl.col("time").min().alias("_first_time"),
            pl.col("seq").filter(stopping).min().alias("_stop"),
            pl.col("changed_fields").filter(pl.col("kind") == "job_created").first().alias("_how"),
        )
        .with_columns(pl.col("entity_name").str.replace(r"-\d+-\d+$", "").alias("_run_name"))
    )
    if run_events.height == 0 or jobs.height == 0:
        return events
    finished = pl.col("new_status").is_in(["terminated", "failed", "done"])
    lives = run_events.group_by("_run", "_run_name").agg(
        pl.col("_seq").min().alias("_start"),
        pl.col("_seq").filter((pl.col("kind") == "run_status") & finished).min().alias("_end"),
    )
    creating = run_events.filter(
        pl.col("kind").is_in(["run_submitted", "run_updated", "run_scaling"])
        | ((pl.col("kind") == "run_status") & pl.col("new_status").is_in(["pending", "submitted"]))
    ).select("_run", pl.col("_seq").alias("_created"), pl.col("_time").alias("_created_time"))
    candidates = (
        jobs.join(lives, on="_run_name")
        .filter(
            (pl.col("_start") <= pl.col("_first"))
            & (pl.col("_end").is_null() | (pl.col("_end") >= pl.col("_first")))
        )
        .join(creating, on="_run")
        .filter(pl.col("_created") <= pl.col("_first"))
    )
    # Jobs created with their run's submission are certain (same pass, same instant). A run
    # never holds two active jobs of one name: a candidate that already has an active job of
    # this name (one of its certain ones) cannot be the owner of another.
    certain = (
        candidates.filter(
            (pl.col("_how") == "on run submission")
            & (pl.col("_created_time") == pl.col("_first_time"))
        )
        .select(
            "_run",
            pl.col("entity_name").alias("_name"),
            pl.col("_first").alias("_k_first"),
            pl.col("_stop").alias("_k_stop"),
            pl.col("entity_id").alias("_k_id"),
        )
        .unique()
    )
    busy = (
        candidates.select("entity_id", "entity_name", "_run", "_first")
        .unique()
        .join(certain, left_on=["_run", "entity_name"], right_on=["_run", "_name"])
        .filter(
            (pl.col("_k_id") != pl.col("entity_id"))
            & (pl.col("_k_first") < pl.col("_first"))
            & (pl.col("_k_stop").is_null() | (pl.col("_k_stop") > pl.col("_first")))
        )
        .select("entity_id", "entity_name", "_run")
        .unique()
    )
    candidates = candidates.join(busy, on=["entity_id", "entity_name", "_run"], how="anti")
    candidates = (
        candidates.sort("_created")
        .group_by("entity_id", "entity_name", "_run")
        .agg(
            pl.col("_created").last(), pl.col("_created_time").last(), pl.col("_first_time").first()
        )
        .sort("_created", descending=True)
        .group_by("entity_id", "entity_name", maintain_order=True)
        .agg(
            pl.col("_run").first().alias("_alive_owner"),
            # created in the same pass (same instant) as its run's event: no doubt left
            (
                (pl.len() > 1) & (pl.col("_created_time").first() != pl.col("_first_time").first())
            ).alias("_ambiguous"),
        )
    )
    earlier = (
        jobs.sort("_first")
        .join_asof(
            run_events.sort("_seq").select("_run_name", "_seq", pl.col("_run").alias("_seen")),
            left_on="_first",
            right_on="_seq",
            by="_run_name",
            strategy="backward",
            check_sortedness=False,
        )
        .select("entity_id", "entity_name", "_seen")
    )
    first_run = run_events.sort("_seq").group_by("_run_name").agg(pl.col("_run").first())
    owners = (
        jobs.select("entity_id", "entity_name", "_run_name")
        .join(candidates, on=["entity_id", "entity_name"], how="left", maintain_order="left")
        .join(earlier, on=["entity_id", "entity_name"], how="left", maintain_order="left")
        .join(first_run, on="_run_name", how="left", maintain_order="left")
        .select(
            "entity_id",
            "entity_name",
            pl.coalesce("_alive_owner", "_seen", "_run").alias("_owner"),
        )
    )
    ambiguous = candidates.filter(pl.col("_ambiguous")).select(
        "entity_id", pl.lit(True).alias("ambiguous_run")
    )
    job_mask = pl.col("entity_type") == "job"
    return (
        events.join(owners, on=["entity_id", "entity_name"], how="left", maintain_order="left")
        .join(ambiguous, on="entity_id", how="left", maintain_order="left")
        .with_columns(
            pl.when(job_mask).then(pl.col("_owner")).otherwise(pl.col("run_id")).alias("run_id")
        )
        .drop("_owner")
        .sort("seq")
    )


def _version_markers(frame: pl.DataFrame, found: set[int]) -> tuple[str | None, set[int]]:
    """What one chunk's records say about the version: the last explicit version line, and
    which markers (indexes into VERSION_MARKERS + LOGGER_MARKERS) occur. Markers already
    ``found`` in earlier chunks are not searched again; the event marker is the frame's
    ``is_event`` (the same pattern); the loggers' over their distinct names; the text's are one
    query over the lines holding any."""
    text = pl.col("text")
    logger = pl.col("logger")
    present = set()
    texts = []
    for i, (pattern, _, _) in enumerate(VERSION_MARKERS):
        if i in found:
            continue
        if pattern == EVENT_START:
            if frame["is_event"].any():
                present.add(i)
        else:
            texts.append((i, pattern))
    loggers = [
        (len(VERSION_MARKERS) + i, p)
        for i, (p, _, _) in enumerate(LOGGER_MARKERS)
        if len(VERSION_MARKERS) + i not in found
    ]
    if loggers:  # a chunk's loggers are a handful of names: each searched once
        names = frame.select(logger.unique())
        row = names.select(logger.str.contains(p).any().alias(str(i)) for i, p in loggers)
        present |= {int(index) for index, hit in row.row(0, named=True).items() if hit}
    # the few lines that hold any text marker first (one pass over the text)
    lines = frame.filter(text.str.contains(_either([SERVER_VERSION, *(p for _, p in texts)])))
    if lines.height == 0:
        return None, present
    checks = [text.str.extract(SERVER_VERSION, 1).drop_nulls().last().alias("explicit")]
    checks += [text.str.contains(p).any().alias(str(i)) for i, p in texts]
    row = lines.select(checks).row(0, named=True)
    explicit = row.pop("explicit")
    return explicit, present | {int(index) for index, hit in row.items() if hit}


def _either(patterns: Iterable[str]) -> str:
    """One regex that matches where any of ``patterns`` does."""
    return "|".join(f"(?:{pattern})" for pattern in patterns)


def _fingerprint(explicit: str | None, markers: set[int]) -> str | None:
    """The dstack version range the log's lines fit (narrowest of every marker found)."""
    if explicit:
        return explicit
    low, high = "0.18.0", ""
    for index, (_, minimum, maximum) in enumerate(VERSION_MARKERS + LOGGER_MARKERS):
        if index in markers:
            low, high = _narrow(low, high, minimum, maximum)
    if low == "0.18.0" and not high:
        return None
    return f"{low}-{high}" if high and high != low else (low if high else f">={low}")


def _narrow(low: str, high: str, minimum: str, maximum: str) -> tuple[str, str]:
    if minimum and _version_key(minimum) > _version_key(low):
        low = minimum
    if maximum and (not high or _version_key(maximum) < _version_key(high)):
        high = maximum
    return low, high
