"""A run's story, told once: what every renderer (the text timeline, the swimlane, the HTML
narrative) draws from, so none of them rebuilds a run's facts from the frames.
"""

from __future__ import annotations

from datetime import UTC, datetime

# A rich log writes `[%X]`, a time of day without a date (dstack-data.md 9.2); the log reader
# stores it on the 1970-01-01 pseudo date (sources/logs/messages.py), older than any dstack record.
PSEUDO_DATE_LIMIT = datetime(1971, 1, 1, tzinfo=UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """A naive time is UTC, like every database time of dstack's."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def is_pseudo_date(value: datetime | None) -> bool:
    """A time of day on the 1970-01-01 pseudo date a rich log alone gives (date unknown)."""
    if value is None:
        return False
    return as_utc(value) < PSEUDO_DATE_LIMIT
