"""The self-contained incident report: its sections and evidence, its figures, that it refers to
nothing outside itself, that no secret reaches it, and that a real browser (headless Chromium,
offline) renders it with every image loaded. The markdown twin and the CLI commands too."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES

from analyzer import open_sources
from analyzer.cli import main
from analyzer.cli.visual import register
from analyzer.render.html import narrative, render_html, render_report_markdown

register(main)
register(main)  # twice: harmless

SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"
CHROMIUM = Path("/usr/bin/chromium")
PNG = b"\x89PNG\r\n\x1a\n"
IMAGE_URI = re.compile(r'src="data:image/(png|svg\+xml);base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def seed():
    return open_sources([SEED])


@pytest.fixture(scope="module")
def seed_html(seed):
    return render_html(seed)


@pytest.fixture(scope="module")
def fleet():
    dbs = sorted((CAPTURES / "v0.22.5").glob("*/server.db")) + sorted(
        (CAPTURES / "v0.20").glob("*/server.db")
    )
    return open_sources(dbs)


@pytest.fixture(scope="module")
def fleet_html(fleet):
    return render_html(fleet)


def _section(text: str, ident: str) -> str:
    start = text.index(f'id="{ident}"')
    end = text.find("<section", start + 1)
    return text[start : end if end != -1 else len(text)]


def _images(text: str) -> list[tuple[str, bytes]]:
    return [(kind, base64.b64decode(data, validate=True)) for kind, data in IMAGE_URI.findall(text)]


def _text_outside_images(text: str) -> str:
    return IMAGE_URI.sub('src="data:"', text)


# ---------------------------------------------------------------------------------------------
# Structure and evidence


def test_first_page_is_the_incident_and_the_appendix_has_every_input(seed, seed_html):
    report = seed.report
    cover = seed_html[: seed_html.index('id="summary"')]
    assert "dstack-audit incident report" in cover
    assert 'id="what-happened"' in cover
    assert narrative(seed, report.findings[0]).split(".")[0].replace("`", "") in (
        re.sub(r"</?code>", "", cover)
    )
    appendix = _section(seed_html, "appendix")
    for item in report.inputs:
        assert item.sha256 is None or item.sha256 not in cover, item.path
        if item.sha256:
            assert item.sha256 in appendix, item.path
        assert html.escape(item.path) in appendix
    assert "not computed (not a file)" not in seed_html
    assert "not hashed: not recognised" in appendix  # truth.json, manifests
    assert f'<dd id="tool-version">{report.generated_by}' in cover
    assert "dstack-audit 0." in cover
    # the instance kept being processed after the run ended (the instances table says so)
    assert '<dd id="end-of-evidence">2026-11-02 09:12:18.470 UTC</dd>' in cover


def test_sections_in_order(seed_html):
    order = [
        'id="cover"',
        'id="summary"',
        'id="findings"',
        'id="finding-1"',
        'class="narrative"',
        "<img",
        "evidence chain",
        "<h4>impact</h4>",
        "what a well-behaved rollout would have done",
        "<h4>root cause</h4>",
        'id="runs"',
        'id="limitations"',
        'id="appendix"',
    ]
    positions = [seed_html.index(needle) for needle in order]
    assert positions == sorted(positions)


def test_seed_narrative_tells_the_story(seed, seed_html):
    story = narrative(seed, seed.report.findings[0])
    assert story.startswith(
        "On 2026-11-02 at 09:08:50 (UTC) alice updated `commands` of acme/web (deployment 1)."
    )
    assert (
        "At 09:09:01 the new replica web-0-1 failed to start: no capacity (Fleet is at capacity)."
        in story
    )
    assert "10 s later dstack failed the whole run (JOB_FAILED)" in story
    assert (
        "at 09:09:20 stopped the healthy replica web-0-0 of deployment 0, which had served "
        "since 09:01:50" in story
    )
    assert (
        "The service has not served since (as of 09:12:18, the end of the evidence): an outage "
        "of at least 2m57s. 1 healthy replica lost at least 2m57s of serving time, at least "
        "$0.0052 at the instances' prices." in story
    )
    assert "updated <code>commands</code> of acme/web" in seed_html


def _check_findings_complete(audit, text: str) -> None:
    report = audit.report
    articles = re.findall(r'<article class="finding" id="finding-(\d+)"', text)
    assert [int(n) for n in articles] == list(range(1, len(report.findings) + 1))
    for n, finding in enumerate(report.findings, 1):
        article = text[text.index(f'id="finding-{n}"') :]
        article = article[: article.index("</article>")]
        for victim in finding.victims:
            assert html.escape(victim.job_name) in article
            assert victim.job_id in article
        for culprit in finding.culprits:
            assert html.escape(culprit.job_name) in article
            assert culprit.job_id in article
        for item in finding.evidence:
            assert html.escape(item.text) in article
            for source in item.source.split("; "):
                assert html.escape(source) in article, source
        assert "<img" in article or "swimlane is shown with" in article  # its run's swimlane
        assert finding.run_id in article


def test_every_finding_has_victims_culprits_and_provenance(seed, seed_html, crash_html):
    _check_findings_complete(seed, seed_html)
    _check_findings_complete(crash_html[0], crash_html[1])


@pytest.fixture(scope="module")
def crash_html():
    audit = open_sources([CRASH])
    return audit, render_html(audit)


def test_fleet_wide_report(fleet, fleet_html):
    _check_findings_complete(fleet, fleet_html)
    summary = _section(fleet_html, "summary")
    assert "fleet-wide charts" in summary  # the fleet figure, with several findings
    assert "<h4>by project</h4>" in summary and "<h4>by culprit failure class</h4>" in summary
    runs = _section(fleet_html, "runs")
    for verdict in fleet.report.runs:
        assert verdict.run_id in runs
    limitations = _section(fleet_html, "limitations")
    for lim in fleet.report.limitations:
        assert html.escape(lim.message) in limitations
    # one swimlane per run with findings (a run's picture is not repeated)
    runs_with_findings = {(f.server, f.run_id) for f in fleet.report.findings}
    assert len(_images(fleet_html)) == len(runs_with_findings) + 1


def test_self_contained_no_external_reference(seed_html, fleet_html):
    for text in (seed_html, fleet_html):
        lowered = text.lower()
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", lowered)
        assert "http://" not in lowered and "https://" not in lowered
        assert "<link" not in lowered
        assert "<script" not in lowered
        assert "@import" not in lowered and "url(" not in lowered
        assert 'http-equiv="content-security-policy"' in lowered
        assert "default-src 'none'" in lowered
        for ref in re.findall(r"""(?:src|href)="([^"]*)\"""", text):
            assert ref.startswith(("data:image/", "#")), ref[:40]


def test_images_are_data_uris_that_decode(seed_html, fleet_html):
    for text in (seed_html, fleet_html):
        images = _images(text)
        assert images
        assert len(images) == text.count("<img")
        for kind, data in images:
            if kind == "png":
                assert data.startswith(PNG)
                width = int.from_bytes(data[16:20], "big")
                height = int.from_bytes(data[20:24], "big")
                assert width > 600 and height > 200
            else:
                assert b"<svg" in data[:2000]


def test_text_is_escaped_and_redacted(seed, seed_html):
    outside = _text_outside_images(seed_html)
    assert seed.redact(outside) == outside
    # every text node is escaped: no raw '<' from the evidence ('->' in status changes)
    assert "SUBMITTED -&gt; TERMINATING" in seed_html
    assert "SUBMITTED -> TERMINATING" not in seed_html


def test_rich_log_alone_never_shows_the_pseudo_date():
    audit = open_sources([SEED / "logs" / "server-info.rich.log"])
    text = render_html(audit)
    outside = _text_outside_images(text)
    assert "1970" not in outside
    assert "date is unknown" in outside or "date unknown" in outside
    story = narrative(audit, audit.report.findings[0])
    assert story.startswith("At 09:08:50 (local time of day; the date is unknown) alice updated")


def test_display_zone(seed):
    text = render_html(seed, tz="Europe/Berlin")
    assert "10:08:50" in narrative(seed, seed.report.findings[0], tz="Europe/Berlin")
    assert "Europe/Berlin, UTC+01:00" in text


def test_no_findings_report():
    audit = open_sources([CAPTURES / "v0.22.5" / "rolling-ok" / "server.db"])
    text = render_html(audit)
    assert "None: no healthy replica was terminated" in text
    assert 'id="runs"' in text and "no_incident" in text
    assert "<img" not in text


# ---------------------------------------------------------------------------------------------
# Secrets


ENV_SECRET = "hf_PlantedEnvValue_4242"
REGISTRY_PASSWORD = "planted-registry-pass-99"
ADMIN_TOKEN = "0a1b2c3d-admin-token-planted-5e6f"


@pytest.fixture
def planted(copy_db, tmp_path):
    db = copy_db("v0.22.5/seed")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE jobs SET job_spec_data = json_set(job_spec_data, '$.env', json(?), "
            "'$.registry_auth', json(?))",
            (
                json.dumps({"HF_TOKEN": ENV_SECRET}),
                json.dumps({"username": "robot", "password": REGISTRY_PASSWORD}),
            ),
        )
        connection.execute(
            "UPDATE jobs SET termination_reason_message = ? WHERE status = 'FAILED'",
            (f"Fleet is at capacity; env HF_TOKEN={ENV_SECRET}",),
        )
    log = tmp_path / "server.log"
    real = (SEED / "logs" / "server-info.standard.log").read_text()
    log.write_text(f"The admin token is {ADMIN_TOKEN}\n" + real)
    return db, log


def test_no_secret_in_html_or_markdown(planted, tmp_path):
    db, log = planted
    audit = open_sources([db, log])
    text = render_html(audit)
    markdown = render_report_markdown(audit, image_dir=tmp_path / "images")
    for secret in (ENV_SECRET, REGISTRY_PASSWORD, ADMIN_TOKEN):
        assert secret not in text
        assert secret not in markdown
        for _, data in _images(text):
            assert secret.encode() not in data
    assert "***" in text  # the failure message kept its place, masked


# ---------------------------------------------------------------------------------------------
# Markdown


def test_markdown_with_pngs_beside_it(seed, tmp_path):
    images = tmp_path / "report-images"
    text = render_report_markdown(seed, image_dir=images)
    assert text.startswith("# dstack-audit incident report")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links
    for link in links:
        assert link.startswith("report-images/")
        assert (tmp_path / link).read_bytes().startswith(PNG)
    for item in seed.report.inputs:
        if item.sha256:
            assert item.sha256 in text
    assert "alice updated `commands` of acme/web" in text
    assert "## Details" in text and "### Findings" in text


# ---------------------------------------------------------------------------------------------
# CLI


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_cli_plot_run(tmp_path, suffix):
    out = tmp_path / f"run.{suffix}"
    result = run("plot", "web", str(SEED / "server.db"), "-o", str(out), "--project", "acme")
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert {"png": PNG, "svg": b"<?xml", "pdf": b"%PDF-"}[suffix] == data[
        : len({"png": PNG, "svg": b"<?xml", "pdf": b"%PDF-"}[suffix])
    ]


def test_cli_plot_fleet_and_tz(tmp_path):
    out = tmp_path / "fleet.png"
    sources = [str(p) for p in sorted((CAPTURES / "v0.22.5").glob("*/server.db"))]
    result = run("plot", "--fleet", *sources, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG)
    out = tmp_path / "berlin.png"
    result = run("plot", "6e42c918", str(SEED / "server.db"), "-o", str(out), "--tz", "Asia/Tokyo")
    assert result.exit_code == 0, result.output


def test_cli_plot_errors_are_one_line_exit_2(tmp_path):
    result = run("plot", "nope", str(SEED / "server.db"), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert "no run with this name" in result.output and "Traceback" not in result.output
    result = run("plot", "web", str(SEED / "server.db"), "-o", str(tmp_path / "x.gif"))
    assert result.exit_code == 2 and ".png" in result.output
    result = run(
        "plot", "web", str(SEED / "server.db"), "-o", str(tmp_path / "x.png"), "--tz", "Nowhere/X"
    )
    assert result.exit_code == 2 and "unknown time zone" in result.output
    result = run("plot", "web", "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2


def test_cli_report_html_and_markdown(tmp_path):
    out = tmp_path / "report.html"
    result = run("report", str(SEED / "server.db"), str(CRASH / "server.db"), "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count('<article class="finding"') == 2
    out = tmp_path / "report.md"
    result = run("report", str(SEED / "server.db"), "-o", str(out), "--tz", "Europe/Berlin")
    assert result.exit_code == 0, result.output
    assert "10:08:50" in out.read_text()
    assert list((tmp_path / "report-images").glob("*.png"))
    result = run("report", str(SEED / "server.db"), "-o", str(tmp_path / "r.txt"))
    assert result.exit_code == 2
    result = run("report", str(SEED / "server.db"), "-o", str(out), "--project", "nobody")
    assert result.exit_code == 0  # an empty scope is still a report


def test_register_twice_keeps_one_command_each():
    assert list(main.commands).count("plot") == 1
    assert list(main.commands).count("report") == 1
    assert "audit" in main.commands


# ---------------------------------------------------------------------------------------------
# A real browser, offline


PROBE = """<script>
var probe = {violations: []};
document.addEventListener('securitypolicyviolation', function (e) {
  probe.violations.push(e.blockedURI + ' ' + e.violatedDirective);
});
window.addEventListener('load', function () {
  probe.images = Array.from(document.images).map(function (i) {
    return {complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
            scheme: i.currentSrc.slice(0, 15)};
  });
  probe.resources = performance.getEntriesByType('resource').map(function (r) { return r.name; });
  probe.refs = Array.from(document.querySelectorAll('[src],[href],[srcset],[poster],[action]'))
    .map(function (e) { return e.getAttribute('src') || e.getAttribute('href') || 'other'; })
    .filter(function (u) { return !/^(data:image\\/|#)/.test(u); });
  probe.sections = Array.from(document.querySelectorAll('section[id],article[id]'))
    .map(function (e) { return e.id; });
  var out = document.createElement('pre');
  out.id = 'probe-result';
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>"""

BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no name resolves
    "--hide-scrollbars",
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed (run .ci/browser.sh to install it)")
    profile = tmp_path / "profile"
    return subprocess.run(
        [str(CHROMIUM), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _probe_in_browser(text: str, tmp_path: Path) -> dict:
    # the test copy allows one inline script (the probe) and still forbids every fetch
    copy = text.replace(
        "style-src 'unsafe-inline';", "style-src 'unsafe-inline'; script-src 'unsafe-inline';", 1
    )
    copy = copy.replace("<head>", "<head>" + PROBE, 1)
    copy = copy.replace('<meta charset="utf-8">', "", 1).replace(
        "<head>", '<head><meta charset="utf-8">', 1
    )
    page = tmp_path / "probe.html"
    page.write_text(copy, encoding="utf-8")
    done = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe-result">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("which", ["seed", "fleet"])
def test_browser_renders_offline_with_every_image_loaded(which, seed_html, fleet_html, tmp_path):
    text = seed_html if which == "seed" else fleet_html
    probe = _probe_in_browser(text, tmp_path)
    assert probe["images"], probe
    assert len(probe["images"]) == text.count("<img")
    for image in probe["images"]:
        assert image["complete"] and image["width"] > 600 and image["height"] > 200, image
        assert image["scheme"].startswith("data:image/")
    assert probe["resources"] == []  # nothing fetched
    assert probe["refs"] == []  # nothing refers outside the file
    assert probe["violations"] == []  # and nothing tried to
    assert probe["sections"][:3] == ["cover", "summary", "findings"]
    assert "runs" in probe["sections"] and "limitations" in probe["sections"]


def test_browser_opens_the_report_as_written(seed_html, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(seed_html, encoding="utf-8")
    shot = tmp_path / "report.png"
    done = _chromium(tmp_path, "--window-size=1280,2400", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(PNG) and len(data) > 50_000
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert 'id="finding-1"' in dom.stdout and "web-0-0" in dom.stdout
    assert shutil.which(str(CHROMIUM))


# ---------------------------------------------------------------------------------------------
# The incident first (issue 16)


FOLD = """<script>
window.addEventListener('load', function () {
  function top(selector) {
    var e = document.querySelector(selector);
    return e ? e.getBoundingClientRect().top + window.scrollY : null;
  }
  var out = document.createElement('pre');
  out.id = 'fold-result';
  out.textContent = JSON.stringify({
    story: top('#what-happened'), kpis: top('.kpis'), worst: top('#summary nav'),
    appendix: top('#appendix'), height: window.innerHeight});
  document.body.appendChild(out);
});
</script>"""


def test_first_screen_is_the_incident_in_a_browser(seed_html, tmp_path):
    """At 1280x800 the story, the impact figures and the worst findings are on the first
    screen; the inputs are far below (the screenshot is kept as first-screen.png)."""
    copy = seed_html.replace(
        "style-src 'unsafe-inline';", "style-src 'unsafe-inline'; script-src 'unsafe-inline';", 1
    ).replace("</head>", FOLD + "</head>", 1)
    page = tmp_path / "fold.html"
    page.write_text(copy, encoding="utf-8")
    done = _chromium(
        tmp_path,
        "--window-size=1280,800",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="fold-result">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    tops = json.loads(html.unescape(found.group(1)))
    assert tops["story"] < tops["kpis"] < tops["worst"] < 800 < tops["appendix"], tops
    shot = tmp_path / "first-screen.png"
    done = _chromium(tmp_path, "--window-size=1280,800", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.read_bytes().startswith(PNG)


def test_summary_figures_match_the_json(fleet, fleet_html):
    summary = fleet.report.summary
    kpis = re.findall(r'<div class="kpi"><b>([^<]*)</b>([^<]*)</div>', fleet_html)
    figures = {name: value for value, name in kpis}
    assert figures["incidents"] == str(summary.incidents)
    assert figures["findings"] == str(summary.findings)
    assert figures["healthy replicas killed"] == str(summary.victims)
    assert figures["runs audited"] == str(summary.runs)
    from analyzer.render.format import cost_text, outage_text, replica_time_text

    # every run of the fleet ran to the end of the evidence: each total is a lower bound
    assert summary.outage_is_lower_bound and summary.lost_cost_is_lower_bound
    assert figures["outage, summed"] == html.escape(outage_text(summary))
    assert figures["outage, summed"].startswith("≥ ")
    assert figures["replica-time lost"] == html.escape(replica_time_text(summary))
    assert figures["cost lost"] == html.escape(cost_text(summary))


def test_one_run_gets_no_fleet_charts(seed_html):
    assert "fleet-wide charts" not in seed_html
    assert seed_html.count("<img") == 1


def test_max_plots_draws_the_worst_runs_only(fleet):
    text = render_html(fleet, max_plots=2)
    assert text.count('alt="swimlane of run') == 2
    assert "pictures are drawn for the worst 2 runs (--max-plots)" in text
    _check_findings_complete_without_pictures(fleet, text)


def _check_findings_complete_without_pictures(audit, text: str) -> None:
    articles = re.findall(r'<article class="finding" id="finding-(\d+)"', text)
    assert [int(n) for n in articles] == list(range(1, len(audit.report.findings) + 1))


# ---------------------------------------------------------------------------------------------
# From post-mortem to prevention (issue 37)


PREVENTION = """<script>
window.addEventListener('load', function () {
  var out = document.createElement('pre');
  out.id = 'prevention-result';
  out.textContent = JSON.stringify(Array.from(document.querySelectorAll('.prevention')).map(
    function (e) { return {id: e.id, text: e.innerText, shown: e.offsetHeight > 0,
                           inside: e.closest('article').id}; }));
  document.body.appendChild(out);
});
</script>"""


def test_each_finding_says_if_foreseeable_if_the_guard_would_refuse_and_how_to_check_now(
    tmp_path,
):
    """Read in headless Chromium: the no-capacity incident was foreseeable and the guard would
    have refused its update; the crash was neither; both say how to check exposure now."""
    audit = open_sources([SEED / "server.db", CRASH / "server.db"])
    copy = (
        render_html(audit)
        .replace(
            "style-src 'unsafe-inline';",
            "style-src 'unsafe-inline'; script-src 'unsafe-inline';",
            1,
        )
        .replace("</head>", PREVENTION + "</head>", 1)
    )
    page = tmp_path / "prevention.html"
    page.write_text(copy, encoding="utf-8")
    done = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="prevention-result">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    blocks = json.loads(html.unescape(found.group(1)))
    by_run = {}
    for n, finding in enumerate(audit.report.findings, 1):
        (block,) = [b for b in blocks if b["id"] == f"prevention-{n}"]
        assert block["shown"] and block["inside"] == f"finding-{n}"
        by_run[finding.run_name] = block["text"]
        assert "dstack-audit exposure SERVER-URL" in block["text"]
        assert "dstack-audit guard" in block["text"]
    assert len(by_run) == 2
    capacity, crash = by_run["web"], by_run["svc"]
    assert "foreseeable before the update: yes: no surge capacity" in capacity
    assert "have refused the update: yes" in capacity
    assert "foreseeable before the update: no: the culprit did not fail for lack" in crash
    assert "have refused the update: no" in crash


def test_the_markdown_report_tells_the_story_first_and_escapes_only_what_acts(seed):
    """Story first, the inputs' SHA-256 in an appendix; Slack, Jira and mail show no stray
    backslashes: parentheses and underscores inside words are left as written."""
    text = render_report_markdown(seed)
    story, appendix = text.index("## What happened"), text.index("## Appendix: inputs")
    assert story < appendix and "| SHA-256 |" not in text[:appendix]
    assert all(i.sha256[:16] in text[appendix:] for i in seed.report.inputs if i.sha256)
    assert "failed_to_start_due_to_no_capacity" in text and "\\_" not in text
    assert "\\(" not in text and "\\)" not in text


def test_the_terminal_table_says_the_guards_answer_and_how_to_prevent_the_next():
    from analyzer.render.screen import render_table

    audit = open_sources([SEED / "server.db", CRASH / "server.db"])
    text = " ".join(render_table(audit.report, width=80).split())
    assert "guard: would have refused it: no room" in text  # no capacity: foreseeable
    assert "guard: would not have: not a lack of room" in text  # a crash
    assert "PREVENT THE NEXT: `dstack-audit exposure SERVER-URL` shows the services" in text
