"""The one place a command writes: every output is checked against the command's inputs before
anything is opened for writing, and written so that a failure never leaves half of it.

A forensic tool must not harm its evidence. An output path is resolved (symlinks followed, `..`
removed; a path that does not exist yet through its parent) and refused when it is an input, lies
inside a folder given as an input, lies inside the folder holding an input file, or holds an
input. The same is asked of identities (device and inode): a bind mount, a hard link or a second
path to the evidence is the evidence. An input is every form that names a local file: a path, a
`file://` URL, `dstack:` (the dstack CLI's configuration), `-` when standard input is a file. A
block device is never written (it may hold the evidence's file system), nor a character device
other than a terminal or /dev/null; standard output redirected onto an input is refused. All of
a command's outputs are planned (and so checked) before the first is written.

A regular file is written under a temporary name beside it and renamed into place when complete,
relative to its folder opened once when planned (a folder swapped for a symlink meanwhile is not
followed: the file lands where it was checked, and is checked again there);
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
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from analyzer.errors import NO_SPACE, AuditInputError, out_of_room

STDOUT = "-"
REMOVAL_WAIT_S = 10.0
"""How long a private folder's removal tries again while an interrupted writer finishes."""
Identity = tuple[int, int]  # (st_dev, st_ino): the same file or folder whatever path reaches it
# /dev/null, /dev/zero, /dev/full; ttys, /dev/tty and /dev/console, pseudo-terminals
_HARMLESS_DEVICES = {(1, 3), (1, 5), (1, 7)}
_TERMINAL_MAJORS = {4, 5, *range(136, 144)}


def _identity(status: os.stat_result) -> Identity:
    return status.st_dev, status.st_ino


def local_path(text: str) -> str | None:
    """The local path a source names: itself, a `file://` URL's path, the dstack CLI's
    configuration for `dstack:`; None for a network URL or standard input."""
    if not text or text == STDOUT:
        return None
    if text.lower().startswith("file://"):
        parts = urlsplit(text)
        return unquote(parts.path) if parts.netloc in ("", "localhost") else None
    if text.startswith("dstack:"):
        return str(Path.home() / ".dstack" / "config.yml")
    return None if "://" in text else text


def _stream_identity(stream) -> os.stat_result | None:
    try:
        return os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return None


def _device_problem(status: os.stat_result) -> str | None:
    """Why writing to this device could harm something (None: it cannot)."""
    if stat.S_ISBLK(status.st_mode):
        return "it is a block device (it may hold a file system, the evidence's too)"
    if stat.S_ISCHR(status.st_mode):
        device = (os.major(status.st_rdev), os.minor(status.st_rdev))
        streams = [_stream_identity(s) for s in (sys.stdout, sys.stderr)]
        if (
            device in _HARMLESS_DEVICES
            or device[0] in _TERMINAL_MAJORS
            or _identity(status) in {_identity(s) for s in streams if s is not None}
        ):
            return None
        return "it is a character device, neither a terminal nor /dev/null"
    return None


def _folder_chain(descriptor: int) -> list[Identity]:
    """The identity of an opened folder and of every folder above it, up to the root, walked
    through `..` from the descriptor (no path that could be swapped meanwhile)."""
    chain = [_identity(os.fstat(descriptor))]
    current = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=descriptor)
    try:
        while (here := _identity(os.fstat(current))) != chain[-1]:
            chain.append(here)
            above = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=current)
            os.close(current)
            current = above
    finally:
        os.close(current)
    return chain


def _stdout_folders() -> list[Identity]:
    """The folder holding the file standard output was redirected to, and every folder above
    it (Linux names the file in /proc; elsewhere nothing is known and nothing refused)."""
    try:
        name = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
        folder = os.open(os.path.dirname(name), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError, AttributeError):
        return []
    try:
        return _folder_chain(folder)
    finally:
        os.close(folder)


def _close_all(descriptors: dict[str, int]) -> None:
    for descriptor in descriptors.values():
        os.close(descriptor)
    descriptors.clear()


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


