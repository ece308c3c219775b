"""Whole-process time of auditing a folder of N empty files (1,000 and 10,000 by default).

    python benchmarks/folder_walk.py [--counts 1000,10000] [--out DIR] [--code DIR ...]

Each file is sniffed by every source and listed as unrecognised; the walk must grow linearly
with the number of files. Each audit runs in a fresh process (`--code` names the checkouts to
measure, e.g. `--code /work/main .` for a before and after); the exit is 2 ("nothing
recognisable"), which is what such a folder gives.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
started = time.perf_counter()
from analyzer.errors import AuditInputError
from analyzer.sources import load_path
try:
    from analyzer.sources.base import LoadContext
    server = LoadContext("default")
except ImportError:  # a checkout from before the load context
    server = "default"
try:
    load_path(sys.argv[2], server)
except AuditInputError:
    pass
print(time.perf_counter() - started)
"""


def folder(base: Path, count: int) -> Path:
    target = base / f"empty-{count}"
    if not target.is_dir():
        target.mkdir(parents=True)
        for index in range(count):
            (target / f"f{index}").touch()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,10000")
    parser.add_argument("--out", type=Path, default=Path("/tmp/dstack-audit-bench"))
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT])
    args = parser.parse_args()
    for count in (int(c) for c in args.counts.split(",")):
        path = folder(args.out, count)
        for code in args.code:
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(code.resolve()), str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = {
                "files": count,
                "code": str(code),
                "walk_s": round(float(out.stdout.strip().splitlines()[-1]), 2),
                "process_s": round(time.perf_counter() - started, 2),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
