"""What masking secrets costs (not part of the test suite).

    python benchmarks/redaction.py [--runs N] [--out DIR]

- shapes: every rule over the lines of each capture's logs and of a generated server's logs
  (`synth --runs N`, ~40 lines per run), in lines per second, as one column and as one text.
- audit: the whole-process audit of the generated server.db and standard log, with the
  redaction as shipped vs with both nets switched off (the floor), each in a fresh process;
  the ratio is what redaction costs the audit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer import redact  # noqa: E402
from analyzer.synth import synthesize  # noqa: E402

AUDIT_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "off":
    import analyzer.pipeline.evidence, analyzer.redact
    analyzer.pipeline.evidence._redact = lambda evidence: None
    analyzer.redact.Redactor.apply_series = lambda self, texts: texts
started = time.perf_counter()
from analyzer import open_sources
from analyzer.render.markdown import render_markdown
audit = open_sources(sys.argv[3:])
audit.redact(render_markdown(audit.report))
print(json.dumps({"seconds": time.perf_counter() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def shapes(path: Path) -> dict:
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = pl.Series(text.splitlines())
    started = time.perf_counter()
    redact.redact_shapes(lines)
    column = time.perf_counter() - started
    started = time.perf_counter()
    redact.Redactor().apply(text)
    whole = time.perf_counter() - started
    return {
        "log": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name),
        "lines": lines.len(),
        "column_s": round(column, 3),
        "text_s": round(whole, 3),
        "lines_per_s": round(lines.len() / column) if column else None,
    }


def audit(mode: str, *sources: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", AUDIT_CHILD, str(ROOT), mode, *map(str, sources)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dstack-audit-redaction"))
    args = parser.parse_args()
    [rule.pattern for rule in redact.rules()]  # compiled once per process: not per-text cost
    base = args.out / f"synth-{args.runs}"
    if not (base / "server.db").exists():
        synthesize(base, runs=args.runs, seed=7)
    log = base / "logs" / "server.standard.log"
    results = {"rule_set": redact.RULE_SET, "rules": len(redact.rules())}
    results["shapes"] = [shapes(p) for p in sorted((ROOT / "tests/data/captures").rglob("*.log"))]
    results["shapes"].append(shapes(log))
    on, off = audit("on", base / "server.db", log), audit("off", base / "server.db", log)
    results["audit"] = {"on": on, "off": off, "ratio": round(on["seconds"] / off["seconds"], 3)}
    for row in results["shapes"]:
        print(
            f"{row['log']:<70} {row['lines']:>8} lines {row['column_s']:>7}s column "
            f"{row['text_s']:>7}s text"
        )
    print(
        f"audit {args.runs} runs: {on['seconds']:.1f}s with redaction, {off['seconds']:.1f}s "
        f"without: x{results['audit']['ratio']}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
