"""The HTML report's pictures are written as SVG straight from their data (plots/svg.py,
plots/fleet_svg.py; issue 38): the same pictures plots.plot_run and plots.plot_fleet draw with
matplotlib (the same lanes, bars, final marks, healthy intervals, marker lines and points,
callouts, capacity, outage, key lines and texts; the fleet chart's bars, names, figures and
totals), as well-formed SVG that lets no text of the evidence act or escape its element."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from conftest import CAPTURES, execute, plant_env_secret, plant_failure_message
from test_plots import retried_audit, wide_audit

from analyzer import open_sources
from analyzer.render.html import render_html
from analyzer.render.plots import plot_fleet, plot_run
from analyzer.render.plots.fleet import panels
from analyzer.render.plots.fleet_svg import fleet_svg
from analyzer.render.plots.svg import run_svg

SVG = "{http://www.w3.org/2000/svg}"
# the elements both drawings name: matplotlib's gid, the SVG's class (the capacity strip's own
# marker lines and the legend's swatches carry neither)
NAMED = re.compile(
    r"^(status-\w+|final-\w+|healthy(-estimated)?|line-\w+|point-\w+|callout-\w+|key-\w+"
    r"|capacity|outage|zoom-region|deployment-note)$"
)
CASES = [
    "v0.22.5/seed",
    "v0.22.5/multi-replica-crash",
    "v0.22.5/old-replica-fails",
    "v0.22.5/in-place-bump",
    "v0.22.5/stop-after-kill",
    "v0.22.5/scale-up-fails",
    "v0.22.5/user-stop-mid-rollout",
    "v0.22.5/unhealthy-old",
    "v0.22.5/retry-on-error",
    "v0.20/multi-replica-crash",
    "v0.22.5/seed/logs/server-info.rich.log",  # times of day only
]


def _matplotlib_parts(fig) -> tuple[Counter, list[str], list[str]]:
    """(gid counts, the key's lines, the lane labels) of a matplotlib swimlane."""
    named = Counter(
        a.get_gid() for a in fig.findobj(lambda a: bool(a.get_gid())) if NAMED.match(a.get_gid())
    )
    key = [
        a.get_text()
        for a in fig.findobj(lambda a: (a.get_gid() or "").startswith("key-"))
        if hasattr(a, "get_text")
    ]
    lanes = next(ax for ax in fig.axes if ax.get_gid() == "lanes")
    labels = [t.get_text() for t in lanes.get_yticklabels()]
    return named, key, labels


def _svg_parts(text: str) -> tuple[Counter, list[str], list[str], ET.Element]:
    """(class counts, the key's lines, the lane labels, the tree) of an SVG swimlane."""
    root = ET.fromstring(text)  # well-formed XML, or this raises
    named = Counter(
        e.get("class") for e in root.iter() if e.get("class") and NAMED.match(e.get("class"))
    )

    def words(e: ET.Element) -> str:
        return (e.text or "").replace("\u00a0", " ")

    key = [words(e) for e in root.iter(f"{SVG}text") if (e.get("class") or "").startswith("key-")]
    labels = [words(e) for e in root.iter(f"{SVG}text") if e.get("class") == "lane-label"]
    return named, key, labels, root


@pytest.mark.parametrize("case", CASES)
def test_the_svg_swimlane_is_the_matplotlib_picture(case):
    audit = open_sources([CAPTURES / case])
    runs = list(dict.fromkeys(v.run_id for v in audit.report.runs))  # with findings or not
    assert runs, case
    for run_id in runs:
        named, key, labels = _matplotlib_parts(plot_run(audit, run_id))
        svg_named, svg_key, svg_labels, root = _svg_parts(run_svg(audit, run_id))
        assert svg_named == named, (case, run_id)
        assert svg_key == key and svg_labels == labels
        title = [e.text or "" for e in root.iter(f"{SVG}text") if e.get("id") == "run-title"]
        assert title and f"run {run_id[:8]}" in title[0]
        assert float(root.get("width")) > 600 and float(root.get("height")) > 200


@pytest.mark.parametrize("case", CASES)
def test_the_time_axis_ticks_as_matplotlib_does(case):
    """AutoDateLocator's choice of ticks (whole minutes over 9 minutes, 5 s over 45 s on the
    seed's) and ConciseDateFormatter's labels, as matplotlib draws them."""
    audit = open_sources([CAPTURES / case])
    for verdict in audit.report.runs:
        _assert_same_time_axes(audit, verdict.run_id, None)


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York"])
def test_a_display_zone_moves_both_time_axes_alike(tz):
    audit = open_sources([CAPTURES / "v0.22.5" / "seed"])
    _assert_same_time_axes(audit, audit.report.findings[0].run_id, tz)


def _assert_same_time_axes(audit, run_id: str, tz: str | None) -> None:
    """The tick labels and the titles of every time axis, and the capacity's counts, as
    matplotlib draws them."""
    fig = plot_run(audit, run_id, tz=tz)
    fig.canvas.draw()
    axes = [ax for ax in fig.axes if (ax.get_gid() or "").startswith("capacity-axes")]
    expected = [
        label.get_text().replace("\n", " ")
        for ax in axes
        for label in ax.get_xticklabels()
        if ax.get_xlim()[0] <= label.get_position()[0] <= ax.get_xlim()[1]
    ]
    _, _, _, root = _svg_parts(run_svg(audit, run_id, tz=tz))
    texts = list(root.iter(f"{SVG}text"))
    ticks = [e.text for e in texts if e.get("class") == "tick-label"]
    assert ticks == [label for label in expected if label], (run_id, tz)
    titles = [e.text for e in texts if (e.text or "").startswith(("time (", "time of day"))]
    assert titles == [ax.get_xlabel() for ax in axes]
    low, high = axes[0].get_ylim()  # the healthy replicas' counts (MaxNLocator's steps)
    counts = [t.get_text() for t in axes[0].get_yticklabels() if low <= t.get_position()[1] <= high]
    assert [e.text for e in texts if e.get("class") == "count-label"] == counts


def test_the_report_embeds_svg_swimlanes_that_let_nothing_act(copy_db):
    """A workload's termination message with markup and control characters reaches the SVG
    escaped: well-formed, its text intact, nothing acting."""
    db = copy_db("v0.22.5/seed")
    planted = "Fleet </text><script>alert(1)</script> & \x1b[2J\u202eevil ]]> at capacity"
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = ? WHERE termination_reason_message != ''",
        params=(planted,),
    )
    text = render_html(open_sources([db]))
    images = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 1  # the run's swimlane (one run: no fleet chart)
    svg = base64.b64decode(images[0]).decode("utf-8")
    root = ET.fromstring(svg)
    assert not [e for e in root.iter() if e.tag.endswith("script")]
    key = " ".join(e.text or "" for e in root.iter(f"{SVG}text")).replace("\u00a0", " ")
    assert "Fleet </text><script>alert(1)</script> & [2J" in key
    assert "\x1b" not in svg and "\u202e" not in svg


