"""The guard's decision on hand-built fleets (issue 25): the shapes of dstack 0.22.5's API."""

from __future__ import annotations

from datetime import UTC, datetime

from analyzer.guard import decide

NOW = datetime(2026, 1, 1, 1, tzinfo=UTC)
OLD = {
    "run_name": "web",
    "configuration": {
        "type": "service",
        "commands": ["serve"],
        "replicas": 1,
        "resources": {"cpu": {"min": 2}, "memory": {"min": 8}},
    },
}
RUN = {
    "id": "r1",
    "status": "running",
    "submitted_at": "2026-01-01T00:00:00Z",
    "fleet": {"id": "f1"},
    "run_spec": OLD,
    "jobs": [
        {"job_spec": {"replica_num": 0, "job_num": 0}, "job_submissions": [{"status": "running"}]}
    ],
}


def instance(status="busy", busy=1, cpus=2):
    resources = {"cpus": cpus, "memory_mib": 8192, "gpus": []}
    return {
        "status": status,
        "busy_blocks": busy,
        "total_blocks": 1,
        "instance_type": {"resources": resources},
    }


def fleet(instances, high=1, ssh=False):
    conf = {"nodes": {"min": 0, "max": high}} | ({"ssh_config": {"hosts": ["h"]}} if ssh else {})
    return {
        "id": "f1",
        "name": "cpu-fleet",
        "spec": {"configuration": conf},
        "instances": instances,
    }


def changed(**conf):
    return {**OLD, "configuration": {**OLD["configuration"], **conf}}


def verdict(spec, fleets, others=(), current=RUN):
    return decide(spec, current, fleets, list(others), "0.22.5", NOW)


def test_nodes_at_max_rejects_with_the_fix():
    got = verdict(changed(commands=["serve --v2"]), [fleet([instance()])])
    assert got.decision == "reject"
    assert "cpu-fleet" in got.reason and "nodes.max 1" in got.reason
    assert "1 healthy replica" in got.reason and "nodes.max to 2" in got.reason


def test_idle_instance_that_fits_or_not():
    fits = [fleet([instance(), instance("idle", 0)])]
    assert verdict(changed(commands=["v2"]), fits).decision == "approve"
    small = [fleet([instance(), instance("idle", 0, cpus=1)], high=2)]
    assert verdict(changed(commands=["v2"]), small).decision == "reject"


def test_ssh_fleet_never_provisions():
    got = verdict(changed(commands=["v2"]), [fleet([instance()], high=None, ssh=True)])
    assert got.decision == "reject" and "SSH fleet" in got.reason


def test_another_runs_queued_replica_takes_the_room():
    queued = {
        "id": "r2",
        "fleet": {"id": "f1"},
        "run_spec": {"run_name": "other"},
        "jobs": [{"job_spec": {}, "job_submissions": [{"status": "submitted"}]}],
    }
    spec = changed(commands=["v2"])
    assert verdict(spec, [fleet([instance()], high=2)]).decision == "approve"
    got = verdict(spec, [fleet([instance()], high=2)], [queued])
    assert got.decision == "reject" and "other (1)" in got.reason


def test_retry_on_no_capacity_is_named():
    retry = {"on_events": ["no-capacity"], "duration": 86400}
    old = {**OLD, "configuration": {**OLD["configuration"], "retry": retry}}
    current = {**RUN, "run_spec": old}
    spec = {**old, "configuration": {**old["configuration"], "commands": ["v2"]}}
    got = verdict(spec, [fleet([instance()])], current=current)
    assert got.decision == "reject" and "retry on no-capacity for 86400 s" in got.reason
    # retry is not updatable in place: changing it makes dstack replace the run
    assert verdict(changed(commands=["v2"], retry=retry), [fleet([instance()])]).decision == (
        "approve"
    )


def test_no_new_replica_and_new_runs_pass():
    assert verdict(changed(priority=5), [fleet([instance()])]).decision == "approve"
    assert (
        verdict(changed(commands=["v2"]), [fleet([instance()])], current=None).decision == "approve"
    )
    assert verdict(changed(replicas=2), [fleet([instance()])]).decision == "reject"
