"""Times given by a person (CLI options, library arguments): ISO 8601 in its common spellings.

Accepted: a `datetime` or `date`; text such as `2026-11-02`, `2026-11-02T09:00:00Z`,
`2026-11-02T11:00:00+02:00`, `2026-11-02 09:09:29.439`, or the tool's own output
(`2026-11-02 09:09:29.439Z`, `2026-11-02 09:09:29.439 UTC`). A time without a zone is UTC,
like every database time of dstack's.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from analyzer.errors import AuditInputError

EXAMPLES = "e.g. 2026-11-02, 2026-11-02T09:00:00Z or 2026-11-02T11:00:00+02:00"


def parse_time(value: str | date | datetime | None, name: str = "time") -> datetime | None:
    """`value` as an aware UTC datetime; text that is not ISO 8601 is an AuditInputError."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if not isinstance(value, str):
        raise AuditInputError(name, f"{value!r} is not a time", EXAMPLES)
    text = value.strip()
    if text.upper().endswith(" UTC"):
        text = text[:-4].rstrip() + "Z"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise AuditInputError(name, f"{value!r} is not an ISO 8601 time", EXAMPLES) from None
    return parse_time(parsed, name)
