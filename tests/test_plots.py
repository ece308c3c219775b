"""Timeline pictures: the run swimlane and the fleet charts, checked by their structure (artists,
labels, legend, annotations), never by pixels. Real captures, a fleet-wide audit of several
capture databases, and synthetic runs built from a capture (20 replicas; 30 retried
submissions of one slot).

`python tests/test_plots.py DIR` writes the synthetic pictures to DIR (samples/rendered)."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from conftest import CAPTURES, plant_env_secret, plant_failure_message

from analyzer import open_sources
from analyzer.errors import AuditInputError
from analyzer.pipeline.impact import serving_capacity
from analyzer.render.format import Clock
from analyzer.render.plots import (
    KEEP_PER_SLOT,
    figure_bytes,
    plot_fleet,
    plot_run,
)

SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"
STATUSES = (
    "submitted",
    "provisioning",
    "pulling",
    "running",
    "terminating",
    "terminated",
    "failed",
)


# ---------------------------------------------------------------------------------------------
# Reading a figure back


def _artists(fig):
    for ax in fig.axes:
        yield ax
        yield from ax.get_children()
        yield from ax.texts
        legend = ax.get_legend()
        if legend is not None:
            yield legend


def _gids(fig) -> list[str]:
    return [a.get_gid() for a in _artists(fig) if a.get_gid()]


def _axes(fig, gid: str):
    return next(ax for ax in fig.axes if ax.get_gid() == gid)


def _lane_labels(fig) -> list[str]:
    return [t.get_text() for t in _axes(fig, "lanes").get_yticklabels()]


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def _texts(fig, prefix: str) -> dict[str, str]:
    """gid -> text of every Text artist whose gid starts with `prefix`."""
    found = {}
    for ax in fig.axes:
        for text in ax.texts:
            gid = text.get_gid() or ""
            if gid.startswith(prefix):
                found.setdefault(gid, text.get_text())
    return found


def _all_text(fig) -> str:
    parts = []
    for ax in fig.axes:
        parts += [t.get_text() for t in ax.texts]
        parts += [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels()]
        parts += [ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend:
            parts += [t.get_text() for t in legend.get_texts()]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Synthetic runs built from real captures


def _job_rows(audit, name: str) -> tuple[dict, list[dict]]:
    job = audit.submissions.filter(pl.col("job_name") == name).row(0, named=True)
    events = audit.events.filter(pl.col("entity_id") == job["job_id"]).to_dicts()
    return job, events


def _replace(audit, **frames) -> None:
    """Swap the audit's frames (cached properties) for synthetic ones."""
    for name, frame in frames.items():
        audit.__dict__[name] = frame
    if "submissions" in frames:
        audit.__dict__["capacity"] = serving_capacity(
            frames["submissions"],
            frames.get("events", audit.events),
            audit.end_of_evidence,
            audit.evidence.ends_by_server(),
        )


def retried_audit(retries: int = 30):
    """The seed, where the new replica's slot was retried: `retries` submissions of web-0-1
    (12 s apart, each failing for no capacity), the last one the culprit."""
    audit = open_sources([SEED / "server.db"])
    culprit, culprit_events = _job_rows(audit, "web-0-1")
    created = culprit["created_at"]
    rows, events = [], []
    for k in range(retries - 1):
        at = created - timedelta(seconds=12 * (retries - 1 - k))
        job_id = str(uuid.UUID(int=k + 1))
        rows.append(
            {
                **culprit,
                "job_id": job_id,
                "submission_num": k,
                "created_at": at,
                "submitted_at": at,
                "stopped_at": at + timedelta(seconds=2),
                "finished_at": at + timedelta(seconds=6),
                "last_processed_at": at + timedelta(seconds=6),
            }
        )
        for event in culprit_events:
            events.append(
                {
                    **event,
                    "entity_id": job_id,
                    "time": at + (event["time"] - created),
                    "seq": 10_000 + k * 10 + event["seq"],
                }
            )
    subs = pl.concat(
        [
            audit.submissions.with_columns(
                pl.when(pl.col("job_id") == culprit["job_id"])
                .then(pl.lit(retries - 1))
                .otherwise(pl.col("submission_num"))
                .alias("submission_num")
            ),
            pl.DataFrame(rows, schema=audit.submissions.schema),
        ]
    )
    first = created - timedelta(seconds=12 * (retries - 1) + 5)
    deployments = audit.deployments.with_columns(
        pl.when(pl.col("deployment_num") == 1)
        .then(pl.lit(first))
        .otherwise(pl.col("began_at"))
        .alias("began_at")
    )
    all_events = pl.concat([audit.events, pl.DataFrame(events, schema=audit.events.schema)])
    all_events = all_events.with_columns(
        pl.when(pl.col("kind") == "run_updated")
        .then(pl.lit(first))
        .otherwise(pl.col("time"))
        .alias("time")
    ).sort("time")
    _replace(audit, submissions=subs, deployments=deployments, events=all_events)
    return audit