def test_the_svg_fleet_chart_is_the_matplotlib_picture():
    """Every panel of plots.plot_fleet, with the same bars, names, figures and totals."""
    dbs = sorted((CAPTURES / "v0.22.5").glob("*/server.db")) + sorted(
        (CAPTURES / "v0.20").glob("*/server.db")
    )
    report = open_sources(dbs).report
    fig = plot_fleet(report)
    fig.canvas.draw()
    root = ET.fromstring(fleet_svg(report))
    texts = [e.text for e in root.iter(f"{SVG}text")]
    assert fig.get_suptitle() in texts
    for ax in fig.axes:
        gid = ax.get_gid()
        group = next(g for g in root.iter(f"{SVG}g") if g.get("class") == gid)
        drawn = [e.text for e in group.iter(f"{SVG}text")]
        if gid == "totals":
            assert [t.get_text() for t in ax.texts] == drawn
            continue
        ticks = [e.text for e in group.iter(f"{SVG}text") if e.get("class") == "tick-label"]
        low, high = ax.get_xlim()
        shown = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
        assert ticks == [t for t in shown if t], gid  # the axis' ticks, as matplotlib picks them
        if gid == "incidents-per-day":
            low, high = ax.get_ylim()
            counts = [
                t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high
            ]
            assert counts == [
                e.text for e in group.iter(f"{SVG}text") if e.get("class") == "count-label"
            ]
        bars = [e for e in group.iter(f"{SVG}rect") if e.get("class") == "bar"]
        assert len(bars) == len(ax.patches), gid
        for text in ax.texts:  # each bar's figure, the day counts
            assert text.get_text() in drawn, (gid, text.get_text())
        if gid != "incidents-per-day":
            assert [t.get_text() for t in ax.get_yticklabels()] == [
                t for t in drawn if t in {r for r, _, _ in _rows(report, gid)}
            ]
    assert report.summary.incidents > 1 and len(report.summary.by_project) > 1
    # one fleet: a line of the totals in both pictures, no panels of its own (issue 37)
    classes = {g.get("class") for g in root.iter(f"{SVG}g")}
    assert "outage-by-project" in classes and "outage-by-fleet" not in classes
    assert "fleet: cpu-fleet (every incident)" in texts


def _rows(report, gid: str):
    return next(p for p in panels(report, 12) if p.gid == gid).rows


@pytest.mark.parametrize("make", [retried_audit, wide_audit], ids=["retries-30", "replicas-20"])
def test_collapsed_retries_and_many_lanes_are_the_matplotlib_picture(make):
    """Thirty retries collapsed into one lane, twenty replicas one lane each (test_plots.py's
    synthetic runs)."""
    audit = make()
    run_id = audit.runs["run_id"][0]
    named, key, labels = _matplotlib_parts(plot_run(audit, run_id))
    svg_named, svg_key, svg_labels, _ = _svg_parts(run_svg(audit, run_id))
    assert svg_named == named and svg_key == key and svg_labels == labels
    assert any("collapsed" in label for label in labels) or len(labels) > 20
    _assert_same_time_axes(audit, run_id, None)


def test_a_secret_in_the_evidence_is_never_drawn(copy_db):
    secret = "hf_PlantedEnvValue_4242"
    db = copy_db("v0.22.5/seed")
    plant_env_secret(db, secret)
    plant_failure_message(db, f"Fleet is at capacity; env HF_TOKEN={secret}")
    audit = open_sources([db])
    svg = run_svg(audit, audit.report.findings[0].run_id)
    assert secret not in svg and "***" in svg
    assert secret not in fleet_svg(audit.report)
