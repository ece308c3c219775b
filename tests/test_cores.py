"""Threads kept to cores (analyzer.cores): an audit in partitions in one process runs its
partitions, each a long run of small queries, with its threads on one core, where its own
thread and polars' pool hand over in place, and gives the process its cores back after."""

from __future__ import annotations

import os

import polars as pl
import pytest

from analyzer import api, cores
from analyzer.synth import synthesize

pytestmark = pytest.mark.skipif(len(cores.usable()) < 2, reason="one core: nothing to keep to")


def _kept() -> set[frozenset[int]]:
    """The cores each thread of this process may run on, as a set of those sets."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}


def test_kept_to_keeps_every_thread_and_gives_the_cores_back_on_an_error():
    usable = cores.usable()
    pl.LazyFrame({"a": [1, 2]}).select(pl.col("a").sum()).collect()  # polars' pool started
    with pytest.raises(RuntimeError), cores.kept_to({usable[-1]}):
        assert _kept() == {frozenset({usable[-1]})}
        raise RuntimeError("the work inside failed")
    assert _kept() == {frozenset(usable)}


def test_on_one_core_keeps_to_the_core_the_calling_thread_runs_on():
    with cores.on_one_core():
        [inside] = _kept()
        assert len(inside) == 1 and cores.current() in inside
    assert _kept() == {frozenset(cores.usable())}


def test_an_audit_in_partitions_audits_each_on_one_core(tmp_path, monkeypatch):
    synthesize(tmp_path / "server", 40, seed=7, log_formats=())
    seen = []
    audited = api.audit_partition

    def watched(*args, **kwargs):
        seen.append(_kept())
        return audited(*args, **kwargs)

    monkeypatch.setattr(api, "audit_partition", watched)
    usable = cores.usable()
    report = api.audit_in_partitions([tmp_path / "server" / "server.db"], 3)
    assert report.runs  # the audit did its work
    assert len(seen) == 3
    assert all(len(kept) == 1 and len(next(iter(kept))) == 1 for kept in seen), seen
    assert _kept() == {frozenset(usable)}  # and gave the cores back
