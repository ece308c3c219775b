"""dstack's event messages as data: template -> canonical event kind (reference 8.2).

The same messages reach us from the `events` table, from API exports and from "Emitting event"
log lines, so there is one catalogue for all of them. Each template names the dstack versions
that write it. Messages about runs/jobs that match no template are kept as `unrecognised`, so a
new dstack release shows up as a gap in the report instead of silently losing evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import polars as pl

S = r"[A-Z_]+"  # an enum NAME as events print it


@dataclass(frozen=True)
class Template:
    kind: str
    pattern: str  # anchored regex with named groups: old, new, reason, msg, dep, fields
    versions: str


EVENT_TEMPLATES: tuple[Template, ...] = (
    Template("run_submitted", rf"^Run submitted\. Status: (?P<new>{S})$", "0.20.0+"),
    Template(
        "run_status",
        rf"^Run status changed (?P<old>{S}) -> (?P<new>{S})"
        rf"(?:\. Termination reason: (?P<reason>{S}))?$",
        "0.20.0+",
    ),
    Template(
        "run_updated",
        r"^Run updated\. Deployment: (?P<dep>\d+)\. Changed fields: (?P<fields>.*)$",
        "0.20.8+",
    ),
    Template(
        "job_created",
        r"^Job created (?P<fields>on run submission|on new replica submission|"
        rf"when re-running replica|on new submission|on retry)\. Status: (?P<new>{S})$",
        "0.20.0+",
    ),
    Template(
        "job_status",
        rf"^Job status changed (?P<old>{S}) -> (?P<new>{S})"
        rf"(?:\. Termination reason: (?P<reason>{S})(?: \((?P<msg>.*)\))?)?$",
        "0.20.0+",
    ),
    Template("job_updated", r"^Job updated\. Deployment: (?P<dep>\d+)$", "0.20.8-0.20.16"),
    Template("job_ready", r"^Service replica ready to receive requests$", "0.21.1+"),
    Template(
        "job_registered",
        r"^Service replica registered(?: to receive requests| on gateway replica \d+)?$",
        "0.20.8+",
    ),
    Template(
        "job_unregistered",
        r"^Service replica unregistered(?: from receiving requests| from gateway replica \d+)?$",
        "0.20.8+",
    ),
    Template("graceful_stop", r"^Graceful job stop requested$", "0.20.19+"),
)

# Run/job messages that are understood and carry nothing the timeline needs.
KNOWN_IRRELEVANT: tuple[str, ...] = (
    r"^Job (?:assigned to|unassigned from) instance\b",
    r"^Instance (?:created|provisioned) for job\b",
    r"^Instance status: ",
    r"^Job became (?:un)?reachable$",
    r"^Fleet created for job\b",
    r"^Service (?:assigned to|registered|unregistered)\b",
    r"^Encountered service ",
    r"^Gateway error when unregistering service",
    r"^Run deleted$",
)

GROUPS = ("old", "new", "reason", "msg", "dep", "fields")


def tolerant(pattern: str) -> str:
    """A template that also matches text re-joined from rich's folded lines, where the space at
    a fold may have been dropped (reference 9.2): every literal space becomes optional."""
    return pattern.replace(" ", " ?")


def classify(
    message: pl.Expr,
    templates: tuple[Template, ...],
    irrelevant_patterns: tuple[str, ...],
    *,
    fold_tolerant: bool = False,
) -> dict[str, pl.Expr]:
    """Expressions for `kind` and the named groups of the first template that matches."""
    prepare = tolerant if fold_tolerant else str
    kind: pl.Expr = pl.lit(None, pl.String)
    for template in reversed(templates):
        kind = (
            pl.when(message.str.contains(prepare(template.pattern)))
            .then(pl.lit(template.kind))
            .otherwise(kind)
        )
    if irrelevant_patterns:
        # one regex of them all (each alternative anchored on its own): a regex is compiled
        # each time a query runs, and the catalogue runs once per input, so on a small input
        # compiling each pattern on its own cost more than matching them
        irrelevant = message.str.contains(
            "|".join(f"(?:{prepare(p)})" for p in irrelevant_patterns)
        )
        kind = pl.when(kind.is_null() & irrelevant).then(pl.lit("other")).otherwise(kind)
    fields: dict[str, pl.Expr] = {name: pl.lit(None, pl.String) for name in GROUPS}
    for template in templates:
        groups = [g for g in GROUPS if f"?P<{g}>" in template.pattern]
        if not groups:
            continue
        extracted = message.str.extract_groups(prepare(template.pattern))
        for group in groups:
            fields[group] = pl.coalesce(fields[group], extracted.struct.field(group))
    fields["kind"] = kind.fill_null("unrecognised")
    return fields


EVENT_COLUMNS = [
    "kind",
    "old_status",
    "new_status",
    "termination_reason",
    "termination_message",
    "deployment_num",
    "changed_fields",
]


def event_columns(fields: dict[str, pl.Expr]) -> list[pl.Expr]:
    return [
        fields["kind"].alias("kind"),
        fields["old"].str.to_lowercase().alias("old_status"),
        fields["new"].str.to_lowercase().alias("new_status"),
        fields["reason"].str.to_lowercase().replace("none", None).alias("termination_reason"),
        fields["msg"].alias("termination_message"),
        fields["dep"].cast(pl.Int64).alias("deployment_num"),
        fields["fields"].alias("changed_fields"),
    ]


def classify_unique(
    frame: pl.LazyFrame,
    column: str,
    templates: tuple[Template, ...],
    irrelevant_patterns: tuple[str, ...],
    *,
    fold_tolerant: bool = False,
) -> pl.LazyFrame:
    """Classify each distinct text once and join the result back: messages repeat a handful
    of templates millions of times, so this is what keeps the catalogue off the hot path."""
    columns = _classified_columns(column, templates, irrelevant_patterns, fold_tolerant)
    distinct = frame.select(pl.col(column)).unique().with_columns(columns)
    return frame.drop(EVENT_COLUMNS, strict=False).join(
        distinct, on=column, how="left", maintain_order="left", nulls_equal=True
    )


@lru_cache(maxsize=64)
def _classified_columns(
    column: str,
    templates: tuple[Template, ...],
    irrelevant_patterns: tuple[str, ...],
    fold_tolerant: bool,
) -> tuple[pl.Expr, ...]:
    """The event columns' expressions, built once per catalogue (a few ms each time)."""
    text = pl.col(column).str.strip_chars()
    fields = classify(text, templates, irrelevant_patterns, fold_tolerant=fold_tolerant)
    return tuple(event_columns(fields))


