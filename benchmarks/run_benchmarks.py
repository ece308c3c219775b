"""Benchmarks with their floors, measured in the same run (not part of the test suite).

    python benchmarks/run_benchmarks.py [--runs N] [--out DIR] [--only logs,db,scaling]

- logs: per format, the full audit of a generated log vs reading the same file's lines with
  polars alone (the floor); lines per second for both.
- db: the audit of a generated server.db vs reading the same tables' used columns with the
  fastest reader found (ADBC SQLite, connectorx, sqlite3: each measured).
- scaling: the same audit at N, 2N, 4N, 8N runs: time, growth per doubling, peak RSS (each
  audit runs in its own process), precision and recall against the generated truth.
- report: `dstack-audit report -o report.html` of a synthetic server with >= 1,000 findings
  (swimlanes for the worst --max-plots runs) vs the same audit as JSON (its floor), each a
  whole process.
Figures are printed as a table and written to <out>/results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from analyzer.sources.dstack_tables import TABLE_COLUMNS  # noqa: E402
from analyzer.synth import synthesize  # noqa: E402

AUDIT_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from analyzer import open_sources
started = time.perf_counter()
report = open_sources(sys.argv[3:]).report
seconds = time.perf_counter() - started
truth = json.load(open(sys.argv[2]))
expected = set()
for run in truth["runs"]:
    strict = {v["job_id"] for v in run["victims"]}
    for v in run["broad_victims"]:
        cat = "collateral_termination" if v["job_id"] in strict else "same_deployment_collateral"
        expected.add((cat, v["job_id"]))
found = {(f.category, v.job_id) for f in report.findings for v in f.victims}
if any(len(j) == 6 for _, j in found):
    expected = {(c, j.replace("-", "")[:6]) for c, j in expected}
hit = len(found & expected)
print(json.dumps({
    "seconds": seconds,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "runs": report.summary.runs,
    "found": len(found), "expected": len(expected),
    "precision": hit / len(found) if found else 1.0,
    "recall": hit / len(expected) if expected else 1.0,
}))
"""


