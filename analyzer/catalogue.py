"""dstack's event messages as data: template -> canonical event kind (reference 8.2).

The same messages reach us from the `events` table, from API exports and from "Emitting event"
log lines, so there is one catalogue for all of them. Each template names the dstack versions
that write it. Messages about runs/jobs that match no template are kept as `unrecognised`, so a
new dstack release shows up as a gap in the report instead of silently losing evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def parse_event_messages(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Add kind, statuses, reason, message, deployment and changed fields from `message`."""
    message = pl.col("message").str.strip_chars()
    kind: pl.Expr = pl.lit(None, pl.String)
    for template in reversed(EVENT_TEMPLATES):
        kind = (
            pl.when(message.str.contains(template.pattern))
            .then(pl.lit(template.kind))
            .otherwise(kind)
        )
    irrelevant = pl.any_horizontal([message.str.contains(p) for p in KNOWN_IRRELEVANT])
    kind = pl.when(kind.is_null() & irrelevant).then(pl.lit("other")).otherwise(kind)
    kind = kind.fill_null("unrecognised")

    fields: dict[str, pl.Expr] = {name: pl.lit(None, pl.String) for name in GROUPS}
    for template in EVENT_TEMPLATES:
        groups = [g for g in GROUPS if f"?P<{g}>" in template.pattern]
        if not groups:
            continue
        extracted = message.str.extract_groups(template.pattern)
        for group in groups:
            fields[group] = pl.coalesce(fields[group], extracted.struct.field(group))
    return frame.with_columns(
        kind.alias("kind"),
        fields["old"].str.to_lowercase().alias("old_status"),
        pl.coalesce(fields["new"]).str.to_lowercase().alias("new_status"),
        fields["reason"].str.to_lowercase().alias("termination_reason"),
        fields["msg"].alias("termination_message"),
        fields["dep"].cast(pl.Int64).alias("deployment_num"),
        fields["fields"].alias("changed_fields"),
    )


# Changed fields of "Run updated" that only rescale or re-prioritise: jobs are bumped in place,
# not redeployed (reference 6.1, 6.2, 11.2.6). `configuration.replicas`/`groups` are ambiguous
# once replica groups carry their own specs (0.20.7+); see detect.
IN_PLACE_FIELDS = frozenset(
    {
        "configuration.replicas",
        "configuration.scaling",
        "configuration.priority",
        "configuration.gateway",
        "configuration.inactivity_duration",
    }
)
AMBIGUOUS_FIELDS = frozenset({"configuration.groups"})
