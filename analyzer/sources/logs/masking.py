"""A log's records masked together: a secret split over the lines of one record, or over
records (a logger writing a key a line at a time, a label and then its value), never reaches
the notes of the log's unrecognised lines. The shapes themselves are analyzer.redact's."""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from analyzer.redact import MASK, SECRET_NAME, redact_shapes


def redact_records(texts: pl.Series) -> pl.Series:
    """`redact_shapes` over log records, whose lines may split a secret (`password=` then the
    value on the next line, a token wrapped): a record whose lines, joined without their
    breaks and indents, still hold a secret comes out so joined and masked."""
    masked = redact_shapes(texts)
    multi = masked.str.contains("\n", literal=True).fill_null(False)
    if not multi.any():
        return masked
    rows = multi.arg_true()
    joined = masked.gather(rows).str.replace_all(r"\n[ \t]*", "")
    again = redact_shapes(joined)
    found = pl.DataFrame({"again": again, "joined": joined, "as_was": masked.gather(rows)})
    chosen = found.select(
        pl.when(pl.col("again") != pl.col("joined")).then("again").otherwise("as_was")
    )
    return masked.scatter(rows, chosen.to_series())


# A key block as gitleaks and PEM (RFC 7468) write it; a logger may write it a line a record.
KEY_BEGIN = r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
KEY_END = r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
# a record that ends with a secret's label and no value: its value is the next record
_LABEL_LAST = (
    r"(?i)(?:^|[^\w.-])(?:" + SECRET_NAME + r")(?:\\?[\"'])?[ \t]*[:=][ \t]*$"
    r"|(?i)(?:^|[ \t])--?[\w-]*(?:token|passw(?:or)?d|secret|api[-_]?key|credential)s?[ \t]*$"
)


@dataclass
class RecordRun:
    """What one chunk of a log's records leaves open for the next: a key block begun and not
    ended, a label whose value has not come yet."""

    key_open: bool = False
    label_open: bool = False


def redact_record_run(texts: pl.Series, run: RecordRun) -> pl.Series:
    """`redact_records` over consecutive records of one log (in the order written), and the
    records a secret reaches from a neighbour masked whole: every record from a key block's
    BEGIN to its END, whatever the records (a logger writing the key a line at a time; a
    block not ended by the last record stays open for the next chunk), and the record after
    one that ends with a secret's label (`password:` then the value). `run` carries both."""
    texts = texts.cast(pl.String)
    masked = redact_records(texts)
    found = (
        pl.DataFrame({"text": texts})
        .with_row_index("row")
        .select(
            "row",
            pl.col("text").str.contains(KEY_BEGIN).fill_null(False).alias("begins"),
            pl.col("text").str.contains(KEY_END).fill_null(False).alias("ends"),
            pl.col("text").str.contains(_LABEL_LAST).fill_null(False).alias("label"),
        )
    )
    whole: list[int] = [0] if run.label_open and texts.len() else []
    whole += (found.filter("label")["row"] + 1).to_list()
    run.label_open = bool(texts.len()) and bool(found["label"][-1])
    ended: list[int] = []
    start = 0 if run.key_open else None
    marked = found.filter(pl.col("begins") | pl.col("ends"))["row"]  # few: a loop is cheap
    for row, text in zip(marked.to_list(), texts.gather(marked).to_list(), strict=True):
        last_begin = max((m.start() for m in re.finditer(KEY_BEGIN, text)), default=-1)
        last_end = max((m.end() for m in re.finditer(KEY_END, text)), default=-1)
        if start is not None and last_end >= 0:  # the block ends here
            whole += range(start, row)
            ended.append(row)
            start = None
        if last_begin > last_end:  # a block begins here and does not end in this record
            start = row + 1
    if start is not None:
        whole += range(start, texts.len())
    run.key_open = start is not None
    rows = sorted({r for r in whole if r < texts.len()} - set(ended))
    if rows:
        masked = masked.scatter(rows, [MASK] * len(rows))
    if ended:
        cut = masked.gather(ended).str.replace(r"(?s)^.*?" + KEY_END, MASK)
        masked = masked.scatter(ended, cut)
    return masked