def wide_audit(replicas: int = 20):
    """multi-replica-crash with `replicas` healthy old replicas (all killed) instead of 3."""
    audit = open_sources([CRASH / "server.db"])
    template, template_events = _job_rows(audit, "svc-0-0")
    culprit, _ = _job_rows(audit, "svc-0-3")
    old_ids = set(audit.submissions.filter(pl.col("deployment_num") == 0)["job_id"].to_list())
    rows, events = [], []
    for r in range(replicas):
        job_id = str(uuid.UUID(int=1000 + r))
        shift = timedelta(seconds=1.5 * r)
        rows.append(
            {
                **template,
                "job_id": job_id,
                "job_name": f"svc-0-{r}",
                "replica_num": r,
                "running_at": template["running_at"] + shift,
                "healthy_since": template["healthy_since"] + shift,
                "ready_at": template["ready_at"] + shift,
            }
        )
        for event in template_events:
            late = event["new_status"] in ("terminating", "terminated")
            events.append(
                {
                    **event,
                    "entity_id": job_id,
                    "entity_name": f"svc-0-{r}",
                    "time": event["time"] + (timedelta(0) if late else shift),
                    "seq": 20_000 + r * 100 + event["seq"],
                }
            )
    subs = pl.concat(
        [
            audit.submissions.filter(~pl.col("job_id").is_in(old_ids)).with_columns(
                pl.lit(f"svc-0-{replicas}").alias("job_name"),
                pl.lit(replicas, dtype=audit.submissions.schema["replica_num"]).alias(
                    "replica_num"
                ),
            ),
            pl.DataFrame(rows, schema=audit.submissions.schema),
        ]
    ).sort("replica_num")
    all_events = pl.concat(
        [
            audit.events.filter(~pl.col("entity_id").is_in(old_ids)),
            pl.DataFrame(events, schema=audit.events.schema),
        ]
    ).sort("time")
    report = audit.report
    finding = report.findings[0]
    victim = finding.victims[0]
    victims = [
        victim.model_copy(
            update={
                "job_id": row["job_id"],
                "job_name": row["job_name"],
                "replica_num": row["replica_num"],
                "healthy_since": row["healthy_since"],
            }
        )
        for row in rows
    ]
    culprits = [c.model_copy(update={"job_name": f"svc-0-{replicas}"}) for c in finding.culprits]
    finding = finding.model_copy(update={"victims": victims, "culprits": culprits})
    _replace(audit, submissions=subs, events=all_events)
    audit.__dict__["report"] = report.model_copy(update={"findings": [finding]})
    assert culprit["job_id"] in subs["job_id"].to_list()
    return audit


# ---------------------------------------------------------------------------------------------
# The swimlane of real captures


@pytest.fixture(scope="module")
def seed():
    return open_sources([SEED])


@pytest.fixture(scope="module")
def crash():
    return open_sources([CRASH])


@pytest.fixture(scope="module")
def seed_fig(seed):
    return plot_run(seed, seed.report.findings[0].run_id)


def _finding_run(audit) -> str:
    return audit.report.findings[0].run_id


def test_seed_lanes_name_every_submission_and_its_deployment(seed_fig):
    fig = seed_fig
    labels = _lane_labels(fig)
    assert labels[0] == "deployment 0"
    assert "deployment 1" in labels
    assert any("web-0-0" in label and "victim" in label for label in labels)
    assert any("web-0-1" in label and "culprit" in label for label in labels)
    # every lane sits under its deployment's header
    assert labels.index("deployment 0") < labels.index(
        next(label for label in labels if "web-0-0" in label)
    )
    assert labels.index("deployment 1") < labels.index(
        next(label for label in labels if "web-0-1" in label)
    )
    notes = _texts(fig, "deployment-note")
    assert notes  # the update's author and changed fields, inside the header band
    text = _all_text(fig)
    assert "update 09:08:50 by alice: changed commands" in text


