"""A folder of dstack table exports: `<table>.csv` or `<table>.parquet`, one file per table.

CSV as `sqlite3 -csv -header` writes it (an empty table is a 0-byte file) or as
`psql \\copy ... CSV HEADER` writes it (an empty table is a header line). Everything is read as
text; dstack_tables does the typing, so exports and databases map identically.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources.base import InputKind, LoadContext, SourceData, file_facts
from analyzer.sources.dstack_tables import TABLE_COLUMNS, load_tables, looks_like_dstack

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
                    frame = pl.read_parquet(path)
                    frame = frame.select(pl.all().cast(pl.String))
                elif path.stat().st_size == 0:
                    frame = pl.DataFrame()
                else:
                    delimiter = _wrong_delimiter(_csv_header(path))
                    if delimiter is not None:
                        raise AuditInputError(
                            str(path),
                            f"{delimiter}-delimited: its header reads as one column",
                            "export with ',' as sqlite3 -csv -header or psql CSV HEADER write it",
                        )
                    frame = pl.read_csv(path, infer_schema=False, empty_string_is_null=True)
            except AuditInputError:
                raise
            except Exception as error:
                kind = "Parquet file" if path.suffix == ".parquet" else "CSV export"
                reason = _without_data(str(error)) or type(error).__name__
                raise AuditInputError(
                    str(path),
                    f"not a readable {kind} (truncated or damaged: {reason})",
                    "export the table again",
                ) from None
            self._frames[table] = frame
        return self._frames[table]

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
            pl.col(c).cast(pl.String) if c in frame.columns else pl.lit(None, pl.String).alias(c)
            for c in columns
        )

    def files(self) -> list[Path]:
        return list(self._files.values())


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
        if file.stem not in reader._frames:
            info.notes.append("table not needed by the audit; not read")
        data.inputs.append(info)
    if data.inputs:
        data.inputs[0].server_version = data.server_version
    return data


SOURCE = InputKind(kind="table-export", load=_load, sniff=_sniff)
