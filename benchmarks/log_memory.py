"""Peak RSS of a whole-process log audit as the log grows 1x, 4x, 16x (plain and .gz).

    python benchmarks/log_memory.py [--runs N] [--factors 1,4,16] [--growth padded,runs]
                                    [--out DIR] [--code DIR ...]
    python benchmarks/log_memory.py --runs 2000 --gigabytes 10 --out DIR

Two ways of growing the standard-format log of a synthetic server (`dstack-audit synth`):
- `runs`: a server with N, 4N, 16N runs: the kept events grow with the log;
- `padded`: the N-run log with real-shaped irrelevant lines between its lines (uvicorn access
  lines, as a server at INFO writes them), 4x and 16x its size: the kept events stay the same,
  so the audit's memory must stay the same too.
Each audit runs in a fresh process (peak RSS is its own: imports, reading, the report);
run_benchmarks.py measures the same 1x/4x/16x curve beside its other figures;
`--code` names checkouts to measure (the default: this one), e.g. `--code /work/main .` for a
before and after. Results are printed and written to <out>/log_memory.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_benchmarks import AUDIT_EXITS, REPORTS, ROOT, accuracy, fleet
from run_benchmarks import measure as run


def padded(log: Path, factor: int, out: Path) -> Path:
    """The log with factor-1 irrelevant lines after each of its lines, at the same time."""
    target = out / f"padded-{log.parent.parent.name}-{factor}x.log"
    if target.exists():
        return target
    lines = pl.read_csv(
        log, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"]
    )
    stamp = pl.col("line").str.extract(r"^\S+ (\S+)", 1)
    fillers = [
        pl.format(
            'INFO {} uvicorn.access 10.0.{}.{}:4{} - "POST /api/project/main/runs/list '
            'HTTP/1.1" 200',
            stamp,
            pl.lit(index % 250),
            (pl.int_range(pl.len()) % 250),
            pl.lit(1000 + index),
        )
        for index in range(factor - 1)
    ]
    joined = lines.select(pl.concat_str([pl.col("line"), *fillers], separator="\n"))
    target.write_text("\n".join(joined.to_series().to_list()) + "\n")
    return target


# A busy server's access line in each layout dstack writes (uvicorn's, through logging; json
# escapes the quotes around the request; rich prints a time only when it changes, so most of a
# busy log's lines print none, and pads every line to the console's width): "\x00" is its
# time, "{}" its client's address.
ACCESS_LINES = {
    "standard": ('INFO \x00 uvicorn.access {} - "POST /api/x" 200\n', "1970-01-01T00:00:00.000"),
    "json": (
        '{{"timestamp": "\x00", "logger": "uvicorn.access", "level": "INFO", '
        '"message": "{} - \\"POST /api/x\\" 200"}}\n',
        "1970-01-01 00:00:00,000",
    ),
    "rich": ('           INFO     uvicorn.access:476 {} - "POST /api/x" 200\n', ""),
}
_JSON_TIME = '{"timestamp": "'
_FOLDED = " " * 20  # a rich record's folded line opens at its message column, past its level


def padded_to_size(log: Path, gigabytes: float, out: Path, layout: str = "standard") -> Path:
    """The log (of `layout`) padded as `padded` does to about `gigabytes` GB, written as a
    stream (a 10 GB log never fits in this machine's memory): one block of fillers, stamped
    per line with the time of the line before them."""
    suffix = "" if layout == "standard" else f".{layout}"
    target = out / f"padded-{log.parent.parent.name}-{gigabytes:g}gb{suffix}.log"
    if target.exists():
        return target
    filler, stamp = ACCESS_LINES[layout]
    with log.open() as source:  # a rich log's console width (its first line's), and where a
        first = source.readline()  # block goes (rich: before each record's start)
        columns = len(first.rstrip("\n")) if layout == "rich" else 0
        lines = 1 + sum(1 for line in source if not (columns and line.startswith(_FOLDED)))
    width = len(filler.replace("\x00", stamp).format("10.0.0.0:41000"))
    fillers = max(0, round((gigabytes * 1e9 - log.stat().st_size) / lines / max(width, columns)))
    block = "".join(
        filler.format(f"10.0.{index % 250}.{index // 250 % 250}:4{1000 + index % 9000}")
        .rstrip("\n")
        .ljust(columns)
        + "\n"
        for index in range(fillers)
    )
    partial = target.with_name(target.name + ".partial")
    with log.open() as source, partial.open("w", buffering=1 << 22) as sink:
        for number, line in enumerate(source):
            if columns:  # rich folds a record's message: the block goes before a record's start
                if number and not line.startswith(_FOLDED):
                    sink.write(block)
                sink.write(line)
                continue
            sink.write(line)
            if line.startswith(_JSON_TIME):
                stamp = line[len(_JSON_TIME) : len(_JSON_TIME) + len(stamp)]
            else:
                fields = line.split(" ", 2)
                if len(fields) > 2 and fields[1][:4].isdigit():
                    stamp = fields[1]
            sink.write(block.replace("\x00", stamp))
    partial.rename(target)
    return target


def gzipped(log: Path) -> Path:
    target = log.with_name(log.name + ".gz")
    if not target.exists():
        with log.open("rb") as source, gzip.open(target, "wb") as sink:
            while block := source.read(1 << 20):
                sink.write(block)
    return target


def measure(code: Path, truth: Path, log: Path) -> dict:
    """The audit of `code`'s checkout in a fresh process, its own peak RSS (run_benchmarks)."""
    report = REPORTS / "log_memory-report.json"  # never beside the input (the audit refuses)
    argv = [sys.executable, "-m", "analyzer", "audit", str(log), "--format", "json", "-q"]
    return {
        **run([*argv, "-o", str(report)], code=code, allowed=AUDIT_EXITS),
        **accuracy(report, truth),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dstack-audit-bench"))
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT])
    parser.add_argument("--factors", default="1,4,16")
    parser.add_argument("--growth", default="padded,runs")
    parser.add_argument(
        "--gigabytes",
        type=float,
        help="instead: one plain log padded to about this many GB, audited once",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gigabytes:
        base = fleet(args.out, args.runs)
        log = padded_to_size(base / "logs" / "server.standard.log", args.gigabytes, args.out)
        audit = measure(args.code[0].resolve(), base / "truth.json", log)
        print(json.dumps({"file": log.name, "gb": log.stat().st_size / 1e9, **audit}), flush=True)
        return
    cases = []
    factors = [int(f) for f in args.factors.split(",")]
    growth = args.growth.split(",")
    base = fleet(args.out, args.runs)
    for factor in factors if "padded" in growth else []:
        log = padded(base / "logs" / "server.standard.log", factor, args.out)
        cases.append(("padded", factor, base / "truth.json", log))
    for factor in factors if "runs" in growth else []:
        grown = fleet(args.out, args.runs * factor)
        cases.append(("runs", factor, grown / "truth.json", grown / "logs" / "server.standard.log"))
    rows = []
    for growth, factor, truth, log in cases:
        for path in (log, gzipped(log)):
            for code in args.code:
                audit = measure(code.resolve(), truth, path)
                row = {
                    "growth": growth,
                    "factor": factor,
                    "file": path.name,
                    "mb": round(path.stat().st_size / 1e6, 1),
                    "log_mb": round(log.stat().st_size / 1e6, 1),
                    "code": str(code),
                    "seconds": round(audit["seconds"], 2),
                    "peak_rss_mb": round(audit["peak_rss_mb"]),
                    "precision": audit["precision"],
                    "recall": audit["recall"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    name = f"log_memory-{args.growth.replace(',', '_')}-{args.factors.replace(',', '_')}.json"
    (args.out / name).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