def test_seed_legend_has_every_status_and_the_healthy_band(seed_fig):
    fig = seed_fig
    legend = _legend_texts(fig)
    for status in STATUSES:
        assert status in legend, status
    assert "healthy (serving)" in legend
    assert "outage" in legend
    gids = _gids(fig)
    assert "healthy" in gids  # the hatched band of the victim
    for status in ("submitted", "provisioning", "pulling", "running", "terminating"):
        assert f"status-{status}" in gids, status
    assert "final-terminated" in gids and "final-failed" in gids


def test_seed_markers_update_failure_terminating_and_victim_stop(seed_fig):
    fig = seed_fig
    key = _texts(fig, "key-")
    assert "update" in key["key-update"] and "deployment 1 by alice" in key["key-update"]
    assert "09:08:50.796" in key["key-update"]
    assert "web-0-1" in key["key-culprit_failure"]
    assert "no capacity (Fleet is at capacity)" in key["key-culprit_failure"]
    assert "run TERMINATING (JOB_FAILED)" in key["key-run_terminating"]
    assert "web-0-0" in key["key-victim_stop"] and "TERMINATED_BY_SERVER" in key["key-victim_stop"]
    gids = _gids(fig)
    for kind in ("update", "culprit_failure", "run_terminating", "victim_stop"):
        assert f"line-{kind}" in gids, kind
        assert f"callout-{kind}" in gids, kind
    assert "point-culprit_failure" in gids and "point-victim_stop" in gids
    # callouts are numbered in time order
    callouts = [
        text
        for ax in fig.axes
        for text in ax.texts
        if (text.get_gid() or "").startswith("callout-")
    ]
    numbers = [int(c.get_text().strip("◀ ")) for c in callouts]
    assert sorted(numbers) == list(range(1, len(numbers) + 1))


def test_seed_capacity_axis_and_outage_span(seed, seed_fig):
    fig = seed_fig
    capacity = _axes(fig, "capacity-axes")
    assert "healthy" in capacity.get_ylabel()
    steps = [line for line in capacity.get_lines() if line.get_gid() == "capacity"]
    assert steps and max(steps[0].get_ydata()) == 1
    spans = [p for p in capacity.patches if p.get_gid() == "outage"]
    assert len(spans) == 1
    finding = seed.report.findings[0]
    assert "not recovered" in spans[0].get_label()
    # the span starts where the victim was stopped
    x0 = spans[0].get_x() if hasattr(spans[0], "get_x") else spans[0].get_xy()[0][0]
    import matplotlib.dates as mdates

    assert abs(
        mdates.num2date(x0).replace(tzinfo=None) - finding.impact.outage_start.replace(tzinfo=None)
    ) < timedelta(milliseconds=1)


def test_seed_zooms_on_the_incident_and_labels_times_in_utc(seed_fig):
    fig = seed_fig
    gids = [ax.get_gid() for ax in fig.axes]
    assert "lanes-zoom" in gids and "capacity-axes-zoom" in gids
    assert "time (UTC) on 2026-11-02" in _axes(fig, "capacity-axes").get_xlabel()
    assert "1970" not in _all_text(fig)


def test_display_zone(seed):
    fig = plot_run(seed, _finding_run(seed), tz="Europe/Berlin")
    assert "Europe/Berlin, UTC+01:00" in _axes(fig, "capacity-axes").get_xlabel()
    assert "10:08:50.796" in _texts(fig, "key-update")["key-update"]
    with pytest.raises(AuditInputError):
        plot_run(seed, _finding_run(seed), tz="Mars/Olympus")


def test_crash_three_victims_marked_on_their_lanes(crash):
    fig = plot_run(crash, _finding_run(crash))
    labels = _lane_labels(fig)
    for name in ("svc-0-0", "svc-0-1", "svc-0-2"):
        assert any(name in label and "victim" in label for label in labels)
    assert any("svc-0-3" in label and "culprit" in label for label in labels)
    key = _texts(fig, "key-")
    assert "3 healthy replicas of deployment 0 stopped" in key["key-victim_stop"]
    assert "exited with code 2" in key["key-culprit_failure"]
    victim_points = [
        line
        for ax in fig.axes
        if ax.get_gid() == "lanes"
        for line in ax.get_lines()
        if line.get_gid() == "point-victim_stop"
    ]
    assert len(victim_points) == 3
    capacity = _axes(fig, "capacity-axes")
    step = next(line for line in capacity.get_lines() if line.get_gid() == "capacity")
    assert max(step.get_ydata()) == 3
    assert [p for p in capacity.patches if p.get_gid() == "outage"]


