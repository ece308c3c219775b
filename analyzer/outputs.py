"""The one place a command writes: every output is checked against the command's inputs before
anything is opened for writing, and written so that a failure never leaves half of it.

A forensic tool must not harm its evidence. An output path is resolved (symlinks followed, `..`
removed; a path that does not exist yet through its parent) and refused when it is an input, lies
inside a folder given as an input, lies inside the folder holding an input file, or holds an
input. All of a command's outputs are planned (and so checked) before the first is written.

A regular file is written under a temporary name beside it and renamed into place when complete;
a device or FIFO (`/dev/null`, `/dev/stdout`) is written directly and `-` is standard output. A
folder (a bundle, a dataset, a report's images) is built in a temporary folder beside it and
swapped in whole, so a stale file of an earlier run never survives in it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from analyzer.errors import AuditInputError

STDOUT = "-"


def cannot_write(path: str | Path, reason: str) -> AuditInputError:
    """`cannot write PATH: reason`, the CLI's one line with exit 2."""
    return AuditInputError(f"cannot write {path}", reason)


def _resolve(given: str | Path) -> Path:
    """Absolute, symlinks followed and `..` taken after them as the kernel does (a path that
    does not exist yet: through its deepest existing parent)."""
    try:
        return Path(given).resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop
        raise cannot_write(given, f"cannot resolve the path ({error})") from None