class KnownMessages:
    """``classify_unique`` over a stream of frames (a log's chunks): each distinct text is
    classified once, the first time it is seen, and looked up in every later frame, so a long
    log pays for the catalogue's regexes once per message, not once per chunk."""

    def __init__(
        self,
        templates: tuple[Template, ...],
        irrelevant_patterns: tuple[str, ...],
        *,
        fold_tolerant: bool = False,
    ) -> None:
        self.templates = templates
        self.irrelevant_patterns = irrelevant_patterns
        self.fold_tolerant = fold_tolerant
        self._known = pl.DataFrame(
            schema={"text": pl.String(), **{name: pl.String() for name in EVENT_COLUMNS}}
        ).with_columns(pl.col("deployment_num").cast(pl.Int64))

    def __len__(self) -> int:
        """How many distinct texts are known."""
        return self._known.height

    def classify(self, frame: pl.DataFrame, column: str) -> pl.DataFrame:
        """``classify_unique(frame, column, ...)``, collected."""
        distinct = frame.select(pl.col(column).alias("text")).unique()
        new = distinct.join(self._known.select("text"), on="text", how="anti", nulls_equal=True)
        if new.height:
            columns = _classified_columns(
                "text", self.templates, self.irrelevant_patterns, self.fold_tolerant
            )
            self._known = pl.concat([self._known, new.with_columns(columns)])
        return frame.drop(EVENT_COLUMNS, strict=False).join(
            self._known.rename({"text": column}),
            on=column,
            how="left",
            maintain_order="left",
            nulls_equal=True,
        )


def parse_event_messages(frame: pl.LazyFrame, *, fold_tolerant: bool = False) -> pl.LazyFrame:
    """Add kind, statuses, reason, message, deployment and changed fields from `message`."""
    return classify_unique(
        frame, "message", EVENT_TEMPLATES, KNOWN_IRRELEVANT, fold_tolerant=fold_tolerant
    )


def parse_event_messages_of(frame: pl.DataFrame) -> pl.DataFrame:
    """`parse_event_messages` of a collected frame: only `message` goes through the join and
    the parts are set beside the frame's own columns, which are not gathered again."""
    columns = _classified_columns("message", EVENT_TEMPLATES, KNOWN_IRRELEVANT, False)
    messages = frame.select("message")
    distinct = messages.unique().with_columns(columns)
    parts = messages.join(
        distinct, on="message", how="left", maintain_order="left", nulls_equal=True
    ).drop("message")
    return frame.drop(EVENT_COLUMNS, strict=False).hstack(parts)