def test_rich_log_alone_shows_times_of_day_and_never_the_pseudo_date():
    audit = open_sources([SEED / "logs" / "server-info.rich.log"])
    fig = plot_run(audit, audit.report.findings[0].run_id)
    text = _all_text(fig)
    assert "1970" not in text
    assert "date and zone unknown" in _axes(fig, "capacity-axes").get_xlabel()
    assert "times of day only" in text
    key = _texts(fig, "key-")
    assert key["key-update"].startswith("1  09:08:50  update")
    # the outage comes from the capacity when the report has no dated impact
    capacity = _axes(fig, "capacity-axes")
    assert [p for p in capacity.patches if p.get_gid() == "outage"]
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        svg = figure_bytes(fig, "svg")
    assert b"09:08:50" in svg and b"1970" not in svg


def test_tables_only_evidence_draws_table_times():
    audit = open_sources([CAPTURES / "v0.19" / "seed" / "server.db"])
    assert audit.events.height == 0
    fig = plot_run(audit, audit.report.findings[0].run_id)
    gids = _gids(fig)
    assert "status-unknown" in gids  # no status path recorded: said, not invented
    assert "healthy-estimated" in gids
    legend = _legend_texts(fig)
    assert "status not recorded (tables)" in legend
    assert "update at or before" in _all_text(fig)


def test_run_without_finding_has_no_outage():
    audit = open_sources([CAPTURES / "v0.22.5" / "rolling-ok" / "server.db"])
    fig = plot_run(audit, audit.runs["run_id"][0])
    assert not [p for ax in fig.axes for p in ax.patches if p.get_gid() == "outage"]
    assert "line-update" in _gids(fig)
    assert "verdict: no_incident" in _all_text(fig)
    assert "lanes-zoom" not in [ax.get_gid() for ax in fig.axes]


def test_thirty_retries_collapse_and_say_how_many():
    audit = retried_audit(30)
    assert audit.submissions.height == 31
    fig = plot_run(audit, audit.runs["run_id"][0])
    labels = _lane_labels(fig)
    collapsed = [label for label in labels if "collapsed" in label]
    assert collapsed == [
        f"web-0-1: {30 - KEEP_PER_SLOT} earlier submissions collapsed (sub 0-{29 - KEEP_PER_SLOT})"
    ]
    kept = [label for label in labels if label.startswith("web-0-1 · sub")]
    assert len(kept) == KEEP_PER_SLOT
    assert any("sub 29 · culprit" in label for label in kept)
    assert len(labels) == 2 + 1 + 1 + KEEP_PER_SLOT  # 2 headers, victim, collapsed lane, kept
    assert f"{30 - KEEP_PER_SLOT} superseded submission(s) collapsed" in _all_text(fig)


def test_twenty_replicas_one_lane_each_and_one_grouped_stop_marker():
    audit = wide_audit(20)
    fig = plot_run(audit, audit.runs["run_id"][0])
    labels = _lane_labels(fig)
    victims = [label for label in labels if "victim" in label]
    assert len(victims) == 20
    assert len(set(victims)) == 20
    key = _texts(fig, "key-")
    assert "20 healthy replicas of deployment 0 stopped" in key["key-victim_stop"]
    assert "(+15)" in _all_text(fig)  # the names are cut, the count is not
    capacity = _axes(fig, "capacity-axes")
    step = next(line for line in capacity.get_lines() if line.get_gid() == "capacity")
    assert max(step.get_ydata()) == 20
    # lanes are tall enough to read: the figure grows with the lanes
    assert fig.get_figheight() > 20 * 0.28


def test_fleet_wide_audit_run_and_fleet_pictures():
    dbs = sorted((CAPTURES / "v0.22.5").glob("*/server.db")) + sorted(
        (CAPTURES / "v0.20").glob("*/server.db")
    )
    audit = open_sources(dbs)
    report = audit.report
    assert len(report.findings) >= 4
    # the same project/run name twice (two captures): each run by its id
    ids = {f.run_id for f in report.findings if f.run_name == "web" and f.project == "acme"}
    assert len(ids) == 2
    for run_id in ids:
        fig = plot_run(audit, run_id)
        assert any("web-0-0" in label for label in _lane_labels(fig))
        assert run_id[:8] in _all_text(fig)
    fig = plot_fleet(report)
    gids = [ax.get_gid() for ax in fig.axes]
    for gid in (
        "incidents-per-day",
        "outage-by-project",
        "cost-by-project",
        "failure-classes",
    ):
        assert gid in gids, gid
    # one fleet: a line of the totals, not two panels (issue 37)
    assert "outage-by-fleet" not in gids and "cost-by-fleet" not in gids
    projects = [t.get_text() for t in _axes(fig, "outage-by-project").get_yticklabels()]
    assert set(projects) == {g.key for g in report.summary.by_project}
    classes = [t.get_text() for t in _axes(fig, "failure-classes").get_yticklabels()]
    assert set(classes) == {g.key for g in report.summary.by_failure_class}
    days = _axes(fig, "incidents-per-day")
    assert sum(p.get_height() for p in days.patches) == len(report.findings)
    assert [g.key for g in report.summary.by_fleet] == ["cpu-fleet"]
    assert "fleet: cpu-fleet (every incident)" in _all_text(fig)