def _is_special(path: Path) -> bool:
    """A device, FIFO or socket: written to directly, never replaced."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass
class _Output:
    given: str
    path: Path  # resolved
    folder: bool
    special: bool = False


class Outputs:
    """The outputs of one command, checked against its inputs before anything is written.

    Plan every output first (`file`, `folder`), add the inputs the readers found inside the given
    folders (`add_inputs`, before writing), then write (`write_text`, `write_bytes`, `build`).
    """

    def __init__(self, inputs: Iterable[str | Path]) -> None:
        self._inputs: dict[str, None] = {}  # the real path of every input (file or folder)
        self._inside: dict[str, str] = {}  # a folder nothing may be written in -> why
        self._real_folders: dict[str, str] = {}  # the real path of each folder seen
        self._outputs: dict[str, _Output] = {}
        self.add_inputs(inputs)

    def add_inputs(self, inputs: Iterable[str | Path]) -> None:
        """More inputs (e.g. the files found inside an input folder, a database's -wal): every
        output planned so far is checked against them too. A string check per input: a folder
        of many thousand files costs milliseconds."""
        new = []
        for source in inputs:
            found = self._real_input(str(source))
            if found is None or found[0] in self._inputs:
                continue
            real, is_folder = found
            self._inputs[real] = None
            new.append(real)
            if is_folder:
                self._inside[real] = f"the input folder {real}"
            else:
                folder = os.path.dirname(real)
                self._inside.setdefault(folder, f"{folder}, the folder holding the input {real}")
        for output in self._outputs.values():
            self._check(output, new)

    def _real_input(self, text: str) -> tuple[str, bool] | None:
        """An input's real path and whether it is a folder; None for a URL or standard input.
        The folder part is resolved once per folder, the name only when it is a link."""
        if not text or text == STDOUT or "://" in text:
            return None
        try:
            mode = os.lstat(text).st_mode
        except OSError:
            mode = 0  # missing: the reader names it; resolved through its parent
        head, name = os.path.split(text)
        try:
            if stat.S_ISLNK(mode) or name in ("", ".", ".."):
                real = os.path.realpath(text)
                return real, os.path.isdir(real)
            base = self._real_folders.get(head)
            if base is None:
                base = self._real_folders[head] = os.path.realpath(head or ".")
            return os.path.join(base, name), stat.S_ISDIR(mode)
        except (OSError, RuntimeError):  # a symlink loop: the reader names it
            return None

    def file(self, given: str | Path | None) -> None:
        """Plan a file output (None and `-` are standard output)."""
        if given is None or str(given) == STDOUT:
            return
        path = _resolve(given)
        output = _Output(str(given), path, folder=False, special=_is_special(path))
        if not output.special:
            if path.is_dir():
                raise cannot_write(given, "it is a folder")
            if not path.parent.is_dir():
                reason = "no such folder" if not path.parent.exists() else "not a folder"
                raise cannot_write(given, f"{reason}: {path.parent}")
        self._plan(output)

    def folder(
        self,
        given: str | Path,
        *,
        force: bool = False,
        replaceable: Callable[[Path], bool] | None = None,
        replace: bool = True,
    ) -> None:
        """Plan a folder output, replaced whole when written. A non-empty folder is refused
        unless `force`, or `replaceable(folder)` says it is an earlier output of the same kind.
        With `replace=False` the command writes its own files into the folder (only the
        inputs are checked)."""
        path = _resolve(given)
        output = _Output(str(given), path, folder=True)
        if path.exists() and not path.is_dir():
            raise cannot_write(given, "it exists and is not a folder")
        above = next(p for p in path.parents if p.exists())
        if not above.is_dir():
            raise cannot_write(given, f"not a folder: {above}")
        if replace and path.is_dir():
            here = Path.cwd().resolve()
            if here == path or path in here.parents:
                raise AuditInputError(
                    str(given), "refusing to replace the folder holding the working directory"
                )
            if any(path.iterdir()) and not force and not (replaceable and replaceable(path)):
                raise AuditInputError(
                    str(given),
                    "the folder is not empty; refusing to write into it",
                    "give --force to replace it whole, or name a new or empty folder",
                )
        self._plan(output)

    def _plan(self, output: _Output) -> None:
        for other in self._outputs.values():
            inside = output.path == other.path or (
                other.folder and other.path in output.path.parents
            )
            if inside or (output.folder and output.path in other.path.parents):
                raise AuditInputError(
                    output.given, f"refused as an output: it overlaps the output {other.given}"
                )
        self._check(output, self._inputs)
        self._outputs[output.given] = output

    def _check(self, output: _Output, inputs: Iterable[str]) -> None:
        """Refuse `output` when writing it could harm an input (`inputs`: the ones to test for
        lying inside a folder output; the rest is looked up among all inputs)."""
        problem = None
        real = str(output.path)
        if real in self._inputs:
            problem = f"it is the input {real}"
        elif not output.special:  # a device or FIFO creates nothing beside anything
            folder, up = os.path.dirname(real), real
            while problem is None and folder != up:
                problem = self._inside.get(folder)
                problem = f"it lies inside {problem}" if problem else None
                folder, up = os.path.dirname(folder), folder
            if problem is None and output.folder:
                prefix = real.rstrip(os.sep) + os.sep
                held = next((p for p in inputs if p.startswith(prefix)), None)
                problem = f"it holds the input {held}" if held else None
        if problem:
            raise AuditInputError(output.given, f"refused as an output: {problem}")

    def _planned(self, given: str | Path) -> _Output:
        try:
            return self._outputs[str(given)]
        except KeyError:
            raise ValueError(f"output {given} was not planned") from None

    def write_text(self, given: str | Path | None, text: str) -> None:
        """Write `text` (UTF-8) to a planned file output, or standard output for None or `-`."""
        self.write_pieces(given, [text])

    def write_pieces(self, given: str | Path | None, pieces: Iterable[str]) -> None:
        """Write consecutive texts (UTF-8) as one output, each encoded and written as it comes:
        a large report is never held whole. A file still takes its name only once complete."""
        if given is None or str(given) == STDOUT:
            try:
                for piece in pieces:
                    sys.stdout.write(piece)
                sys.stdout.flush()
            except OSError as error:
                raise cannot_write("standard output", error.strerror or str(error)) from None
            return
        with self.open(given) as handle:
            for piece in pieces:
                handle.write(piece.encode("utf-8"))

    def write_bytes(self, given: str | Path | None, data: bytes) -> None:
        """Write `data` to a planned file output, or standard output for None or `-`."""
        if given is None or str(given) == STDOUT:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            except OSError as error:
                raise cannot_write("standard output", error.strerror or str(error)) from None
            return
        with self.open(given) as handle:
            handle.write(data)

    @contextmanager
    def open(self, given: str | Path) -> Iterator[BinaryIO]:
        """A planned file output opened for writing: renamed into place only when the block
        completes; a device or FIFO is written directly."""
        output = self._planned(given)
        if output.special:
            try:
                with output.path.open("wb") as handle:
                    yield handle
            except OSError as error:
                raise cannot_write(output.given, error.strerror or str(error)) from None
            return
        temporary = output.path.with_name(f".{output.path.name}.{secrets.token_hex(4)}.tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(descriptor, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())  # complete on disk before it takes the name
            if output.path.exists():
                os.chmod(temporary, stat.S_IMODE(output.path.stat().st_mode))
            os.replace(temporary, output.path)
        except OSError as error:
            raise cannot_write(output.given, error.strerror or str(error)) from None
        finally:
            temporary.unlink(missing_ok=True)

    @contextmanager
    def build(self, given: str | Path, *, drop_if_empty: bool = False) -> Iterator[Path]:
        """A temporary folder beside a planned folder output; when the block completes it
        replaces the folder whole (or, with `drop_if_empty`, an empty result removes it)."""
        output = self._planned(given)
        final = output.path
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")
            staging.mkdir(mode=0o777 & ~_umask())
        except OSError as error:
            raise cannot_write(output.given, error.strerror or str(error)) from None
        try:
            yield staging
            _swap_in(staging, final, remove=drop_if_empty and not any(staging.iterdir()))
        except OSError as error:
            raise cannot_write(output.given, error.strerror or str(error)) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def plan(
    inputs: Iterable[str | Path],
    *,
    files: Iterable[str | Path | None] = (),
    folders: Iterable[str | Path | None] = (),
    force: bool = False,
) -> Outputs:
    """The outputs of a command (None: not asked for) checked against its inputs, in one call."""
    outputs = Outputs(inputs)
    for given in files:
        outputs.file(given)
    for given in folders:
        if given is not None:
            outputs.folder(given, force=force)
    return outputs


def _swap_in(staging: Path, final: Path, *, remove: bool) -> None:
    """Put the built folder in place of `final` (which holds none of it afterwards)."""
    if not final.exists():
        if not remove:
            staging.rename(final)
        return
    retired = final.with_name(f".{final.name}.{secrets.token_hex(4)}.old")
    final.rename(retired)
    try:
        if not remove:
            staging.rename(final)
    except OSError:
        retired.rename(final)
        raise
    shutil.rmtree(retired, ignore_errors=True)
