"""The guard's decision on hand-built fleets (issue 25): the shapes of dstack 0.22.5's API."""

from __future__ import annotations

from datetime import UTC, datetime

from click.testing import CliRunner

from analyzer.cli import main
from analyzer.service.guard import decide

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


def instance(status="busy", busy=1, cpus=2, blocks=1, backend="aws"):
    resources = {"cpus": cpus, "memory_mib": 8192 * cpus // 2, "gpus": []}
    return {
        "status": status,
        "backend": backend,
        "busy_blocks": busy,
        "total_blocks": blocks,
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


ROLLING = changed(commands=["serve --v2"])


def rolling_with(**conf):
    """(a rolling update, the running service) both configured with `conf`."""
    old = {**OLD, "configuration": {**OLD["configuration"], **conf}}
    spec = {**old, "configuration": {**old["configuration"], "commands": ["serve --v2"]}}
    return spec, {**RUN, "run_spec": old}


def queued_run(run_id="r2", fleet_id="f1", placed=False):
    provisioning = {"job_provisioning_data": {"hostname": "10.0.0.9"}} if placed else {}
    return {
        "id": run_id,
        "fleet": {"id": fleet_id},
        "run_spec": {"run_name": f"run-{run_id}"},
        "jobs": [{"job_spec": {}, "job_submissions": [{"status": "submitted", **provisioning}]}],
    }


def test_idle_blocks_of_a_shared_instance_fit_only_when_enough_are_free():
    # 4 CPUs in 2 blocks, one busy: the free block's 2 CPUs and 8 GB hold one replica
    shared = [fleet([instance(busy=1, cpus=4, blocks=2)])]
    assert verdict(ROLLING, shared).decision == "approve"
    # 2 CPUs in 2 blocks: one replica needs both blocks, one is busy
    halves = [fleet([instance(busy=1, cpus=2, blocks=2)])]
    assert verdict(ROLLING, halves).decision == "reject"
    # an instance whose resources the server did not say: unknown, never a guess
    blind = fleet([instance(), {**instance("idle", 0), "instance_type": None}])
    got = verdict(ROLLING, [blind])
    assert got.decision == "unknown" and "1 instance(s) of unknown resources" in got.reason


def test_nodes_below_max_or_unbounded_leave_room_unless_creation_is_reuse():
    assert verdict(ROLLING, [fleet([instance()], high=2)]).decision == "approve"
    assert verdict(ROLLING, [fleet([instance()], high=None)]).decision == "approve"
    # a terminated instance no longer counts against nodes.max
    gone = fleet([{**instance(), "status": "terminated"}, instance()], high=2)
    assert verdict(ROLLING, [gone]).decision == "approve"
    spec, current = rolling_with(creation_policy="reuse")
    assert verdict(spec, [fleet([instance()], high=2)], current=current).decision == "reject"


def test_ssh_fleet_with_an_idle_host_that_fits():
    hosts = [instance(backend="remote"), instance("idle", 0, backend="remote")]
    assert verdict(ROLLING, [fleet(hosts, high=None, ssh=True)]).decision == "approve"
    # hosts of the remote backend make a fleet an SSH fleet even when its spec does not say so
    got = verdict(ROLLING, [fleet([instance(backend="remote")], high=None)])
    assert got.decision == "reject" and "add a host to SSH fleet cpu-fleet" in got.reason


def test_only_other_runs_unplaced_replicas_on_the_same_fleets_take_the_room():
    room_for_one = [fleet([instance()], high=2)]
    assert verdict(ROLLING, room_for_one, [queued_run(fleet_id="f9")]).decision == "approve"
    assert verdict(ROLLING, room_for_one, [queued_run(placed=True)]).decision == "approve"
    assert verdict(ROLLING, room_for_one, [queued_run(run_id="r1")]).decision == "approve"
    got = verdict(ROLLING, room_for_one, [queued_run(), queued_run("r3", fleet_id=None)])
    assert got.decision == "reject" and "run-r2 (1), run-r3 (1)" in got.reason


def test_retry_on_no_capacity_delays_the_failure_only_while_its_window_lasts():
    def with_retry(retry):
        spec, current = rolling_with(retry=retry)
        return verdict(spec, [fleet([instance()])], current=current).reason

    waits = with_retry({"on_events": ["no-capacity"], "duration": 7200})
    assert "when its retry ends" in waits and "3600 s left now" in waits
    past = with_retry({"on_events": ["no-capacity"], "duration": 600})
    assert "when its retry ends" not in past and "already past now" in past
    other = with_retry({"on_events": ["error"], "duration": 7200})
    assert "when its retry ends" not in other and "not on no-capacity" in other


def test_guard_without_a_token_a_secret_or_a_server_stops_with_one_line():
    closed, secret = "http://127.0.0.1:9", {"DSTACK_AUDIT_GUARD_SECRET": "a-caller-secret-0123"}
    result = CliRunner().invoke(
        main, ["guard", "--server", closed], env={"DSTACK_TOKEN": None, **secret}
    )
    assert result.exit_code == 2 and "no token was given" in result.output
    for weak in (None, "short", "has:a-colon-0123456789"):
        result = CliRunner().invoke(
            main,
            ["guard", "--server", closed, "--token", "tok-0123456789abcdef"],
            env={"DSTACK_AUDIT_GUARD_SECRET": weak},
        )
        assert result.exit_code == 2 and "DSTACK_AUDIT_GUARD_SECRET" in result.output
        assert len(result.output.strip().splitlines()) == 1
    token = "tok-0123456789abcdef"  # pasted into the URL by mistake: masked in the error
    result = CliRunner().invoke(
        main, ["guard", "--server", f"{closed}/{token}", "--token", token], env=secret
    )
    assert result.exit_code == 2 and "check the URL" in result.output
    assert len(result.output.strip().splitlines()) == 1 and token not in result.output
