"""What captured the log, undone: docker/kubectl --timestamps prefixes and journalctl -o json
entries give back the server's own lines (with the capture's clock beside them).
"""

from __future__ import annotations

import polars as pl

from analyzer.model import UTC_TIME
from analyzer.sources.logs.layouts import in_range

# docker/kubectl --timestamps: RFC 3339 (docker trims trailing zeros of the nanoseconds).
_DOCKER_PREFIX = r"^-?\d+-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ?"


_DOCKER_RE = (
    r"(?s)^(?P<d_time>-?\d+-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d))"
    r"(?: (?P<d_rest>.*))?$"
)


_JOURNAL_RE = r'^\s*\{.*"__REALTIME_TIMESTAMP"\s*:'
_JOURNAL_KEY = '"__REALTIME_TIMESTAMP"'  # every line _JOURNAL_RE matches holds it


# ---------------------------------------------------------------------------------------------
# wrappers: docker/kubectl --timestamps, journalctl -o json


# What a wrapper line can be wrong with, per line (counted over the lines once, into notes).
WRAPPER_DAMAGE = {
    "no_prefix": "{} lines without the docker/kubectl timestamp prefix",
    "bad_bytes": "invalid UTF-8 in {} journal entries (MESSAGE byte arrays)",
    "null_message": (
        "{} journal entries without a MESSAGE text (journalctl -o json prints null for fields "
        "over 4096 bytes unless --all is given)"
    ),
    "foreign": "{} lines that are not journal entries",
}


def detect_wrapper(raw: pl.Series) -> str | None:
    """The wrapper by content: what a majority of the non-blank lines carry (or None). The
    journal's regex runs only where a majority holds its key (a search for a literal): over a
    json log's lines, which open with ``{`` too, it would scan each line to its end."""
    non_blank = int((raw.str.strip_chars() != "").sum())

    def carried(pattern: str, literal: bool = False) -> bool:
        return int(raw.str.contains(pattern, literal=literal).sum()) * 2 > non_blank

    if non_blank:
        if carried(_JOURNAL_KEY, literal=True) and carried(_JOURNAL_RE):
            return "journald"
        if carried(_DOCKER_PREFIX):
            return "docker"
    return None


def unwrap(raw: pl.Series, wrapper: str | None, first_line: int) -> pl.DataFrame:
    """Peel the wrapper off each line.

    Returns line, raw, content (the log line inside the wrapper), wrapper_time (UTC), wrapped
    (this line carried the wrapper) and flag (a key of WRAPPER_DAMAGE, or null).
    """
    frame = pl.DataFrame({"raw": raw}).with_row_index("line", offset=first_line)
    frame = frame.with_columns(pl.col("line").cast(pl.Int64))
    if wrapper == "journald":
        return _unwrap_journald(frame)
    if wrapper == "docker":
        return _unwrap_docker(frame)
    return frame.with_columns(
        content=pl.col("raw"),
        wrapper_time=pl.lit(None, UTC_TIME),
        wrapped=pl.lit(False),
        flag=pl.lit(None, pl.String),
    )


def _unwrap_docker(frame: pl.DataFrame) -> pl.DataFrame:
    """``docker logs -t`` / ``kubectl logs --timestamps``: an RFC 3339 time (Z or an offset)
    and one space before each line; the time is kept as UTC."""
    frame = frame.with_columns(pl.col("raw").str.extract_groups(_DOCKER_RE).alias("d")).unnest("d")
    stamp = pl.col("d_time").str.replace(r"Z$", "+00:00")
    frame = (
        frame.with_columns(
            wrapper_time=stamp.str.to_datetime(
                "%Y-%m-%dT%H:%M:%S%.f%:z", time_unit="us", strict=False
            )
        )
        .with_columns(wrapper_time=in_range(pl.col("wrapper_time")).dt.convert_time_zone("UTC"))
        .with_columns(
            wrapped=pl.col("wrapper_time").is_not_null(),
        )
        .with_columns(
            content=pl.when(pl.col("wrapped"))
            .then(pl.col("d_rest").fill_null(""))
            # a prefix whose time is out of range: a control byte makes it no continuation
            .when(pl.col("d_time").is_not_null())
            .then(pl.lit("\x00") + pl.col("raw"))
            .otherwise(pl.col("raw")),
        )
    )
    missing = ~pl.col("wrapped") & (pl.col("raw").str.strip_chars() != "")
    frame = frame.with_columns(flag=pl.when(missing).then(pl.lit("no_prefix")))
    return frame.drop("d_time", "d_rest")


