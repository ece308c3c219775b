"""One clock aligner for times written without a zone (server logs, `dstack event` text).

A local clock differs from UTC by a whole number of quarter hours (every zone in use today), so
each pair of a local time and the UTC moment the same thing was recorded at votes for the
quarter-hour shift nearest their difference, when it is that near (the precision of the local
text). The shift most pairs vote for is the offset. Used by the log alignment against a
database (analyzer.pipeline.reconcile) and by the API export's `dstack event` lines against the
export's JSON (analyzer.sources.api.event_text).
"""

from __future__ import annotations

import polars as pl

QUARTER_HOUR_US = 15 * 60 * 1_000_000


def quarter_hour(diff: pl.Expr) -> pl.Expr:
    """The whole number of quarter hours (in microseconds) nearest `diff` (microseconds)."""
    return ((diff / QUARTER_HOUR_US).round() * QUARTER_HOUR_US).cast(pl.Int64)


def majority_shift(pairs: pl.DataFrame, by: str, *, early_us: int, late_us: int) -> pl.DataFrame:
    """Per `by`: the quarter-hour shift most voters agree on.

    `pairs` has `by`, `voter` (what votes: a log line, a key) and `diff` (UTC moment minus local
    time, microseconds), in the order the pairs were found. A pair votes when its difference is
    within `early_us` before to `late_us` after a shift. Returns `by`, `shift` (microseconds),
    `agree` (voters for it) and `matched` (voters for any shift); a tie goes to the shift voted
    for first."""
    votes = (
        pairs.with_row_index("_order")
        .with_columns(quarter_hour(pl.col("diff")).alias("shift"))
        .filter((pl.col("diff") - pl.col("shift")).is_between(-early_us, late_us))
    )
    matched = votes.group_by(by).agg(pl.col("voter").n_unique().alias("matched"))
    return (
        votes.group_by(by, "shift")
        .agg(pl.col("voter").n_unique().alias("agree"), pl.col("_order").min())
        .sort([by, "agree", "_order"], descending=[False, True, False])
        .group_by(by, maintain_order=True)
        .first()
        .drop("_order")
        .join(matched, on=by, how="left", maintain_order="left")
    )
