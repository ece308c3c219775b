"""A folder of dstack table exports: `<table>.csv` or `<table>.parquet`, one file per table.

CSV as `sqlite3 -csv -header` writes it (an empty table is a 0-byte file) or as
`psql \\copy ... CSV HEADER` writes it (an empty table is a header line). Everything is read as
text (or bytes, where a Parquet column holds bytes); dstack_tables and analyzer.sources.cells do
the checking and typing, so exports and databases map identically.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources import cells
from analyzer.sources.base import InputKind, LoadContext, SourceData, file_facts
from analyzer.sources.dstack_tables import TABLE_COLUMNS, load_tables, looks_like_dstack
from analyzer.sources.parquet import footer_problem

SUFFIXES = (".csv", ".parquet")


def _table_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for child in sorted(folder.iterdir()):
        if child.is_file() and child.suffix in SUFFIXES:
            found.setdefault(child.stem, child)
    return found


def _sniff(path: Path) -> bool:
    """A folder holding the runs and jobs tables (by name: an export has no other mark) is a
    table export even when one of its files is damaged: the load then names the file and what
    is wrong with it, instead of the folder being passed over as unrecognisable."""
    return path.is_dir() and looks_like_dstack(set(_table_files(path)))


def _csv_header(path: Path) -> str:
    """The first line of a CSV export; a UTF-8 BOM (Excel, PowerShell) is not part of it."""
    with path.open("rb") as handle:
        return handle.readline(65536).decode("utf-8-sig", "replace").rstrip("\r\n")


def _wrong_delimiter(header: str) -> str | None:
    """The delimiter of a header that reads as one column under ``,`` (a European-locale
    Excel export uses ``;``, some tools a tab), or None."""
    if "," in header:
        return None
    for delimiter, name in ((";", "';'"), ("\t", "tab"), ("|", "'|'")):
        if delimiter in header:
            return name
    return None


class ExportReader:
    def __init__(self, folder: Path) -> None:
        self.label = str(folder)
        self._files = _table_files(folder)
        self._frames: dict[str, pl.DataFrame] = {}
        self.found: dict[str, pl.DataFrame] = {}  # table -> damage the reading itself found

    def tables(self) -> set[str]:
        return set(self._files)

    def source_of(self, table: str) -> str:
        """The file a table was read from (errors name it, not the folder)."""
        return str(self._files[table])

    def _frame(self, table: str) -> pl.DataFrame:
        if table not in self._frames:
            path = self._files[table]
            try:
                if path.suffix == ".parquet":
                    frame = _parquet(path)
                elif path.stat().st_size == 0:
                    frame = pl.DataFrame()
                else:
                    frame = self._csv(table, path)
            except AuditInputError:
                raise
            except (Exception, pl.exceptions.PanicException) as error:
                kind = "Parquet file" if path.suffix == ".parquet" else "CSV export"
                reason = _without_data(str(error)) or type(error).__name__
                raise AuditInputError(
                    str(path),
                    f"not a readable {kind} (truncated or damaged: {reason})",
                    "export the table again",
                ) from None
            self._frames[table] = frame
        return self._frames[table]

    def _csv(self, table: str, path: Path) -> pl.DataFrame:
        """A CSV export as text. Bytes that are not UTF-8 cannot be read as they are: the file is
        read again with U+FFFD in their place and each such value read as unknown. A file cut
        short (see `_cut_short`) has its last row cut: said, and counted."""
        delimiter = _wrong_delimiter(_csv_header(path))
        if delimiter is not None:
            raise AuditInputError(
                str(path),
                f"{delimiter}-delimited: its header reads as one column",
                "export with ',' as sqlite3 -csv -header or psql CSV HEADER write it",
            )
        found = []
        try:
            frame = pl.read_csv(path, infer_schema=False, empty_string_is_null=True)
        except pl.exceptions.ComputeError as error:
            if "utf-8" not in str(error).lower():
                raise
            frame = pl.read_csv(
                path, infer_schema=False, empty_string_is_null=True, encoding="utf8-lossy"
            )
            frame, found = cells.lossy(frame)
        where = _cut_short(path)
        if where is not None and frame.height:
            last = frame.row(frame.height - 1)
            cut = max((i for i, value in enumerate(last) if value is not None), default=0)
            found.append(
                cells.damage(
                    [frame.height - 1],
                    frame.columns[cut],
                    f"truncated: the file ends {where}, so its last row is cut "
                    "(the values after the cut are unknown)",
                    "damaged",
                )
            )
        if found:
            self.found[table] = pl.concat(found)
        return frame

    def columns(self, table: str) -> set[str]:
        frame = self._frame(table)
        if frame.width == 0 and table in TABLE_COLUMNS:
            return set(TABLE_COLUMNS[table])  # a 0-byte export of an empty table
        return set(frame.columns)

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        frame = self._frame(table)
        if frame.width == 0:
            return pl.DataFrame(schema={c: pl.String for c in columns})
        return frame.select(
            pl.col(c) if c in frame.columns else pl.lit(None, pl.String).alias(c) for c in columns
        )

    def files(self) -> list[Path]:
        return list(self._files.values())


def _parquet(path: Path) -> pl.DataFrame:
    """A Parquet export as text, byte columns as bytes (analyzer.sources.cells decodes them);
    a footer that claims what the file cannot hold is refused before polars reads it (polars
    asserts, panicking, when the rows it decodes are fewer than the footer claims)."""
    problem = footer_problem(path)
    if problem is not None:
        raise AuditInputError(str(path), f"not a readable Parquet file ({problem})")
    frame = pl.read_parquet(path)
    return frame.select(
        pl.col(name) if dtype == pl.Binary else pl.col(name).cast(pl.String)
        for name, dtype in frame.schema.items()
    )


def _cut_short(path: Path) -> str | None:
    """Where a CSV export was cut, or None when it ends whole. In a whole file every quote is
    one of a pair (`"` opens and closes a field, `""` is a quote inside one), so an odd count
    means it ends inside a quoted field; and every row ends with a line break (sqlite3 -csv
    writes CRLF, psql's COPY CSV LF, after each row, the last too), so a last byte that is none
    means the last row was cut, even where the cut leaves the quotes paired (`"{""0"`, a cut
    between the two quotes of `""`). Counted block by block: memory stays flat."""
    quotes = 0
    last = b""
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            quotes += block.count(b'"')
            last = block[-1:]
    if quotes % 2:
        return "inside a quoted field"
    if last not in (b"\n", b""):
        return "without the line break that ends every exported row"
    return None


def _without_data(message: str) -> str:
    """A reader's error, its first line, without the data it quotes: polars quotes the field
    it could not parse (`could not parse `"tok...` as dtype`), which may be a secret (a
    user's token) before any redaction knows it. The type it wanted stays."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return re.sub(r"(?<!dtype )`[^`]*(?:`|$)", "a field", first)


def _load(given: str, ctx: LoadContext) -> SourceData:
    reader = ExportReader(Path(given))
    data = load_tables(reader, ctx.server)
    for file in reader.files():
        info = file_facts(file, "table-export")
        info.records = reader._frame(file.stem).height if file.stem in reader._frames else 0
        cells.apply_to(info, data)
        if file.stem not in reader._frames:
            info.notes.append("table not needed by the audit; not read")
        data.inputs.append(info)
    if data.inputs:
        data.inputs[0].server_version = data.server_version
    return data


SOURCE = InputKind(kind="table-export", load=_load, sniff=_sniff)
