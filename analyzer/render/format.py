"""How every output writes times, durations, costs and names: one place, so the terminal,
the timeline, markdown, HTML and the pictures say the same thing the same way.

Times are UTC unless a display zone (IANA name) is given. A time of day from a rich log alone
(a 1970-01-01 pseudo date, zone unknown) is shown as a time of day that says so; its pseudo
date is never shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from analyzer.contract import Culprit, Finding, GroupSummary, Impact, Totals
from analyzer.errors import AuditInputError
from analyzer.pipeline.story import as_utc, is_pseudo_date

REASON_PHRASES = {
    "failed_to_start_due_to_no_capacity": "failed to start: no capacity",
    "interrupted_by_no_capacity": "was interrupted: no capacity",
    "container_exited_with_error": "crashed: its container exited with an error",
    "waiting_runner_limit_exceeded": "never became ready: the runner wait limit was exceeded",
    "creating_container_error": "failed: the container could not be created",
    "executor_error": "failed: executor error",
    "instance_unreachable": "failed: the instance became unreachable",
    "gateway_error": "failed: gateway error",
    "max_duration_exceeded": "was stopped: max duration exceeded",
    "port_unreachable": "failed: its port was unreachable",
}


EXPOSURE_NOW = "dstack-audit exposure SERVER-URL"
GUARD_HOW = "dstack-audit guard"


@dataclass(frozen=True)
class Prevention:
    """From post-mortem to prevention, for one finding: was it foreseeable before the update,
    would the guard have refused the update at `dstack apply`, and how to check now."""

    foreseeable: str
    guard: str
    guard_short: str  # the guard's answer in a few words, for the terminal table
    check_now: str = (
        f"the services exposed now: `{EXPOSURE_NOW}` (the dstack server's URL, a user token in "
        f"DSTACK_TOKEN); refuse the next such update: `{GUARD_HOW}` (docs/guard.md)"
    )


def prevention(finding: Finding) -> Prevention:
    """The guard (analyzer.guard.decide) refuses an update of a running service only when its
    new replicas would find no room (no idle instance that fits, no cloud fleet below
    `nodes.max`); the capacity foresight asks the same question as of just before the update
    (analyzer.pipeline.foresight), so the one answers for the other. A culprit that failed for
    another reason (a crash) is neither foreseeable from the room nor refused by the guard."""
    cf = finding.capacity_foresight
    if finding.update_deployment_num is None:
        no_update = "no update started it (no `dstack apply` to refuse)"
        return Prevention(f"no: {no_update}", f"no: {no_update}", "no update to refuse")
    if cf is None:
        reasons = ", ".join(sorted({c.termination_reason or "unknown" for c in finding.culprits}))
        return Prevention(
            f"no: the culprit did not fail for lack of room ({reasons}); no check of the room "
            "before the update could have seen it",
            "no: the guard refuses an update only when its new replicas have no room",
            "would not have: not a lack of room",
        )
    why = cf.reasons[0] if cf.reasons else "no facts"
    as_of = fmt_time(cf.as_of) if cf.as_of else "an undated moment"
    if cf.foreseeable:
        return Prevention(
            f"yes: no surge capacity as of {as_of}, just before the update ({why})",
            "yes: the guard would have refused the update at `dstack apply`: its new replica "
            "had no room",
            "would have refused it: no room",
        )
    if cf.foreseeable is False:
        return Prevention(
            f"no: surge capacity was available as of {as_of} ({why})",
            "no: there was room for the new replica when the update came, so the guard would "
            "have let it through",
            "would not have: there was room",
        )
    return Prevention(
        f"cannot tell: the surge capacity before the update is {cf.surge_capacity} ({why})",
        "cannot tell: the evidence does not show the room the guard would have seen",
        "cannot tell: room unknown",
    )


def undecided(report: Any) -> str | None:
    """Why an audit without findings is no all-clear, or None when every run was decided: no
    run evidence at all (a WARNING-level log alone, --project matching no run), or runs whose
    verdict is inconclusive. `--fail-on-findings` fails on it too (unless --allow-undecided)."""
    if report.summary.runs == 0:
        return "no run evidence in the inputs"
    count = report.summary.by_verdict.get("inconclusive", 0)
    if count:
        return f"{count} run{'s' if count != 1 else ''} could not be decided (inconclusive)"
    return None


# ---------------------------------------------------------------------------------------------
# Times


def clock_text(value: datetime, pattern: str) -> str:
    """`value` as `pattern` (ending in %S) with milliseconds only when it has a fraction: a
    whole-second time from whole-second evidence (a rich log, an export) gets no invented
    `.000`."""
    if value.microsecond:
        return value.strftime(pattern + ".%f")[:-3]
    return value.strftime(pattern)


def fmt_time(value: datetime | None, *, date: bool = True, tz: tzinfo | None = None) -> str:
    """UTC with a Z (the default), or in zone `tz` with its offset (both ISO 8601)."""
    if value is None:
        return "?"
    pattern = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
    if tz is not None:
        local = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(tz)
        text = clock_text(local, pattern)
        return text + (local.strftime("%z")[:3] + ":" + local.strftime("%z")[3:] if date else "")
    return clock_text(value, pattern) + ("Z" if date else "")


def fmt_time_of_day(value: datetime | None, *, date: bool = True) -> str:
    """A time from a log without a date: the time of day and the days rolled over."""
    if value is None:
        return "?"
    days = (value - datetime(1970, 1, 1, tzinfo=UTC)).days
    text = value.strftime("%H:%M:%S") + (f" (+{days}d)" if days else "")
    return text + (" (date unknown)" if date else "")


def resolve_zone(tz: str | None) -> ZoneInfo | None:
    """The display zone for an IANA name (None: UTC); an unknown name is unusable input."""
    if tz is None or tz.upper() in ("UTC", "Z"):
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise AuditInputError(
            "--tz", f"unknown time zone {tz!r}", "give an IANA name such as Europe/Berlin"
        ) from error


@dataclass(frozen=True)
class Clock:
    """How times are shown: UTC, a display zone, or times of day with no date (rich log)."""

    zone: ZoneInfo | None = None
    dateless: bool = False

    @classmethod
    def make(cls, tz: str | None = None, *, dateless: bool = False) -> Clock:
        return cls(resolve_zone(tz), dateless)

    @property
    def name(self) -> str:
        if self.dateless:
            return "local time of day (date and zone unknown)"
        return self.zone.key if self.zone else "UTC"

    def local(self, value: datetime) -> datetime:
        """A naive datetime in the display zone (for plotting and formatting)."""
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        if self.dateless or is_pseudo_date(value):
            return value.astimezone(UTC).replace(tzinfo=None)
        return value.astimezone(self.zone or UTC).replace(tzinfo=None)

    def _suffix(self, value: datetime) -> str:
        if self.zone is None:
            return " UTC"
        offset = value.astimezone(self.zone).strftime("%z")
        return f" {self.zone.key} (UTC{offset[:3]}:{offset[3:]})"

    def tod(self, value: datetime | None, *, ms: bool = False) -> str:
        """The time of day only (for text that already said the date)."""
        if value is None:
            return "?"
        local = self.local(value)
        text = clock_text(local, "%H:%M:%S") if ms else local.strftime("%H:%M:%S")
        days = self._day_roll(value)
        return text + (f" (+{days} d)" if days else "")

    def near(self, value: datetime | None, ref: datetime | None, *, ms: bool = False) -> str:
        """The time of day when `value` falls on the same local day as `ref`, else in full."""
        if value is None or ref is None:
            return self.full(value, ms=ms)
        if self.dateless or self.local(value).date() == self.local(ref).date():
            return self.tod(value, ms=ms)
        return self.full(value, ms=ms)

    def zone_label(self, at: datetime | None) -> str:
        """'UTC', 'Europe/Berlin, UTC+01:00' (the offset at `at`), or the undated wording."""
        if self.dateless or self.zone is None or at is None:
            return self.name
        offset = as_utc(at).astimezone(self.zone).strftime("%z")
        return f"{self.zone.key}, UTC{offset[:3]}:{offset[3:]}"

    def full(self, value: datetime | None, *, ms: bool = False) -> str:
        """Date, time and zone; a time of day only says the date is unknown."""
        if value is None:
            return "?"
        if self.dateless or is_pseudo_date(value):
            return f"{self.tod(value, ms=ms)} (time of day only, date unknown)"
        local = self.local(value)
        pattern = "%Y-%m-%d %H:%M:%S"
        text = clock_text(local, pattern) if ms else local.strftime(pattern)
        return text + self._suffix(value)

    def _day_roll(self, value: datetime) -> int:
        if not (self.dateless or is_pseudo_date(value)):
            return 0
        return (self.local(value).date() - datetime(1970, 1, 1).date()).days


# ---------------------------------------------------------------------------------------------
# Durations and costs


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


def fmt_seconds(seconds: float | None) -> str:
    """A short duration for prose: '10 s', '7 min 23 s', '2 h 05 min'."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 9.5 else f"{seconds:.1f} s"
    return fmt_duration(seconds)