def test_fleet_without_findings():
    audit = open_sources([CAPTURES / "v0.22.5" / "rolling-ok" / "server.db"])
    fig = plot_fleet(audit.report)
    assert "no findings" in _all_text(fig)
    assert figure_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_recovery_days_later_is_in_the_key_not_the_window():
    audit = open_sources([SEED / "server.db"])
    report = audit.report
    finding = report.findings[0]
    later = finding.impact.outage_start + timedelta(days=2)
    impact = finding.impact.model_copy(
        update={"recovered": True, "recovered_at": later, "recovered_by_run_id": "f" * 36}
    )
    audit.__dict__["report"] = report.model_copy(
        update={"findings": [finding.model_copy(update={"impact": impact})]}
    )
    fig = plot_run(audit, finding.run_id)
    key = _texts(fig, "key-")
    assert "served again (run ffffffff)" in key["key-recovered"]
    assert (
        "2026-11-04" in key["key-recovered"] and "after the plotted window" in key["key-recovered"]
    )
    left, right = _axes(fig, "lanes").get_xlim()
    assert right - left < 1.0  # days: the window stays on the run
    assert "line-recovered" not in _gids(fig)
    from analyzer.render.html import narrative

    story = narrative(audit, audit.report.findings[0])
    assert "The service served again at 2026-11-04 09:09:20 UTC (run ffffffff)" in story


def test_draw_into_given_axes(seed):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3))
    ax = fig.add_subplot()
    assert plot_run(seed, _finding_run(seed), ax=ax) is fig
    assert any("web-0-0" in t.get_text() for t in ax.get_yticklabels())


def test_unknown_run(seed):
    with pytest.raises(AuditInputError):
        plot_run(seed, "ffffffff")


def test_formats_and_no_pyplot(seed_fig):
    fig = seed_fig
    assert figure_bytes(fig, "png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in figure_bytes(fig, "svg")[:1000]
    assert figure_bytes(fig, "pdf")[:5] == b"%PDF-"
    import analyzer.render.plots as plots

    for module in Path(plots.__file__).parent.glob("*.py"):
        source = module.read_text()
        assert "import matplotlib.pyplot" not in source and "import pyplot" not in source


def test_clock_never_shows_the_pseudo_date():
    from datetime import UTC, datetime

    clock = Clock.make()
    pseudo = datetime(1970, 1, 1, 9, 8, 50, tzinfo=UTC)
    assert clock.full(pseudo) == "09:08:50 (time of day only, date unknown)"
    real = datetime(2026, 11, 2, 9, 8, 50, 796000, tzinfo=UTC)
    assert clock.full(real, ms=True) == "2026-11-02 09:08:50.796 UTC"
    assert Clock.make("Asia/Tokyo").full(real) == "2026-11-02 18:08:50 Asia/Tokyo (UTC+09:00)"


def test_secrets_never_drawn(copy_db):
    secret = "hf_PlantedEnvValue_4242"
    db = copy_db("v0.22.5/seed")
    plant_env_secret(db, secret)
    plant_failure_message(db, f"Fleet is at capacity; env HF_TOKEN={secret}")
    audit = open_sources([db])
    fig = plot_run(audit, audit.report.findings[0].run_id)
    assert secret not in _all_text(fig)
    assert "***" in _texts(fig, "key-")["key-culprit_failure"]
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        assert secret.encode() not in figure_bytes(fig, "svg")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "samples/rendered")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in (("retries-30", retried_audit), ("replicas-20", wide_audit)):
        made = make()
        path = out / f"synthetic-{name}-swimlane.png"
        path.write_bytes(figure_bytes(plot_run(made, made.runs["run_id"][0])))
        print(path)