# Log lines that are not "Emitting event" lines: `{run}: ...` / `{job}: ...` after the entity
# form `run(<6 hex>)name` (reference 9.4, 9.5). The body after "<entity>: " is matched.
ENTITY_LINE = (
    r"^(?P<etype>run|job)\((?P<hex>[0-9a-f]{6})\)(?P<name>[A-Za-z0-9._-]+): ?(?P<body>.*)$"
)

LOG_LINE_TEMPLATES: tuple[Template, ...] = (
    Template(
        "run_status",
        rf"^run status has changed (?P<old>{S}) -> (?P<new>{S})(?:, reason: (?P<reason>{S}))?$",
        "0.18-0.19.x",
    ),
    Template(
        "run_scaling",
        r"^scaling (?P<fields>UP|DOWN) (?P<msg>\d+) replica\(s\)(?: for group '.*')?$",
        "0.19.14-0.20.16",
    ),
    Template("job_status", r"^now is (?P<new>provisioning) on '.*'$", "0.18-0.19.x"),
    Template("job_status", rf"^now is (?P<new>{S})$", "0.18-0.19.x"),
    Template(
        "job_status",
        rf"^job status is (?P<new>{S}), reason: (?P<reason>{S}|None)$",
        "0.18-0.19.x",
    ),
    Template(
        "job_registered",
        r"^(?:service replica registered to receive requests, gateway=\w+"
        r"|replica is registered for service [0-9a-f]+)$",
        "0.19.14-0.20.7",
    ),
    Template(
        "job_unregistered",
        r"^(?:service replica unregistered from receiving requests, gateway=\w+"
        r"|replica is unregistered from service [0-9a-f]+)$",
        "0.19.14-0.20.7",
    ),
    Template("job_exit_status", r"^non-zero exit status (?P<msg>-?\d+)$", "0.18+"),
    Template("job_provisioned", r"^provisioned \d+ new instance\(s\)$", "0.18+"),
)

LOG_LINE_IRRELEVANT: tuple[str, ...] = (
    r"^run took [0-9.]+ seconds from submission to provisioning",
    r"^terminating \d+ replica\(s\) from removed group",
    r"^service is registered as ",
    r"^failed to unregister service",
    r"^instance '.*' has been released, new status is ",
    r"^.* launch in .* (?:failed|skipped): ",
    r"^failed (?:due to|because) ",
    r"^is unreachable, waiting for the instance",
    r"^failed to (?:submit|prepare run volumes|attach volume|register service replica)",
    r"^runner did not accept the job submission",
    r"^max duration exceeded",
    r"^could not stop container",
    r"^(?:stopping runner|stopping container|provisioning failed|failed to use specified "
    r"fleets|no fleet found|reuse instance failed)$",
    r"^GPU utilization check: terminating$",
    r"^terminating due to secrets interpolation error",
    r"^run processing error",
    r"^unexpected status ",
)

# DEBUG lines of scheduled_tasks/probes.py (0.19.22+), `fmt(probe)` = `probe(<6 hex>)<job_name>-
# <probe_num>` (services/logging.py, fmt_entity): `_execute_probe` logs "probe status code: N"
# (success is httpx's `is_success`, a 2xx) or "probe failed: <repr(error)>" (SSHError,
# httpx.RequestError), and `_process_probe_async` then adds one to `success_streak` or resets
# it to 0. Its "processing probe" / "probe processing took Ns" lines say nothing of the result.
PROBE_LINE = r"^probe\((?P<hex>[0-9a-f]{6})\)(?P<job>[A-Za-z0-9._-]+)-(?P<num>\d+): ?(?P<body>.*)$"
PROBE_STATUS_CODE = r"^probe status code: (?P<code>\d{3})$"
PROBE_FAILED = r"^probe failed: "
PROBE_IRRELEVANT = r"^(?:processing probe|probe processing took [0-9.e+-]+s)$"

# dstack lines without an entity prefix that carry nothing the timeline needs.
LOG_PLAIN_IRRELEVANT: tuple[str, ...] = (
    r"^Requesting instance offers from backends",
    r"^Created a new instance .* for job ",
    r"^The job .* switched instance .* status to ",
    r"^Instance .* (?:has switched to .* status|terminated|idle duration expired|has not started)",
    r"^Created instance ",
    r"^Terminated instance ",
    r"^Added \d+ instances to fleet",
    r"^Detaching volumes",
    r"^Force detaching volume",
    r"^shim failed to execute job ",
    r"^Failed to (?:connect to|configure) gateway replica",
    r"^Failed to \w+ \w+ item ",
    r"^Failed to heartbeat ",
    r"^Process(?:ing|ed) \w+ item ",
    r"^gateway\(",
    r"^Initializing the default configuration",
    r"^Applying .*config\.yml",
    r"^Configured the main project",
    r"^The admin token is ",
    r"^The dstack server .* is running at ",
)
