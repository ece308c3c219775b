"""An audit in partitions holds one partition at a time: each partition's runs and findings go
to the merge's private folder as it finishes (analyzer.pipeline.partitions.ReportSpill), so
the peak memory of the whole process does not grow with the number of partitions when each
holds as many runs; the report streamed from there is the one-process report, byte for byte.
Whole processes, as a user runs them."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from analyzer.sources.partition import service_bucket
from analyzer.synth import synthesize
from tests.conftest import (
    CAPTURES,
    interrupt_partitioned_audit,
    plant_env_secret,
    plant_failure_message,
)

# stories that end in findings (collateral terminations with their evidence chains): the
# reports the merge used to hold for every partition are large, so holding them shows
MIX = {"seed": 1, "multi-replica-crash": 1, "two-updates": 1, "rollout-partial-fails": 1}
RUNS_PER_BUCKET = 150
TOLERANCE_MB = 75
"""How much more the peak may be with 8 buckets than with 2 (4x the runs): what grows with the
input by design (the fleets and instances every partition reads whole, each run's verdict and
each finding's summary figures for the merge, the final pass's chunk of the report text until
it reaches redact.CHUNK_CHARS) and the allocator's slack. Measured on this machine: +22 to +36
MB on 73640cc, +32 to +58 MB from 63ccce8 on (+62 once, under load: 60 MB was too near); the
merge that held every partition's report (8becd73): +92 to +99 MB. At a fixed input the peak
does not grow with the partitions: 2,400 runs in 8, 16 and 32 partitions peak at 279, 295 and
291 MB."""


# the audit as `dstack-audit` runs it, saying its own peak at the end (an exit handler: the
# console script's process ends with its command, analyzer.cli.options): the high-water mark
# of its memory since exec (VmHWM), not the child's ru_maxrss, which counts the pages it shared
# with this (larger) process when it was forked
_RUN_AND_SAY_PEAK = """
import atexit, runpy, sys

def say_peak():
    peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")]
    sys.stderr.write("peak " + peak[0].split()[1] + "\\n")

atexit.register(say_peak)
sys.argv = ["dstack-audit", *sys.argv[1:]]
runpy.run_module("analyzer", run_name="__main__")
"""


def _audit(args: list[str], **env: str) -> int:
    """Run `dstack-audit audit ARGS -q` to its end, `env` added to its environment; its peak
    RSS in MB."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_SAY_PEAK, "audit", *args, "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        env={**os.environ, **env},
    )
    said = done.stderr.splitlines()
    assert done.returncode == 0 and said[-1].startswith("peak "), done.stderr
    return int(said[-1].split()[1]) // 1024  # VmHWM is in kB


def _server(folder: Path, buckets: int) -> Path:
    synthesize(folder, buckets * RUNS_PER_BUCKET, seed=7, log_formats=(), mix=MIX)
    return folder / "server.db"


def test_peak_memory_does_not_grow_with_the_number_of_buckets(tmp_path):
    # one thread pool for both, each server's peak measured on it whatever its size would
    # choose (cli.options.ONE_CORE_BYTES: one core for a smaller input)
    pool = {"POLARS_MAX_THREADS": str(len(os.sched_getaffinity(0)))}
    peaks = {}
    for buckets in (2, 8):
        db = _server(tmp_path / f"server-{buckets}", buckets)
        out = tmp_path / f"partitions-{buckets}.json"
        peaks[buckets] = _audit([str(db), "--partitions", str(buckets), "-o", str(out)], **pool)
    assert peaks[8] - peaks[2] < TOLERANCE_MB, peaks
    # and the streamed report is the one-process report, byte for byte
    whole = tmp_path / "whole.json"
    _audit([str(tmp_path / "server-8" / "server.db"), "-o", str(whole)])
    assert out.read_bytes() == whole.read_bytes()


