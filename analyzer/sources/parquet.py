"""What a Parquet file's footer claims, checked before polars reads the file.

polars trusts the footer's row counts: a row group claiming more rows than its pages hold ends
in a Rust assertion (a panic whose backtrace reaches stderr before Python can catch anything).
The footer is Thrift compact protocol (parquet.thrift: FileMetaData, RowGroup, ColumnMetaData);
only the counts are read here, with every length checked against the bytes there are.
"""

from __future__ import annotations

import struct
from pathlib import Path

FOOTER_LIMIT = 64 << 20  # a footer is KBs; past this it is damage, never read
DEPTH_LIMIT = 32
# A table the audit reads has a unique id in every row: no encoding stores a row in less than a
# bit, so a count beyond 8 rows per byte of the file is a claim the file cannot back.
ROWS_PER_BYTE = 8


class _Damaged(Exception):
    pass


class _Compact:
    """Thrift compact protocol, just enough to walk a footer into nested dicts and lists."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise _Damaged("the footer ends early")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 70:
                raise _Damaged("a number in the footer never ends")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def skip(self, count: int) -> None:
        if count < 0 or self.at + count > len(self.data):
            raise _Damaged("a field runs past the end of the footer")
        self.at += count

    def value(self, kind: int, depth: int):
        if depth > DEPTH_LIMIT:
            raise _Damaged("the footer nests too deep")
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.skip(8)
            return None
        if kind == 8:
            self.skip(self.varint())
            return None
        if kind in (9, 10):
            header = self.byte()
            size = header >> 4 if header >> 4 != 15 else self.varint()
            if size > len(self.data):
                raise _Damaged("a list in the footer is longer than the footer")
            return [self.value(header & 0x0F, depth + 1) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                if size > len(self.data):
                    raise _Damaged("a map in the footer is longer than the footer")
                for _ in range(size):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
            return None
        if kind == 12:
            return self.struct(depth + 1)
        raise _Damaged(f"unknown field type {kind} in the footer")

    def struct(self, depth: int) -> dict[int, object]:
        fields: dict[int, object] = {}
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            delta, kind = header >> 4, header & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def footer_problem(path: Path) -> str | None:
    """Why the footer of the Parquet file at `path` cannot be right, or None."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size < 12:
            return "shorter than a Parquet file can be"
        handle.seek(size - 8)
        tail = handle.read(8)
        length = struct.unpack("<I", tail[:4])[0]
        if tail[4:] != b"PAR1" or length > min(size - 12, FOOTER_LIMIT):
            return None  # not a footer at all: polars names that itself
        handle.seek(size - 8 - length)
        footer = handle.read(length)
    try:
        meta = _Compact(footer).struct(0)
    except (_Damaged, RecursionError) as error:
        return f"a damaged footer: {error}"
    bound = size * ROWS_PER_BYTE
    rows = meta.get(3)
    groups = meta.get(4) if isinstance(meta.get(4), list) else []
    claims = [("the file", rows)] + [
        (f"row group {index + 1}", group.get(3))
        for index, group in enumerate(groups)
        if isinstance(group, dict)
    ]
    for place, claim in claims:
        if isinstance(claim, int) and not 0 <= claim <= bound:
            return f"its footer claims {claim} rows for {place}, more than its {size} bytes hold"
    total = sum(g.get(3, 0) for g in groups if isinstance(g, dict) and isinstance(g.get(3), int))
    if isinstance(rows, int) and groups and total != rows:
        return f"its footer claims {rows} rows, but its row groups {total}"
    return None
