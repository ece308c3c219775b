"""The source registry: one list of sources, asked in order.

A source claims what is not a path (a PostgreSQL, dataset or live server URL, `-` for standard
input) or sniffs a path by its content, never its name, and loads what it accepted. Adding an
input format is adding a module with a `SOURCE` and one entry in `sources()`; nothing else
changes. The types every source shares are in analyzer.sources.base.
"""

from __future__ import annotations

import errno
import gzip
import os
import zlib
from functools import cache
from pathlib import Path

from analyzer.errors import AuditInputError
from analyzer.magic import GZIP_MAGIC
from analyzer.progress import current_step
from analyzer.sources.base import (
    InputInfo,
    LoadContext,
    Source,
    SourceData,
    WholeInputFacts,
    file_head,
)


@cache
def sources() -> tuple[Source, ...]:
    """Every source, in the order they are asked (imported on first use: a command that reads
    nothing does not pay for the readers)."""
    from analyzer.sources import api, dataset, live, postgres, sqlite, tables
    from analyzer.sources.logs import source as logs

    # A live URL is tried before a dataset URL: a URL that is no dstack server is read as a
    # dataset by the live source itself.
    others = (postgres.SOURCE, sqlite.SOURCE, live.SOURCE, dataset.SOURCE, tables.SOURCE)
    api_export = api.source(lambda path: any(s.sniff(path) for s in (*others, logs.SOURCE)))
    return (*others, api_export, logs.SOURCE)


def shown(given: str | Path) -> str:
    """A source as it may be printed or kept: a PostgreSQL URL without its password, any other
    URL without user, password or query (a dataset's signed URL); a path as it is."""
    text = str(given)
    if "://" not in text:
        return text
    from analyzer.sources.postgres import DATABASE_URL, url_without_password

    if DATABASE_URL.match(text):
        try:
            return url_without_password(text)
        except AuditInputError:
            return text.split("://", 1)[0] + "://(a URL that cannot be parsed)"
    from analyzer.sources.collect import display_url

    try:
        return display_url(text)
    except ValueError:
        return text.split("://", 1)[0] + "://(a URL that cannot be parsed)"


def network_or_stdin(given: str) -> str | None:
    """What reading `given` would reach beyond this machine's files (a server, a database, a
    cloud bucket, the dstack CLI's configured server) or standard input; None for a path or
    a `file://` URL."""
    from analyzer.outputs import local_path

    if given == "-":
        return "standard input"
    source = claimed(given)
    if source is None:
        return None
    if given.startswith("dstack:") or local_path(given) is None:
        names = {"postgresql": "a PostgreSQL database", "dataset": "a dataset on a server"}
        return names.get(source.kind, "a dstack server")
    return None


def of_kind(kind: str) -> Source:
    return next(source for source in sources() if source.kind == kind)


def claimed(given: str) -> Source | None:
    return next((source for source in sources() if source.claims(given)), None)


def sniff(path: Path) -> Source | None:
    return next((source for source in sources() if source.sniff(path)), None)


PG_DUMP_RECIPE = (
    "a pg_dump of a PostgreSQL database: restore it (createdb dstack && psql -d dstack -f "
    "FILE), then audit postgresql://USER@HOST/dstack"
)


def _pg_dump(path: Path) -> bool:
    """A plain `pg_dump` (its header comment, as pg_dump writes it): not readable as it is,
    but one restore away from an audit."""
    try:
        with path.open("rb") as handle:
            return b"-- PostgreSQL database dump" in handle.read(4096)
    except OSError:
        return False


def _broken_gzip(path: Path) -> str | None:
    """Why a file that opens as gzip (its magic bytes) does not read as one, or None: a log
    compressed and then damaged is named so, not only as unrecognised. Its head is the one
    every source sniffed (file_head)."""
    head = file_head(path)
    if head is None or not head.startswith(GZIP_MAGIC):
        return None
    try:
        with gzip.open(path, "rb") as handle:
            handle.read(1)
    except (OSError, EOFError, zlib.error) as error:
        return f"a gzip file whose data does not decompress ({error})"
    return None


def _unrecognised(path: Path) -> SourceData:
    info = InputInfo(path=str(path), kind="unrecognised", sha256=None, size=None, mtime=None)
    if path.is_file() and _pg_dump(path):
        info.notes.append(PG_DUMP_RECIPE)
    if broken := _broken_gzip(path):
        info.notes.append(broken)
    info.notes.append("not a dstack database, table export or server log; not audited")
    return SourceData(inputs=[info])


def _unreadable(path: Path, why: str) -> SourceData:
    """An entry of a folder that cannot be read (a symlink loop, a dangling link): listed with
    why, so the rest of the folder is still audited and nothing is skipped silently."""
    info = InputInfo(path=str(path), kind="unreadable", sha256=None, size=None, mtime=None)
    info.notes.append(f"{why}; not audited")
    return SourceData(inputs=[info])