def test_a_secret_one_partition_knows_is_masked_in_the_others(tmp_path):
    """A token in the job specs of one partition's runs, repeated in the failure messages of
    another partition's: one process masks it in both, and so does the merge, also when
    each partition is finished in the process that audited it (--workers 2: the other's
    secret values reach it with the foresight's pieces)."""
    secret = "hf_PlantedAcrossPartitions_4242"
    synthesize(tmp_path / "server", 60, seed=7, log_formats=(), mix=MIX)
    db = tmp_path / "server" / "server.db"
    with sqlite3.connect(db) as connection:
        runs = connection.execute("SELECT id, project_id, run_name FROM runs").fetchall()
    buckets = {run: service_bucket(project, name, 2) for run, project, name in runs}
    ids = {bucket: [run for run, b in buckets.items() if b == bucket] for bucket in (0, 1)}
    assert ids[0] and ids[1]
    plant_env_secret(db, secret, runs=ids[0])
    plant_failure_message(db, f"exited: token {secret} rejected", runs=ids[1])
    whole, merged = tmp_path / "whole.json", tmp_path / "merged.json"
    _audit([str(db), "-o", str(whole)])
    _audit([str(db), "--partitions", "2", "-o", str(merged)])
    text = whole.read_text()
    assert secret not in text and "token *** rejected" in text
    assert merged.read_bytes() == whole.read_bytes()
    _audit([str(db), "--workers", "2", "-o", str(merged)])
    assert merged.read_bytes() == whole.read_bytes()


def test_ctrl_c_during_the_partitions_leaves_no_spill_folder(tmp_path):
    """Interrupted once the merge's folder holds a partition's report: exit 130, and the
    folder (in TMPDIR, never beside the evidence) is gone with everything in it."""
    synthesize(tmp_path / "server", 600, seed=7, log_formats=(), mix=MIX)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    db, out = tmp_path / "server" / "server.db", tmp_path / "report.json"
    status, errors = interrupt_partitioned_audit(db, 6, out, temporary, "dstack-audit-merge-*/*")
    assert status == 130, errors
    assert not list(temporary.iterdir())
    assert not out.exists()
    assert {p.name for p in db.parent.iterdir()} == {"server.db", "truth.json", "logs"}


def test_a_log_beside_its_database_is_refused_in_partitions_and_a_dataset_is_not(tmp_path):
    """A log is read whole by every partition: its runs of the other partitions would be runs
    of the log alone, under other ids, in each (the merge cannot see them twice). Refused as
    one line naming the log, no report; ingested into a dataset, the same inputs audit in
    partitions as in one process."""
    seed = CAPTURES / "v0.22.5" / "seed"
    folder = tmp_path / "server"
    folder.mkdir()
    shutil.copyfile(seed / "server.db", folder / "server.db")
    log = folder / "server.log"
    shutil.copyfile(seed / "logs" / "server-info.standard.log", log)
    report = tmp_path / "partitions.json"
    done = _command("audit", str(folder), "--partitions", "2", "-q", "-o", str(report))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert str(log) in done.stderr and "one partition at a time" in done.stderr
    assert not report.exists()
    dataset = tmp_path / "dataset"
    assert _command("ingest", str(folder), "--to", str(dataset), "-q").returncode == 0
    whole, merged = tmp_path / "whole.json", tmp_path / "merged.json"
    assert _command("audit", str(dataset), "-q", "-o", str(whole)).returncode == 0
    assert (
        _command("audit", str(dataset), "--partitions", "2", "-q", "-o", str(merged)).returncode
        == 0
    )
    assert merged.read_bytes() == whole.read_bytes()


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", *args], capture_output=True, text=True, check=False
    )


def test_a_partitions_own_secret_in_a_text_built_after_masking_is_masked_by_the_merge(
    tmp_path, monkeypatch
):
    """A partition's texts are masked at the source with its own secret values; a text built
    from them after that (a name and a message joined) can hold one again. The merge's guard,
    with every partition's values (its own among them), masks it in what is written, as one
    process's guard does: a partition does not guard its report alone first."""
    from analyzer import api

    secret = "hf_PlantedInEveryPartition_4242"
    synthesize(tmp_path / "server", 60, seed=7, log_formats=(), mix=MIX)
    db = tmp_path / "server" / "server.db"
    plant_env_secret(db, secret)
    assemble = api.Audit._assemble

    def built_after_masking(self, *, figures=True):
        report = assemble(self, figures=figures)
        if not report.findings:
            return report
        finding = report.findings[0]
        victim = finding.victims[0].model_copy(
            update={"job_name": f"web-{secret[:9]}" + secret[9:]}
        )
        findings = [finding.model_copy(update={"victims": [victim]}), *report.findings[1:]]
        return report.model_copy(update={"findings": findings})

    monkeypatch.setattr(api.Audit, "_assemble", built_after_masking)
    for count in (1, 2):
        report = (
            api.open_sources([db]).report if count == 1 else api.audit_in_partitions([db], count)
        )
        text = report.model_dump_json()
        assert f"web-{secret}" not in text and "web-***" in text, count
