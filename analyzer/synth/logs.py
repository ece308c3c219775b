"""The server log writer, in the three layouts of reference 9.2."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

import polars as pl

from analyzer.synth.constants import _LEVEL_OF, _LOGGER_OF, _LOGGERS, LOG_FORMATS
from analyzer.synth.database import _times

_WORD = re.compile(r"\s*\S+\s*")


def _divide_line(text: str, width: int) -> list[int]:
    """rich/_wrap.py divide_line for single-cell text: where rich breaks a line."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            chunks = [word[i : i + width] for i in range(0, len(word), width)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


def _fold_exact(text: str, width: int) -> list[str]:
    out = []
    for hard in text.split("\n"):
        hard = hard.expandtabs(8)
        cuts = [0, *_divide_line(hard, width), len(hard)]
        for a, b in pairwise(cuts):
            piece = hard[a:b]
            if len(piece) > width:
                trailing = len(piece) - len(piece.rstrip())
                piece = piece[: len(piece) - min(trailing, len(piece) - width)]
            out.append(piece[:width])
    return out


def rich_fold(text: str, width: int) -> list[str]:
    """The message column as rich folds it at `width` cells (words wrap at spaces, the space
    at a wrap is dropped, a token longer than the column is cut). Fast path for single-spaced
    text; anything else goes through the port of rich's divide_line."""
    if "  " in text or "\n" in text or "\t" in text or text.startswith(" "):
        return _fold_exact(text, width)
    out = []
    start = 0
    n = len(text)
    while n - start > width:
        cut = text.rfind(" ", start, start + width + 1)
        if cut <= start:
            return _fold_exact(text, width)
        out.append(text[start:cut])
        start = cut + 1
    out.append(text[start:])
    return out


class _Logs:
    """The server's stdout in each layout of reference 9.2, written as records arrive."""

    def __init__(self, folder: Path, formats: Iterable[str], width: int, zone: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.formats = tuple(formats)
        unknown = set(self.formats) - set(LOG_FORMATS)
        if unknown:
            raise ValueError(f"unknown log formats: {sorted(unknown)}")
        if width < 40:
            raise ValueError("rich_width below 40 columns is not supported")
        self.width = width
        self.zone = zone
        self.paths = {f: folder / f"server.{f}.log" for f in self.formats}
        self.files = {
            f: open(p, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            for f, p in self.paths.items()
        }
        self.lines: Counter[str] = Counter()
        self.records = 0
        self.last_stamp = None
        self.rich_path = [f"{name}:{line} " for name, line in _LOGGERS]

    def write(self, records: list[tuple[int, int, int, str]]) -> None:
        if not records:
            return
        self.records += len(records)
        times = [r[0] for r in records]
        if "standard" in self.files or "json" in self.files:
            frame = pl.DataFrame(
                {
                    "t": pl.Series(times, dtype=pl.Int64).cast(pl.Datetime("us")),
                    "kind": pl.Series([r[2] for r in records], dtype=pl.Int64),
                    "message": pl.Series([r[3] for r in records], dtype=pl.String),
                }
            )
            local = pl.col("t")
            if self.zone != "UTC":
                local = local.dt.replace_time_zone("UTC").dt.convert_time_zone(self.zone)
            level = pl.col("kind").replace_strict(_LEVEL_OF, return_dtype=pl.String)
            logger = pl.col("kind").replace_strict(_LOGGER_OF, return_dtype=pl.String)
            for fmt in ("standard", "json"):
                if fmt not in self.files:
                    continue
                if fmt == "standard":
                    line = pl.concat_str(
                        level,
                        pl.lit(" "),
                        local.dt.strftime("%Y-%m-%dT%H:%M:%S%.3f"),
                        pl.lit(" "),
                        logger,
                        pl.lit(" "),
                        pl.col("message"),
                    )
                else:
                    message = (
                        pl.col("message")
                        .str.replace_all("\\", "\\\\", literal=True)
                        .str.replace_all('"', '\\"', literal=True)
                    )
                    line = pl.concat_str(
                        pl.lit('{"timestamp": "'),
                        local.dt.strftime("%Y-%m-%d %H:%M:%S,%3f"),
                        pl.lit('", "logger": "'),
                        logger,
                        pl.lit('", "level": "'),
                        level,
                        pl.lit('", "message": "'),
                        message,
                        pl.lit('"}'),
                    )
                text = frame.select(line.str.join("\n")).item()
                if fmt == "json" and not text.isascii():
                    text = "\n".join(
                        json.dumps({"timestamp": ts, "logger": lg, "level": lv, "message": m})
                        for ts, lg, lv, m in frame.select(
                            local.dt.strftime("%Y-%m-%d %H:%M:%S,%3f"), logger, level, "message"
                        ).iter_rows()
                    )
                self.files[fmt].write(text + "\n")
                self.lines[fmt] += len(records)
        if "rich" in self.files:
            stamps = _times(times, "[%H:%M:%S]", self.zone)
            width = self.width
            column = width - 20
            blank = " " * 10
            indent = " " * 20
            last = self.last_stamp
            out = []
            for stamp, (_, _, k, m) in zip(stamps, records, strict=True):
                shown = blank if stamp == last else stamp
                last = stamp
                pieces = rich_fold(self.rich_path[k] + m, column)
                level = "WARNING " if k == 3 else "INFO    "
                out.append(f"{shown} {level} {pieces[0]}".ljust(width))
                for piece in pieces[1:]:
                    out.append((indent + piece).ljust(width))
            self.last_stamp = last
            self.files["rich"].write("\n".join(out) + "\n")
            self.lines["rich"] += len(out)

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


# ---------------------------------------------------------------------------------------------
# entry point