def _special(given: str | Path) -> os.stat_result | None:
    """A device, FIFO or socket (through links, /dev/stdout's too): written to directly,
    never replaced."""
    try:
        status = os.stat(given)
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(status.st_mode) or stat.S_ISDIR(status.st_mode) else status


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def _whole_or_nothing_on_stdout() -> Iterator[None]:
    """Standard output redirected to a file (`> out.json`, `>> log`) is cut back to where this
    output began when the write is interrupted (Ctrl-C, a signal): the shell's file holds the
    whole output or none of it, never a JSON cut in the middle. A pipe or a terminal cannot be
    taken back; the exit status (130) says the output is incomplete."""
    try:
        fd = sys.stdout.fileno()
        start = os.lseek(fd, 0, os.SEEK_CUR) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's buffer)
        start = None
    try:
        yield
    except BaseException:
        if start is not None:
            with suppress(OSError, ValueError):
                sys.stdout.flush()  # what is buffered lands now, then is cut with the rest
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        raise


@dataclass
class _Output:
    given: str
    path: Path  # resolved
    folder: bool
    special: bool = False
    own: Identity | None = None  # what is at the path now
    above: tuple[Identity, ...] = ()  # every existing folder above it, nearest first


class Outputs:
    """The outputs of one command, checked against its inputs before anything is written.

    Plan every output first (`file`, `folder`), add the inputs the readers found inside the given
    folders (`add_inputs`, before writing), then write (`write_text`, `write_bytes`, `build`).
    """

    def __init__(self, inputs: Iterable[str | Path]) -> None:
        self._inputs: dict[str, None] = {}  # the real path of every input (file or folder)
        self._inside: dict[str, str] = {}  # a folder nothing may be written in -> why
        self._real_folders: dict[str, str] = {}  # the real path of each folder seen
        self._ids: dict[Identity, str] = {}  # every input's identity -> its real path
        self._inside_ids: dict[Identity, str] = {}  # the identities of `_inside`'s folders
        self._holding_ids: dict[Identity, str] = {}  # every folder above an input -> that input
        self._chains: dict[str, list[Identity]] = {}  # a folder's identity and those above it
        self._outputs: dict[str, _Output] = {}
        self._folders: dict[str, int] = {}  # an output -> its folder, opened when planned
        weakref.finalize(self, _close_all, self._folders)
        standard_input = _stream_identity(sys.stdin)
        given = list(inputs)
        if STDOUT in map(str, given) and standard_input and stat.S_ISREG(standard_input.st_mode):
            given.append(f"/proc/self/fd/{sys.stdin.fileno()}")  # `- < evidence.log`
        self.add_inputs(given)

    def add_inputs(self, inputs: Iterable[str | Path]) -> None:
        """More inputs (e.g. the files found inside an input folder, a database's -wal): every
        output planned so far, and standard output, are checked against them too. A string
        check and a stat per input: a folder of many thousand files costs milliseconds."""
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
                self._identify(real, real, self._inside[real])
            else:
                folder = os.path.dirname(real)
                self._inside.setdefault(folder, f"{folder}, the folder holding the input {real}")
                self._identify(real, folder, self._inside[folder])
        for output in self._outputs.values():
            self._check(output, new)
        self._check_stdout()

    def _identify(self, real: str, folder: str, why: str) -> None:
        """Record an input's identity, its folder's (nothing is written in it) and those of the
        folders above it (none is replaced)."""
        try:
            self._ids.setdefault(_identity(os.stat(real)), real)
            chain = self._chain(folder)
        except OSError:
            return  # missing: the reader names it
        if chain:
            self._inside_ids.setdefault(chain[0], why)
        for identity in chain:
            self._holding_ids.setdefault(identity, real)

    def _chain(self, folder: str) -> list[Identity]:
        chain = self._chains.get(folder)
        if chain is None:
            up = os.path.dirname(folder)
            above = self._chain(up) if up != folder else []
            chain = self._chains[folder] = [_identity(os.stat(folder)), *above]
        return chain

    def _check_stdout(self) -> None:
        """Standard output redirected onto an input (`>> server.log`) would write into it, and
        redirected to a new file in the evidence folder (`cd ev && dstack-audit ... > out`)
        would add a file to it, as `-o` there would: both refused before a byte is written."""
        status = _stream_identity(sys.stdout)
        if status is None or not stat.S_ISREG(status.st_mode):
            return
        real = self._ids.get(_identity(status))
        problem = f"it is the input {real}" if real is not None else None
        if problem is None and status.st_nlink:  # an unlinked file adds nothing to a folder
            problem = self._identity_problem(None, _stdout_folders(), False)
        if problem:
            raise AuditInputError("standard output", f"refused as an output: {problem}")

    def _real_input(self, text: str) -> tuple[str, bool] | None:
        """An input's real path and whether it is a folder; None for a network URL or standard
        input. The folder part is resolved once per folder, the name only when it is a link."""
        local = local_path(text)
        if local is None:
            return None
        text = local
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
        except (OSError, RuntimeError, ValueError):  # a symlink loop: the reader names it
            return None

    def file(self, given: str | Path | None) -> None:
        """Plan a file output (None and `-` are standard output)."""
        if given is None or str(given) == STDOUT:
            return
        device = _special(given)
        if device is not None:
            problem = _device_problem(device)
            if problem:
                raise AuditInputError(str(given), f"refused as an output: {problem}")
            output = _Output(str(given), Path(given), folder=False, special=True)
            output.own = _identity(device)
            self._plan(output)
            return
        path = _resolve(given)
        output = _Output(str(given), path, folder=False)
        if path.is_dir():
            raise cannot_write(given, "it is a folder")
        if not path.parent.is_dir():
            reason = "no such folder" if not path.parent.exists() else "not a folder"
            raise cannot_write(given, f"{reason}: {path.parent}")
        try:
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise cannot_write(given, error.strerror or str(error)) from None
        self._folders[output.given] = folder
        try:
            output.above = tuple(_folder_chain(folder))
            output.own = _identity(os.stat(path.name, dir_fd=folder, follow_symlinks=False))
        except FileNotFoundError:
            pass
        except OSError as error:
            raise cannot_write(given, error.strerror or str(error)) from None
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
        try:
            output.own = _identity(path.stat()) if path.exists() else None
            output.above = tuple(self._chain(str(above)))
        except OSError as error:
            raise cannot_write(given, error.strerror or str(error)) from None
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
        if problem is None:
            problem = self._identity_problem(output.own, output.above, output.folder)
        if problem:
            raise AuditInputError(output.given, f"refused as an output: {problem}")

    def _identity_problem(
        self, own: Identity | None, above: Iterable[Identity], folder: bool
    ) -> str | None:
        """The checks of `_check` by device and inode: a bind mount of the evidence folder,
        a hard link to an input, a second path to either is the evidence."""
        if own is not None and own in self._ids:
            return f"it is the input {self._ids[own]} (the same file by device and inode)"
        for identity in above:
            if identity in self._inside_ids:
                return f"it lies inside {self._inside_ids[identity]} (the same folder by inode)"
        if folder and own is not None and own in self._holding_ids:
            return f"it holds the input {self._holding_ids[own]} (by device and inode)"
        return None

    def _planned(self, given: str | Path) -> _Output:
        try:
            return self._outputs[str(given)]
        except KeyError:
            raise ValueError(f"output {given} was not planned") from None

    def write_text(self, given: str | Path | None, text: str) -> None:
        """Write `text` (UTF-8) to a planned file output, or standard output for None or `-`."""
        self.write_pieces(given, [text])

    def write_pieces(
        self, given: str | Path | None, pieces: Iterable[str] | Iterable[bytes]
    ) -> None:
        """Write consecutive texts (written as UTF-8) or UTF-8 bytes as one output, each
        written as it comes: a large report is never held whole. A file still takes its name
        only once complete."""
        if given is None or str(given) == STDOUT:
            try:
                with _whole_or_nothing_on_stdout():
                    for piece in pieces:
                        if isinstance(piece, bytes):
                            sys.stdout.flush()  # the text written before it goes first
                            sys.stdout.buffer.write(piece)
                        else:
                            sys.stdout.write(piece)
                    sys.stdout.flush()
            except OSError as error:
                raise cannot_write("standard output", error.strerror or str(error)) from None
            return
        with self.open(given) as handle:
            for piece in pieces:
                handle.write(piece if isinstance(piece, bytes) else piece.encode("utf-8"))

    def write_bytes(self, given: str | Path | None, data: bytes) -> None:
        """Write `data` to a planned file output, or standard output for None or `-`."""
        if given is None or str(given) == STDOUT:
            try:
                with _whole_or_nothing_on_stdout():
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
        completes, inside the folder opened when it was planned (checked again now, by inode:
        an input found since, or a folder swapped meanwhile, is refused); a device or FIFO is
        written directly, if it is still the one planned."""
        output = self._planned(given)
        if output.special:
            try:
                with open(output.path, "wb") as handle:
                    if _identity(os.fstat(handle.fileno())) != output.own:
                        raise AuditInputError(output.given, "it changed since it was checked")
                    yield handle
            except OSError as error:
                raise cannot_write(output.given, error.strerror or str(error)) from None
            return
        folder = self._folders[output.given]
        name = output.path.name
        temporary = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            try:
                now = _identity(os.stat(name, dir_fd=folder, follow_symlinks=False))
            except FileNotFoundError:
                now = None
            problem = self._identity_problem(now, _folder_chain(folder), False)
            if problem:
                raise AuditInputError(output.given, f"refused as an output: {problem}")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            descriptor = os.open(temporary, flags, 0o666, dir_fd=folder)
            with os.fdopen(descriptor, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())  # complete on disk before it takes the name
            if now is not None:
                mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
                os.chmod(temporary, stat.S_IMODE(mode), dir_fd=folder)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as error:
            raise cannot_write(output.given, error.strerror or str(error)) from None
        finally:
            with suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
            os.close(self._folders.pop(output.given))

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
        except Exception as error:  # a writer's own error (polars': a ComputeError)
            if full := out_of_room(error) or _out_of_room_at(staging):
                raise cannot_write(output.given, full) from None
            raise
        finally:
            remove_folder(staging)


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


def _out_of_room_at(folder: Path) -> str | None:
    """Why a write into `folder` failed when its writer's error does not say (polars' Parquet
    writer on a full disk raises "Invalid thrift: transport error"): no block of its device
    left for us; None otherwise."""
    with suppress(OSError):
        if os.statvfs(folder).f_bavail == 0:
            return NO_SPACE
    return None


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


@contextmanager
def private_folder(prefix: str) -> Iterator[Path]:
    """A folder of our own made by `tempfile` (never in or beside the evidence), removed whole
    on leaving, also on an error or Ctrl-C (`remove_folder`)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        remove_folder(folder)


def remove_folder(folder: Path, wait: float = REMOVAL_WAIT_S) -> None:
    """Remove `folder` with everything in it, tried again until it is gone, for at most `wait`
    seconds. polars writes a file (write_ipc, write_parquet) on its streaming engine, and a
    write that Ctrl-C interrupts raises KeyboardInterrupt at once while its sink may still
    create the file a moment later: a removal that listed the folder before then fails with
    'Directory not empty' (seen: a 0-byte bucket file). Once the folder itself is gone, such
    a writer can put nothing back. Raises the last error if the folder is still there."""
    deadline = time.monotonic() + wait
    while True:
        try:
            shutil.rmtree(folder)
            return
        except OSError:
            if not os.path.lexists(folder):
                return  # gone, though an entry vanished under rmtree (another remover)
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
