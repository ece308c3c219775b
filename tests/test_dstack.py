"""dstack's own facts, said once (analyzer/dstack.py): the spec fingerprint, the block fit and
the field lists that the detector, reconcile, exposure and the guard read."""

from __future__ import annotations

import json

import polars as pl

from analyzer.dstack import (
    FINISHED_JOB_STATUSES,
    IN_PLACE_CHANGES,
    IN_PLACE_CONF_FIELDS,
    REPLICA_COUNT_CHANGES,
    ROLLING_CONF_FIELDS,
    blocks_fit,
    spec_fingerprint,
)
from analyzer.pipeline.placement import Requirement


def _fingerprints(*specs: dict) -> list[str]:
    frame = pl.DataFrame({"spec": [json.dumps(s) for s in specs]})
    return frame.select(spec_fingerprint(pl.col("spec")))["spec"].to_list()


def test_the_fingerprint_changes_with_a_rolling_field_only():
    base = {"commands": ["serve"], "replica_num": 0, "job_name": "web-0-0"}
    same, other_replica, new_commands = _fingerprints(
        base, base | {"replica_num": 1, "job_name": "web-1-0"}, base | {"commands": ["crash"]}
    )
    assert same == other_replica
    assert same != new_commands


def test_a_change_of_fields_applied_in_place_rolls_nothing_out():
    in_place = {f.removeprefix("configuration.") for f in IN_PLACE_CHANGES}
    assert not in_place & set(ROLLING_CONF_FIELDS)
    assert in_place - {"inactivity_duration"} <= set(IN_PLACE_CONF_FIELDS)
    # a replica count change is in place for the jobs on the current spec, never a rollout
    assert {f.removeprefix("configuration.") for f in REPLICA_COUNT_CHANGES} <= set(
        IN_PLACE_CONF_FIELDS
    )
    assert "terminating" not in FINISHED_JOB_STATUSES


def _req(cpu: float, gpus: float = 0) -> Requirement:
    return Requirement("0", (cpu, None), (1, None), (gpus, gpus), (), (None, None), (None, None))


def test_a_replica_fits_the_smallest_share_of_idle_blocks():
    # 8 cpus in 4 blocks: a 2-cpu replica takes 1 block, a 4-cpu one 2
    assert blocks_fit(_req(2), 8, 32768, 0, None, None, None, 4, 3) is True
    assert blocks_fit(_req(4), 8, 32768, 0, None, None, None, 4, 3) is False
    assert blocks_fit(_req(4), 8, 32768, 0, None, None, None, 4, 2) is True
    # more than the whole instance never fits
    assert blocks_fit(_req(16), 8, 32768, 0, None, None, None, 4, 0) is False
