"""Where an audit's CPU goes, by library, beside its floor's (Linux `perf`; not part of the test
suite).

    python benchmarks/where_time_goes.py SOURCE [--floor db|seed|log|keywords] [--repeat N]

The issue that set the speed targets (38) asks that a target not met be shown so by a profile in
which what is left is the floor's own work. A whole process is sampled with `perf record` (every
thread, Python's and polars' alike) and its samples summed by the library they ran in: the
Python interpreter (our code, polars' and pydantic's Python layers, every import), polars' native
code, the kernel (page faults, thread hand-offs, reads), the C library (copies, allocation),
SQLite through ADBC (the floor's own read), libcrypto (the evidence's SHA-256, which no floor
takes) and pydantic's core. Each share times the process's own CPU time (GNU time's, so not
perf's) gives seconds.
The floor is the one `run_benchmarks.py` measures the source against: `db` (ADBC reading every
table and column the audit reads), `seed` (polars imported, every byte read) or `log` (the event
fields extracted, by the layout of its first line), found from the source when not given;
`keywords` (the lifecycle lines found by keyword) is the 1 GB log's.

`perf` must be installed and allowed to sample this user's processes
(`/proc/sys/kernel/perf_event_paranoid` at most 2); the script says so and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import run_benchmarks as bench

from analyzer.magic import GZIP_MAGIC, SQLITE_MAGIC

# The libraries a sample's shared object is summed into, in the order printed: a pattern on the
# object's name (perf's `dso` column), first match wins.
GROUPS = (
    ("Python interpreter", r"^libpython|^python"),
    ("polars (native)", r"^_polars_runtime"),
    ("kernel", r"^\[kernel"),
    ("C library", r"^libc\.|^ld-linux|^libm\.|^libpthread"),
    ("SQLite / ADBC", r"adbc|sqlite"),
    ("SHA-256 (libcrypto)", r"^libcrypto|^_hashlib"),
    ("pydantic (native)", r"^_pydantic_core"),
)
OTHER = "other"


def floor_argv(source: Path, kind: str) -> list[str]:
    """The floor process run_benchmarks.py measures `source` against."""
    if kind == "db":
        return [sys.executable, "-c", bench.DB_TABLES, str(source), str(bench.ROOT)]
    if kind == "seed":
        return [sys.executable, "-c", bench.READ_FOLDER, str(source)]
    if kind == "keywords":
        return [sys.executable, "-c", bench.LIFECYCLE_LINES, str(source)]
    return [sys.executable, "-c", bench.EVENT_FIELDS, str(source), _log_format(source)]


def _log_format(source: Path) -> str:
    """A log's layout by its first line (a gzipped log's, decompressed), as the floor's
    extraction needs it: json (an object), rich (a time column in brackets, or its blank),
    else standard."""
    with source.open("rb") as handle:
        gzipped = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC  # a rotated log: its text's first line
    with (gzip.open if gzipped else open)(source, "rb") as handle:
        first = handle.readline()
    if first.startswith(b"{"):
        return "json"
    return "rich" if first.startswith((b"[", b" ")) else "standard"


def floor_kind(source: Path) -> str:
    """The floor of `source`: a folder's is the seed sample's, a SQLite file's the database's,
    any other file's a log's."""
    if source.is_dir():
        return "seed"
    with source.open("rb") as handle:
        return "db" if handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC else "log"


def sampled(argv: list[str], allowed: tuple[int, ...]) -> tuple[float, dict[str, float]]:
    """`argv` run once under `perf record`: its CPU seconds (GNU time's, as the benchmarks
    measure them: not perf's writing of its samples) and each group's share of them."""
    with tempfile.TemporaryDirectory(prefix="where-time-goes-") as folder:
        data = Path(folder) / "perf.data"
        record = ("perf", "record", "-q", "-F", "999", "-o", str(data), "--")
        try:
            cpu = bench.measure(argv, allowed=allowed, around=record)["cpu_seconds"]
        except RuntimeError as failed:  # the command's exit status
            sys.exit(f"where_time_goes: {str(failed)[-600:]}")
        except ValueError:  # no usage written: GNU time never ran under perf
            sys.exit(f"where_time_goes: perf record could not run {argv[:3]}...")
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--stdio", "--sort", "dso", "--no-children"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    shares: dict[str, float] = {}
    for line in report.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+(\S.*?)\s*$", line)
        if match is None:
            continue
        name = next((g for g, p in GROUPS if re.search(p, match[2])), OTHER)
        shares[name] = shares.get(name, 0.0) + float(match[1]) / 100
    return cpu, shares


def least(runs: Iterable[tuple[float, dict[str, float]]]) -> tuple[float, dict[str, float]]:
    """The run that spent the least CPU (a shared machine disturbs the others more)."""
    return min(runs, key=lambda run: run[0])


def usable() -> str | None:
    """Why perf cannot sample here, or None."""
    if shutil.which("perf") is None:
        return "perf is not installed (linux-tools / linux-perf)"
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    if paranoid.exists() and int(paranoid.read_text()) > 2 and os.geteuid() != 0:
        return f"{paranoid} is {paranoid.read_text().strip()}: perf may not sample (at most 2)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--floor", choices=("db", "seed", "log", "keywords"))
    parser.add_argument("--repeat", type=int, default=3, help="runs each; the least CPU is kept")
    args = parser.parse_args()
    if (why := usable()) is not None:
        print(f"where_time_goes: {why}", file=sys.stderr)
        sys.exit(2)
    if not args.source.exists():
        sys.exit(f"where_time_goes: {args.source}: no such file or folder")
    source = args.source.resolve()  # the processes run in the checkout
    kind = args.floor or floor_kind(source)
    # the report on standard output, discarded: a file would be refused beside the evidence
    audit = bench.cli("audit", str(source), "--format", "json", "-q")
    runs = {
        "audit": least(sampled(audit, bench.AUDIT_EXITS) for _ in range(args.repeat)),
        "floor": least(sampled(floor_argv(source, kind), (0,)) for _ in range(args.repeat)),
    }
    names = [g for g, _ in GROUPS] + [OTHER]
    print(f"{source} against its {kind} floor, CPU seconds (share), least of {args.repeat}")
    print("| library | audit | floor |\n|---|---:|---:|")
    for name in names:
        cells = [
            f"{cpu * shares.get(name, 0.0):.2f} ({shares.get(name, 0.0):.0%})"
            for cpu, shares in runs.values()
        ]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print(f"| all | {runs['audit'][0]:.2f} | {runs['floor'][0]:.2f} |")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C reaches perf and the audit too: each stops on its own
        print("where_time_goes: interrupted", file=sys.stderr)
        sys.exit(130)
