"""The audit of one synthetic server's database in one process, in sequential partitions and on
local worker processes (`--workers`; not part of the test suite).

    python benchmarks/cluster.py [--runs 2000] [--seed 7] [--out DIR] [--repeat 3]

Every audit is a whole `dstack-audit audit` process (start-up, and for --workers the workers'
start and stop, included); each report must equal the one-process report. Prints one line per
configuration: the fastest and every measured wall time, and the ratio to one process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CONFIGURATIONS = {
    "one process": [],
    "--partitions 4 (sequential)": ["--partitions", "4"],
    "--workers 2 (2 partitions)": ["--workers", "2"],
    "--workers 2 --partitions 4": ["--workers", "2", "--partitions", "4"],
    "--workers 2 --partitions 8": ["--workers", "2", "--partitions", "8"],
}


def audit(db: Path, options: list[str], out: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    subprocess.run(
        [BIN / "dstack-audit", "audit", str(db), *options, "--format", "json", "-o", str(out)],
        check=True,
    )
    return time.perf_counter() - started, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="dstack-audit-cluster-"))
    server = base / f"synth-{args.runs}-{args.seed}"
    if not (server / "server.db").exists():
        synth = [BIN / "dstack-audit", "synth", str(server), "--runs", str(args.runs)]
        subprocess.run(
            [*synth, "--seed", str(args.seed)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    db = server / "server.db"
    print(f"{args.runs} runs, {db.stat().st_size / 1e6:.0f} MB database, {os.cpu_count()} cores")
    reference = None
    times: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(args.repeat):
        for name, options in CONFIGURATIONS.items():
            seconds, report = audit(db, options, base / "report.json")
            reference = reference or report
            if report != reference:
                raise SystemExit(f"{name}: the report differs from the one-process report")
            times[name].append(seconds)
    one = min(times["one process"])
    for name, measured in times.items():
        listed = " / ".join(f"{t:.1f}" for t in measured)
        print(f"{name:30} {min(measured):6.1f} s  x{min(measured) / one:.2f}  ({listed} s)")


if __name__ == "__main__":
    main()