def audit_in_child(truth: Path, *sources: Path) -> dict:
    """Each measured audit in a fresh process: its peak RSS is its own."""
    out = subprocess.run(
        [sys.executable, "-c", AUDIT_CHILD, str(ROOT), str(truth), *map(str, sources)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fleet(base: Path, runs: int, seed: int = 7) -> Path:
    folder = base / f"fleet-{runs}"
    if not (folder / "truth.json").exists():
        synthesize(folder, runs=runs, seed=seed)
    return folder


def floor_lines(path: Path) -> float:
    """Reading the file's lines with polars alone: the least any log audit must do."""
    started = time.perf_counter()
    frame = pl.read_csv(
        path,
        has_header=False,
        separator="\x1f",
        quote_char=None,
        new_columns=["line"],
        infer_schema=False,
        encoding="utf8-lossy",
        truncate_ragged_lines=True,
    )
    assert frame.height > 0
    return time.perf_counter() - started


def floor_db(db: Path) -> dict[str, float]:
    """The used columns of the used tables, with each reader available; the fastest is the floor."""
    queries = [
        f"SELECT {', '.join(f'CAST({c} AS TEXT) AS {c}' for c in cols)} FROM {table}"
        for table, cols in TABLE_COLUMNS.items()
    ]
    results = {}
    try:
        import adbc_driver_sqlite.dbapi as adbc

        started = time.perf_counter()
        with adbc.connect(f"file:{db}?mode=ro") as connection, connection.cursor() as cursor:
            for query in queries:
                try:
                    cursor.execute(query)
                    pl.from_arrow(cursor.fetch_arrow_table())
                except Exception:
                    pass
        results["adbc-sqlite"] = time.perf_counter() - started
    except ImportError:
        pass
    try:
        import connectorx as cx

        started = time.perf_counter()
        for query in queries:
            with contextlib.suppress(Exception):
                cx.read_sql(f"sqlite://{db}", query, return_type="polars")
        results["connectorx"] = time.perf_counter() - started
    except ImportError:
        pass
    import sqlite3

    started = time.perf_counter()
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    for query in queries:
        try:
            rows = connection.execute(query).fetchall()
            pl.DataFrame(rows, orient="row")
        except Exception:
            pass
    results["sqlite3"] = time.perf_counter() - started
    return results


def bench_logs(base: Path, runs: int) -> list[dict]:
    folder = fleet(base, runs)
    rows = []
    for fmt in ("standard", "json", "rich"):
        log = folder / "logs" / f"server.{fmt}.log"
        lines = sum(1 for _ in log.open("rb"))
        floor = min(floor_lines(log) for _ in range(3))
        audit = audit_in_child(folder / "truth.json", log)
        rows.append(
            {
                "bench": f"logs/{fmt}",
                "lines": lines,
                "mb": log.stat().st_size / 1e6,
                "audit_s": audit["seconds"],
                "floor_s": floor,
                "ratio": audit["seconds"] / floor,
                "audit_lines_per_s": lines / audit["seconds"],
                "floor_lines_per_s": lines / floor,
                "peak_rss_mb": audit["peak_rss_mb"],
                "precision": audit["precision"],
                "recall": audit["recall"],
            }
        )
    return rows


def bench_db(base: Path, runs: int) -> list[dict]:
    folder = fleet(base, runs)
    db = folder / "server.db"
    floors = floor_db(db)
    best = min(floors, key=floors.get)
    audit = audit_in_child(folder / "truth.json", db)
    return [
        {
            "bench": "db",
            "runs": runs,
            "mb": db.stat().st_size / 1e6,
            "audit_s": audit["seconds"],
            "floor_s": floors[best],
            "floor_reader": best,
            "readers": floors,
            "ratio": audit["seconds"] / floors[best],
            "peak_rss_mb": audit["peak_rss_mb"],
            "precision": audit["precision"],
            "recall": audit["recall"],
        }
    ]


def bench_scaling(base: Path, runs: int) -> list[dict]:
    rows = []
    for factor in (1, 2, 4, 8):
        folder = fleet(base, runs * factor)
        audit = audit_in_child(folder / "truth.json", folder / "server.db")
        rows.append({"bench": "scaling/db", "runs": runs * factor, **audit})
    for previous, current in itertools.pairwise(rows):
        current["growth_per_doubling"] = current["seconds"] / previous["seconds"]
    return rows


def timed_cli(*args: str) -> dict:
    """One `dstack-audit` command in its own process: wall time and peak RSS."""
    child = (
        "import resource, runpy, sys, time; sys.argv = ['dstack-audit', *sys.argv[1:]]; "
        "t = time.perf_counter()\ntry:\n    runpy.run_module('analyzer', run_name='__main__')\n"
        "except SystemExit:\n    pass\nprint('BENCH', time.perf_counter() - t, "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    line = next(x for x in out.stderr.splitlines() if x.startswith("BENCH "))
    seconds, rss = map(float, line.split()[1:])
    return {"seconds": seconds, "peak_rss_mb": rss}


def bench_report(base: Path, runs: int, findings: int = 1000) -> list[dict]:
    """The HTML report of a server with at least `findings` findings, against its floor."""
    size = max(runs, 4000)  # the synthetic fleet has ~0.26 findings per run
    folder = fleet(base, size)
    db = str(folder / "server.db")
    floor = timed_cli("audit", db, "--format", "json", "-q", "-o", str(base / "report.json"))
    found = len(json.loads((base / "report.json").read_text())["findings"])
    report = timed_cli("report", db, "-q", "-o", str(base / "report.html"))
    return [
        {
            "bench": "report/html",
            "runs": size,
            "findings": found,
            "enough_findings": found >= findings,
            "html_mb": (base / "report.html").stat().st_size / 1e6,
            **report,
            "floor_audit_json_seconds": floor["seconds"],
            "ratio": report["seconds"] / floor["seconds"],
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dstack-audit-bench"))
    parser.add_argument("--only", default="logs,db,scaling,report")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    results: dict = {"machine": machine, "polars": pl.__version__, "runs": args.runs}
    for name in args.only.split(","):
        benches = {
            "logs": bench_logs,
            "db": bench_db,
            "scaling": bench_scaling,
            "report": bench_report,
        }
        results[name] = benches[name](args.out, args.runs)
        for row in results[name]:
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            )
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"machine: {machine}; results in {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