def _broken_link(path: Path, folders: tuple[str, ...]) -> str | None:
    """Why a symlink inside a folder cannot be audited, or None when it can.

    A link that resolves to a folder being walked (``self -> .``, ``up -> ..``) would repeat
    that folder forever; a chain that never ends (``a -> b -> a``) fails with ELOOP; a link to
    nothing is dangling."""
    if not path.is_symlink():
        return None
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return f"symlink loop ({path.name} -> {os.readlink(path)} never reaches a file)"
        return f"dangling symlink (-> {os.readlink(path)})"
    if target in folders:
        return f"symlink loop ({path.name} -> {os.readlink(path)} is a folder being audited)"
    return None


def is_claimed(given: str | Path) -> bool:
    """Whether `given` is read as something other than a path (a URL, `-`)."""
    text = str(given)
    return (isinstance(given, str) or text == "-") and claimed(text) is not None


def count_files(given: str | Path) -> int:
    """How many files reading `given` goes through (a folder's, without hidden ones, as the
    reading walks it; a URL or `-` is one): what the reading progress counts."""
    path = Path(given)
    if is_claimed(given) or not path.is_dir():
        return 1
    count = 0
    for _, folders, files in os.walk(path):
        folders[:] = [name for name in folders if not name.startswith(".")]
        count += sum(not name.startswith(".") for name in files)
    return count


def load_path(given: str | Path, ctx: LoadContext) -> list[SourceData]:
    """Load one input as given: what a source claims (a URL, `-`), else a recognised file or
    folder, or a folder of recognisable things. A path given that is not recognised is an
    error."""
    if is_claimed(given):
        data = [claimed(str(given)).load(given, ctx).conformed()]
        current_step()(count=1)
        return data
    return _load_entry(Path(given), ctx, inside_folder=False, folders=())


def _load_entry(
    path: Path, ctx: LoadContext, *, inside_folder: bool, folders: tuple[str, ...]
) -> list[SourceData]:
    """Inside a folder, things that are not recognised are listed as such in the inputs, and
    things that cannot be read (symlink loops, dangling links) as unreadable with why (nothing
    is skipped silently). ``folders`` are the real paths of the folders being walked (to see
    loops)."""
    if inside_folder and (why := _broken_link(path, folders)):
        current_step()(count=1)
        return [_unreadable(path, why)]
    try:
        if not path.exists():
            why = _broken_link(path, folders) if path.is_symlink() else None
            raise AuditInputError(str(path), why or "no such file or folder")
        if path.is_file():
            with path.open("rb"):
                pass
        elif path.is_dir():
            os.listdir(path)
        source = sniff(path)
        if source is not None:
            data = [source.load(str(path), ctx).conformed()]
            current_step()(count=count_files(path))
            return data
    except PermissionError:
        raise AuditInputError(
            str(path), "permission denied", "run with read access to it"
        ) from None
    except OSError as error:
        raise AuditInputError(str(path), f"cannot read ({error.strerror or error})") from None
    if path.is_dir():
        found: list[SourceData] = []
        walking = (*folders, os.path.realpath(path))
        for child in sorted(path.iterdir()):
            if not child.name.startswith("."):
                found.extend(_load_entry(child, ctx, inside_folder=True, folders=walking))
        if any(
            item.inputs and item.inputs[0].kind not in ("unrecognised", "unreadable")
            for item in found
        ):
            return found
        if inside_folder:
            return [_unrecognised(path)]
        raise AuditInputError(
            str(path),
            "nothing recognisable in this folder",
            "expected a dstack server.db, table exports (runs.csv, jobs.csv, ...) or server logs",
        )
    if inside_folder:
        current_step()(count=1)
        return [_unrecognised(path)]
    if broken := _broken_gzip(path):
        raise AuditInputError(str(path), broken, "is the file complete, as it was written?")
    raise AuditInputError(
        str(path),
        "not a recognised input",
        PG_DUMP_RECIPE.replace("FILE", str(path))
        if _pg_dump(path)
        else "expected a dstack SQLite database, a folder of table exports, or a server log",
    )


def learn_whole_inputs(given: str | Path, shared: WholeInputFacts) -> None:
    """Learn into `shared` what every partition would read of each whole file in
    `given` (a file, or a folder walked as the reading walks it): done once by whoever splits
    the audit, so no partition repeats it. What cannot be read here is left to the reading,
    which says why."""
    if is_claimed(given):
        return
    _learn_entry(Path(given), shared, ())


def _learn_entry(path: Path, shared: WholeInputFacts, folders: tuple[str, ...]) -> None:
    try:
        if folders and _broken_link(path, folders):
            return
        source = sniff(path)
        if source is not None:
            learn = getattr(source, "learn", None)
            if learn is not None:
                learn(path, shared)
            return
        if path.is_dir():
            walking = (*folders, os.path.realpath(path))
            for child in sorted(path.iterdir()):
                if not child.name.startswith("."):
                    _learn_entry(child, shared, walking)
    except (OSError, AuditInputError):
        return
