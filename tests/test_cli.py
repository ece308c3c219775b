"""The command line: a thin layer; exit codes 0/1/2; one clean line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner
from conftest import CAPTURES, ROOT

from analyzer.cli import JEMALLOC_CONF, main

SEED = str(CAPTURES / "v0.22.5" / "seed" / "server.db")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_table_shows_the_finding_at_a_glance():
    result = run("audit", SEED)
    assert result.exit_code == 0, result.output
    assert "FINDINGS" in result.output
    lines = result.output.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("1 "))
    block = "\n".join(lines[first : lines.index("", first) if "" in lines[first:] else None])
    assert "collateral_termination (confirmed) acme/web" in lines[first]
    assert "victims: web-0-0 (dep 0)" in block and "culprit: web-0-1 (dep 1)" in block


def test_json_is_the_report_contract():
    result = run("audit", SEED, "--format", "json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["schema_version"] == 4
    assert report["generated_by"].startswith("dstack-audit ")
    assert set(report) >= {"inputs", "limitations", "runs", "findings"}
    finding = report["findings"][0]
    assert set(finding) >= {
        "category",
        "confidence",
        "run_id",
        "run_name",
        "project",
        "victims",
        "culprits",
        "run_termination_reason",
        "evidence",
    }
    assert set(finding["victims"][0]) >= {
        "job_id",
        "job_name",
        "replica_num",
        "deployment_num",
        "healthy_since",
        "terminated_at",
        "health_proof",
    }
    assert set(finding["culprits"][0]) >= {
        "job_id",
        "job_name",
        "replica_num",
        "deployment_num",
        "termination_reason",
        "termination_reason_message",
        "failed_at",
    }
    assert set(report["inputs"][0]) >= {"path", "kind", "sha256", "records", "unparsed"}
    assert finding["victims"][0]["job_id"] == "699fe818-acc2-4e08-b121-d16ed8fd32f1"


def test_markdown_and_output_file(tmp_path):
    out = tmp_path / "report.md"
    result = run("audit", SEED, "--format", "markdown", "--output", str(out))
    assert result.exit_code == 0
    text = out.read_text()
    assert text.startswith("# dstack-audit report")
    assert "`collateral_termination` in acme/web" in text


def test_fail_on_findings():
    assert run("audit", SEED, "--fail-on-findings").exit_code == 1
    clean = str(CAPTURES / "v0.22.5" / "rolling-ok" / "server.db")
    assert run("audit", clean, "--fail-on-findings").exit_code == 0


def test_filters():
    result = run("audit", SEED, "--project", "nobody", "--format", "json")
    assert json.loads(result.output)["summary"]["runs"] == 0
    result = run("audit", SEED, "--run", "6e42c9", "--format", "json")
    assert json.loads(result.output)["summary"]["runs"] == 1


def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path):
    missing = tmp_path / "missing.db"
    process = subprocess.run(
        [sys.executable, "-m", "analyzer", "audit", str(missing)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert process.returncode == 2
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0]
    assert "Traceback" not in process.stderr


def test_usage_error_exit_2():
    assert run("audit").exit_code == 2
    assert run("nonsense").exit_code == 2


def test_timeline_tells_the_story():
    result = run("timeline", "web", SEED)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "verdict: collateral_termination" in out
    assert "#1  began 2026-11-02 09:08:50.796Z by user alice, changed configuration.commands" in out
    assert "healthy 09:01:50.672 -> 09:09:20.483" in out
    assert "699fe818-acc2-4e08-b121-d16ed8fd32f1" in out


def test_timeline_of_an_ambiguous_name_asks_for_more(tmp_path):
    both = [SEED, str(CAPTURES / "v0.22.5" / "old-replica-fails" / "server.db")]
    result = run("timeline", "web", *both)
    assert result.exit_code == 2
    assert "2 runs match" in result.output
    assert "submitted 2026-11-02 09:00:41Z" in result.output  # as the tool prints times
    assert "+00:00" not in result.output  # not Python's
    assert run("timeline", "web", *both, "--project", "hooli").exit_code == 0


def test_every_command_has_help():
    for command in main.commands.values():
        assert command.help and len(command.help) > 20
        assert run(command.name, "--help").exit_code == 0


def test_several_servers_stay_apart(tmp_path):
    """The same database under two server labels: same ids, two servers, never merged."""
    import shutil

    copy = tmp_path / "copy.db"
    shutil.copyfile(SEED, copy)
    result = run(
        "audit",
        "--server-label",
        f"prod={SEED}",
        "--server-label",
        f"staging={copy}",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert sorted(v["server"] for v in report["runs"]) == ["prod", "staging"]
    assert sorted(f["server"] for f in report["findings"]) == ["prod", "staging"]
    assert {g["key"] for g in report["summary"]["by_server"]} == {"prod", "staging"}
    assert run("audit", "--server-label", "nonsense").exit_code == 2


def test_polars_allocator_gets_an_arena_per_cpu_unless_told(monkeypatch):
    """A command sets jemalloc's option before polars loads (Linux: it needs sched_getcpu),
    keeping a value the user set."""
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "")  # recorded as it was: restored after the test
    monkeypatch.delenv("_RJEM_MALLOC_CONF")
    assert run("audit", "--help").exit_code == 0
    expected = JEMALLOC_CONF if sys.platform == "linux" else None
    assert os.environ.get("_RJEM_MALLOC_CONF") == expected
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:1")
    assert run("audit", "--help").exit_code == 0
    assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:1"
