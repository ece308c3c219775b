"""The live API audit on a real dstack server (not part of the test suite).

    python benchmarks/live_api.py [--runs N] [--out DIR]

Generates a synthetic server (`dstack-audit synth`), starts the real `dstack server` 0.22.5 of
`.ci/dstack.sh` on a copy of its database (as tests/test_live_server.py does), and measures:
the collection at 1 and at 4 requests in flight (pages per second), the whole live audit
(`dstack-audit audit URL` in its own process, start-up included), the offline audit of the
collected folder, precision and recall against the generated truth, and whether the live and
offline findings agree. The server is stopped at the end, even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_live_server import DstackServer  # noqa: E402

from analyzer.sources.collect import collect_into  # noqa: E402
from analyzer.synth import synthesize  # noqa: E402


def victims(report: dict) -> set[tuple[str, str]]:
    return {(f["category"], v["job_id"]) for f in report["findings"] for v in f["victims"]}


def expected(truth: dict) -> set[tuple[str, str]]:
    found = set()
    for run in truth["runs"]:
        strict = {v["job_id"] for v in run["victims"]}
        for v in run["broad_victims"]:
            category = (
                "collateral_termination" if v["job_id"] in strict else "same_deployment_collateral"
            )
            found.add((category, v["job_id"]))
    return found


def audit_process(source: str, env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "analyzer", "audit", source, "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
        cwd=ROOT,
    )
    return time.perf_counter() - started, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dstack-audit-live-bench"))
    args = parser.parse_args()
    fleet = args.out / f"fleet-{args.runs}"
    if not (fleet / "truth.json").exists():
        synthesize(fleet, runs=args.runs, seed=7)
    run_dir = args.out / f"server-{time.time_ns()}"
    server = DstackServer(fleet, run_dir)
    try:
        started = time.perf_counter()
        server.wait()
        print(f"server up in {time.perf_counter() - started:.1f} s")
        for concurrency in (1, 4):
            got = collect_into(
                server.url, server.token, run_dir / f"c{concurrency}", concurrency=concurrency
            )
            print(
                f"collect, {concurrency} in flight: {len(got.pages)} pages, "
                f"{got.bytes / 1e6:.1f} MB in {got.seconds:.2f} s = "
                f"{len(got.pages) / got.seconds:.1f} pages/s"
            )
        live_s, live = audit_process(server.url, {"DSTACK_TOKEN": server.token})
        offline_s, offline = audit_process(str(run_dir / "c4"), {})
        named = json.dumps(offline["runs"]).replace(str(run_dir / "c4"), server.url)
        same = victims(offline) == victims(live) and json.loads(named) == live["runs"]
        truth = expected(json.loads((fleet / "truth.json").read_text()))
        found = victims(live)
        hit = len(found & truth)
        print(
            f"live audit (whole process) {live_s:.1f} s, offline audit {offline_s:.1f} s; "
            f"{live['summary']['runs']} runs; precision {hit / len(found) if found else 1:.3f}, "
            f"recall {hit / len(truth) if truth else 1:.3f}; "
            f"offline = live: {same}"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
