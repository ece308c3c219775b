"""The idle instances a surge replica's foresight lists (placement.reachable_idle): of each shape's
instances, only those the queued jobs placed first and the first fit can reach, and the same
placements and the same instance as with every instance listed, also when each shape keeps only
the rows of its first instances that the longest queue at that moment can reach
(exposure.assess_states)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.pipeline.placement import Queued, fits, place_queue, reachable_idle, requirement

AS_OF = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
FLEETS = ("f1", "f2")

shapes = st.lists(
    st.tuples(
        st.sampled_from(FLEETS),
        st.sampled_from([1, 2, 4]),  # cpus
        st.sampled_from([1, 2, 4]),  # total blocks
        st.integers(0, 3),  # busy blocks
        st.integers(1, 6),  # instances of the shape
        st.booleans(),  # provisioning
    ),
    min_size=1,
    max_size=5,
)
jobs = st.lists(st.tuples(st.sampled_from([None, *FLEETS]), st.sampled_from([1, 2, 4])), max_size=5)


def _listed(drawn) -> tuple[list[dict], SimpleNamespace]:
    """The fleets and what the foresight holds of them (their shapes by fleet and moment, each
    with the rows of its instances, and the instances' names by row) of the drawn shapes."""
    by_fleet: dict[tuple, list[dict]] = {}
    names: list[str] = []
    for kind, (fleet, cpus, total, busy, count, provisioning) in enumerate(drawn):
        rows = list(range(len(names), len(names) + count))
        names += [f"{fleet}-{kind}-{n}" for n in range(count)]
        by_fleet.setdefault(("s", fleet, AS_OF), []).append(
            {
                "cpus": cpus * total,
                "memory_mib": 4096 * total,
                "gpus": 0,
                "gpu_name": None,
                "gpu_memory_mib": None,
                "disk_mib": None,
                "total_blocks": total,
                "busy_blocks": min(busy, total),
                "provisioning": provisioning,
                "instance_name": names[rows[0]],
                "rows": rows,
            }
        )
    fleets = [{"server": "s", "fleet_id": f, "fleet_name": f"fleet-{f}"} for f in FLEETS]
    return fleets, SimpleNamespace(shapes=by_fleet, instance_names=names)


def _placed(idle: list[dict], queue: list[Queued], surge) -> tuple[list[str], str | None]:
    """What the queue takes first, then the instance the surge replica is placed on."""
    taken = place_queue(queue, idle, {}, {f: f"fleet-{f}" for f in FLEETS})
    first = next((i for i in idle if fits(surge, i)), None)
    return taken, None if first is None else first["instance_name"]


@settings(max_examples=300, deadline=None)
@given(shapes, jobs, st.sampled_from([1, 2, 4]), st.integers(0, 3))
def test_the_instances_listed_place_the_queue_and_the_surge_as_all_of_them(
    drawn, wanted, cpus, longer
):
    fleets, context = _listed(drawn)
    queue = [
        Queued(f"r{i}", f"run{i}", f"job{i}", fleet, None, 0, requirement("0", {"cpu": c}), None)
        for i, (fleet, c) in enumerate(wanted)
    ]
    surge = requirement("0", {"cpu": cpus})
    every = [
        {**inst, "fleet_name": fleet["fleet_name"], "fleet_id": fleet["fleet_id"]}
        | {"instance_name": context.instance_names[each]}
        for fleet in fleets
        for inst in context.shapes.get(("s", fleet["fleet_id"], AS_OF), [])
        if not inst["provisioning"]
        for each in inst["rows"]
    ]
    listed = reachable_idle(fleets, context.shapes, context.instance_names, AS_OF, len(queue))
    assert _placed(listed, queue, surge) == _placed(every, queue, surge)
    assert len(listed) <= len(drawn) * (len(queue) + 1)
    # each shape's rows cut to the longest queue of the moment (this one or `longer`) and one
    kept = len(queue) + longer + 1
    cut = {
        key: [{**inst, "rows": inst["rows"][:kept]} for inst in insts]
        for key, insts in context.shapes.items()
    }
    reached = reachable_idle(fleets, cut, context.instance_names, AS_OF, len(queue))
    again = reachable_idle(fleets, context.shapes, context.instance_names, AS_OF, len(queue))
    assert [_without_rows(i) for i in reached] == [_without_rows(i) for i in again]
    assert _placed(reached, queue, surge) == _placed(again, queue, surge)


def _without_rows(instance: dict) -> dict:
    """An instance listed, but the rows of its shape's instances (what no placement reads)."""
    return {name: value for name, value in instance.items() if name != "rows"}