def _unwrap_journald(frame: pl.DataFrame) -> pl.DataFrame:
    """``journalctl -o json``: MESSAGE is a string, or an array of bytes when it is not
    printable UTF-8 (invalid bytes, ANSI colour); __REALTIME_TIMESTAMP is epoch microseconds."""
    raw = pl.col("raw")
    is_entry = raw.str.contains(_JOURNAL_RE)
    frame = frame.with_columns(
        entry=is_entry,
        message=pl.when(is_entry).then(raw.str.json_path_match("$.MESSAGE")),
        as_bytes=is_entry & raw.str.contains(r'"MESSAGE"\s*:\s*\['),
        wrapper_time=pl.from_epoch(
            raw.str.json_path_match("$.__REALTIME_TIMESTAMP").cast(pl.Int64, strict=False),
            time_unit="us",
        ).dt.replace_time_zone("UTC"),
    )
    arrays = frame.filter(pl.col("as_bytes") & pl.col("message").is_not_null())
    bad_bytes = pl.lit(False)
    if arrays.height:
        try:
            decoded = _decode_byte_arrays(arrays["message"])
        except (pl.exceptions.PolarsError, ValueError):  # not an array of integers
            decoded = pl.Series("bytes_text", [None] * arrays.height, pl.String)
        fixed = pl.DataFrame({"line": arrays["line"], "bytes_text": decoded})
        frame = frame.join(fixed, on="line", how="left", maintain_order="left").with_columns(
            message=pl.when(pl.col("as_bytes"))
            .then(pl.col("bytes_text"))
            .otherwise(pl.col("message"))
        )
        bad_bytes = pl.col("as_bytes") & pl.col("bytes_text").str.contains("\ufffd", literal=True)
    frame = frame.with_columns(
        content=pl.when(pl.col("entry")).then(pl.col("message")).otherwise(raw),
        wrapped=pl.col("entry"),
        flag=pl.when(bad_bytes.fill_null(False))
        .then(pl.lit("bad_bytes"))
        .when(pl.col("entry") & pl.col("message").is_null())
        .then(pl.lit("null_message"))
        .when(~pl.col("entry") & (raw.str.strip_chars() != ""))
        .then(pl.lit("foreign")),
    )
    return frame.select("line", "raw", "content", "wrapper_time", "wrapped", "flag")


def _decode_byte_arrays(arrays: pl.Series) -> pl.Series:
    """JSON byte arrays -> text (invalid UTF-8 replaced), in one decode of one buffer.

    Entries are joined with ``\\n`` (a newline byte inside an entry becomes a space: journald's
    stdout stream already splits lines there) so the buffer splits back into the same entries.
    """
    element = pl.element()
    values = arrays.str.json_decode(pl.List(pl.Int64))
    cleaned = pl.DataFrame({"v": values}).select(
        pl.concat_list(
            [
                pl.col("v").list.eval(
                    pl.when(element == 10)
                    .then(32)
                    .when(element.is_between(0, 255))
                    .then(element)
                    .otherwise(63)
                ),
                pl.lit(10),
            ]
        ).alias("v")
    )["v"]
    blob = bytes(cleaned.explode().fill_null(63).to_list())
    text = blob.decode("utf-8", errors="replace")
    return pl.Series("bytes_text", text.split("\n")[:-1], dtype=pl.String)