def fmt_money(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


# A lower bound is printed rounded down to the digits shown: "≥ 2m57s" for 177.99 s, never a
# figure above what the evidence proves.
_EPSILON = 1e-9


def floor_duration(seconds: float) -> float:
    """`seconds` rounded down to what fmt_duration shows (0.1 s below a minute, else 1 s)."""
    if seconds < 60:
        return math.floor(seconds * 10 + _EPSILON) / 10
    return float(math.floor(seconds + _EPSILON))


def floor_money(value: float) -> float:
    """`value` rounded down to what fmt_money shows."""
    digits = 10_000 if value < 1 else 100
    return math.floor(value * digits + _EPSILON) / digits


def fmt_figure(
    value: float | None,
    *,
    lower_bound: bool = False,
    unknown: int = 0,
    unit: Callable[[float], str] = fmt_duration,
    floor: Callable[[float], float] = floor_duration,
) -> str:
    """A figure as exactly as the evidence knows it: "unknown" when no part of it is known,
    "≥ " before a lower bound (ran to the end of the evidence, or counted from a time rounded
    to its precision), " (+N unknown)" after a total with N parts unknown (not in the sum)."""
    if value is None:
        return "unknown"
    shown = unit(floor(value)) if lower_bound else unit(value)
    return ("≥ " if lower_bound else "") + shown + (f" (+{unknown} unknown)" if unknown else "")


def fmt_cost(value: float | None, unknown: int = 0, *, lower_bound: bool = False) -> str:
    """A cost; "unknown" when no part is known, "≥" when it runs to the end of the evidence."""
    return fmt_figure(
        value, lower_bound=lower_bound, unknown=unknown, unit=fmt_money, floor=floor_money
    )


def fmt_bound(seconds: float | None, lower_bound: bool) -> str:
    """A duration that may be a lower bound (not recovered by the end of the evidence):
    "≥ 2m58s", never a bare number that claims to be the whole outage."""
    return fmt_figure(seconds, lower_bound=lower_bound)


def outage_text(item: Totals | Impact) -> str:
    """The outage of a finding (Impact) or a total (Summary, GroupSummary), as known."""
    unknown = item.outage_unknown_runs if isinstance(item, Totals) else 0
    return fmt_figure(item.outage_seconds, lower_bound=item.outage_is_lower_bound, unknown=unknown)


def replica_time_text(item: Totals | Impact) -> str:
    """The healthy replica-time lost, as known."""
    return fmt_figure(
        item.healthy_replica_seconds_lost,
        lower_bound=item.healthy_replica_seconds_lost_is_lower_bound,
        unknown=item.replica_time_unknown_victims,
    )


def cost_text(item: Totals | Impact) -> str:
    """The cost lost, as known: the victims whose cost is unknown counted, not summed."""
    unknown = (
        item.cost_unknown_victims
        if isinstance(item, Totals)
        else len(item.per_victim) - item.cost_known_for
    )
    return fmt_cost(item.lost_cost, unknown, lower_bound=item.lost_cost_is_lower_bound)


# Incidents, not findings: a run with findings of two categories is one incident (the JSON
# keeps both counts).
GROUP_HEADERS = ["key", "incidents", "victims", "outage", "replica-time lost", "cost lost"]


def group_rows(groups: Sequence[GroupSummary]) -> list[list[object]]:
    """The rows of a fleet summary table (same figures in every output format)."""
    return [
        [
            g.key,
            g.incidents,
            g.victims,
            outage_text(g),
            replica_time_text(g),
            cost_text(g),
        ]
        for g in groups
    ]


# ---------------------------------------------------------------------------------------------
# Names and words


def field_names(changed: str | Sequence[str] | None) -> str | None:
    """'configuration.commands, configuration.env' (or its list) -> 'commands, env'."""
    if changed is None or len(changed) == 0:
        return None
    listed = changed.split(",") if isinstance(changed, str) else changed
    parts = [p.strip().removeprefix("configuration.") for p in listed]
    return ", ".join(p for p in parts if p)


def actor_name(actor: str | None) -> str | None:
    """'user alice' (an event's actor) -> 'alice'."""
    if not actor:
        return None
    return actor.removeprefix("user ").strip() or None


def describe_failure(culprit: Culprit | dict[str, Any]) -> str:
    """What the culprit did, in words: 'failed to start: no capacity (Fleet is at capacity)'."""
    get = culprit.get if isinstance(culprit, dict) else lambda k: getattr(culprit, k, None)
    reason = get("termination_reason")
    message = get("termination_reason_message")
    code = get("exit_status")
    if reason == "container_exited_with_error":
        text = (
            f"crashed: its container exited with code {code}"
            if code is not None
            else REASON_PHRASES[reason]
        )
    elif reason:
        text = REASON_PHRASES.get(reason, f"failed ({reason.upper()})")
    else:
        text = "failed (reason not recorded)"
    if message:
        text += f" ({message})"
    return text
