"""Outputs never touch the evidence (issue 12, part 1): every refused output leaves the evidence's
bytes, mtimes and folder listings as they were and writes nothing at all; regular files are
replaced atomically; devices are written directly; unwritable outputs are one line; --force
replaces a folder whole; bundles verify from any working directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES

from analyzer.cli import audit as cli
from analyzer.cli import main
from analyzer.errors import AuditInputError
from analyzer.outputs import Outputs, private_folder, remove_folder

SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"


def _snapshot(root: Path) -> dict[str, tuple[bytes, int] | str]:
    """Every entry under `root`: a file's bytes and mtime, a folder's presence, a link's target."""
    seen: dict[str, tuple[bytes, int] | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            seen[name] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            seen[name] = "folder"
        else:
            seen[name] = (path.read_bytes(), path.stat().st_mtime_ns)
    return seen


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def case(tmp_path, monkeypatch):
    """A copy of the seed capture in `evidence/`, the working directory its parent."""
    shutil.copytree(SEED, tmp_path / "evidence")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(case: Path, args: list[str], named: str) -> None:
    before = _snapshot(case)
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"dstack-audit: {named}: refused as an output: "), lines[0]
    assert _snapshot(case) == before  # evidence untouched, and nothing written anywhere


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["audit", "evidence/server.db", "--format", "json", "-o", "evidence/server.db"], None),
        (
            [
                "audit",
                "evidence/logs/server-info.standard.log",
                "-o",
                "evidence/logs/server-info.standard.log",
            ],
            None,
        ),
        (
            ["audit", "evidence/logs", "--quarantine", "evidence/logs/server-info.rich.log"],
            "evidence/logs/server-info.rich.log",
        ),
        (["audit", "evidence", "--bundle", "evidence/bundle"], "evidence/bundle"),
        (["ingest", "evidence", "--to", "evidence/tables/dataset"], "evidence/tables/dataset"),
        (["report", "evidence/server.db", "-o", "evidence/report.md"], "evidence/report.md"),
        (["report", "evidence/server.db", "-o", "evidence/report.html"], "evidence/report.html"),
        (
            ["plot", "--fleet", "evidence/server.db", "-o", "evidence/fleet.png"],
            "evidence/fleet.png",
        ),
        (
            ["timeline", "web", "evidence/server.db", "-o", "evidence/../evidence/timeline.txt"],
            "evidence/../evidence/timeline.txt",
        ),
        (["ingest", "evidence/logs", "--to", "evidence", "--force"], "evidence"),
    ],
    ids=[
        "o-on-db",
        "o-on-log",
        "quarantine-on-log",
        "bundle-in-evidence",
        "ingest-inside-input-folder",
        "report-md-beside-input",
        "report-html-beside-input",
        "plot-beside-input",
        "timeline-dotdot",
        "force-over-folder-holding-input",
    ],
)
def test_output_that_would_touch_the_evidence_is_refused(case, args, named):
    _refused(case, args, named or args[-1])


def test_output_symlinked_to_the_database_is_refused(case):
    (case / "out.html").symlink_to(case / "evidence" / "server.db")
    _refused(case, ["report", "evidence/server.db", "-o", "out.html"], "out.html")
    assert (case / "out.html").is_symlink()


def test_dotdot_after_a_symlink_is_taken_as_the_kernel_takes_it(case):
    """`logs/..` through a link into the evidence is the evidence folder, not the link's."""
    (case / "shortcut").symlink_to(case / "evidence" / "logs")
    _refused(case, ["audit", "evidence/server.db", "-o", "shortcut/../x.txt"], "shortcut/../x.txt")


def test_output_beside_an_input_found_inside_a_folder_is_refused(case):
    """The folder holds a link to a database elsewhere: its folder is an input's folder too."""
    linked = case / "linked"
    linked.mkdir()
    (linked / "server.db").symlink_to(case / "evidence" / "server.db")
    _refused(case, ["audit", "linked", "-o", "evidence/report.txt"], "evidence/report.txt")


def test_two_outputs_on_one_path_are_refused(case):
    (case / "out").mkdir()
    _refused(
        case,
        ["audit", "evidence/server.db", "-o", "out/x.txt", "--quarantine", "out/x.txt"],
        "out/x.txt",
    )


def test_synth_never_writes_into_its_templates(tmp_path, monkeypatch):
    templates = tmp_path / "captures"
    shutil.copytree(CAPTURES / "v0.22.5", templates)
    monkeypatch.setenv("DSTACK_AUDIT_CAPTURES", str(templates))
    out = str(templates / "seed" / "more")
    _refused(tmp_path, ["synth", out, "--runs", "2"], out)


def test_output_replaces_a_file_atomically_and_a_failing_renderer_leaves_it(case, monkeypatch):
    (case / "out").mkdir()
    target = case / "out" / "report.json"
    made = run("audit", "evidence/server.db", "--format", "json", "-o", str(target))
    assert made.exit_code == 0 and json.loads(target.read_text())["findings"]
    target.chmod(0o640)
    target.write_text("the previous report\n")

    def broken(report):
        raise RuntimeError("renderer broke")

    with monkeypatch.context() as patched:
        patched.setitem(cli.RENDERERS, "json", broken)
        failed = run("audit", "evidence/server.db", "--format", "json", "-o", str(target))
    assert failed.exit_code == 2 and "renderer broke" in failed.output
    assert target.read_text() == "the previous report\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]

    again = run("audit", "evidence/server.db", "--format", "json", "-o", str(target))
    assert again.exit_code == 0 and json.loads(target.read_text())["findings"]
    assert (target.stat().st_mode & 0o777) == 0o640  # the replaced file keeps its mode


def test_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("old\n")
    outputs = Outputs([])
    outputs.file(target)
    with pytest.raises(KeyboardInterrupt), outputs.open(target) as handle:
        handle.write(b"half of a new rep")
        raise KeyboardInterrupt
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.txt"]


def test_interrupted_markdown_report_keeps_the_old_report_and_images(case, monkeypatch):
    import analyzer.render.html as html

    shutil.copytree(CRASH, case / "other")
    sources = ["evidence/server.db", "other/server.db"]  # two findings: three pictures
    (case / "out").mkdir()
    report = case / "out" / "incident.md"
    assert run("report", *sources, "-o", str(report)).exit_code == 0
    images = case / "out" / "incident-images"
    assert len(list(images.glob("*.png"))) == 3 and "incident-images/" in report.read_text()
    before = _snapshot(case / "out")
    drawn = html.figure_bytes
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return drawn(*args, **kwargs)

    monkeypatch.setattr(html, "figure_bytes", interrupted)
    result = run("report", *sources, "-o", str(report))
    assert result.exit_code != 0 and len(calls) == 2
    assert _snapshot(case / "out") == before  # no half report, no half image folder, no temp


def test_markdown_report_replaces_its_image_folder_whole(case):
    (case / "out").mkdir()
    report = case / "out" / "incident.md"
    images = case / "out" / "incident-images"
    images.mkdir()
    (images / "stale-from-an-older-report.png").write_bytes(b"old")
    assert run("report", "evidence/server.db", "-o", str(report)).exit_code == 0
    names = {p.name for p in images.iterdir()}
    assert names and "stale-from-an-older-report.png" not in names
    linked = {
        line.split("](incident-images/")[1].split(")")[0]
        for line in report.read_text().splitlines()
        if "](incident-images/" in line
    }
    assert linked == names

    (images / "notes.txt").write_text("someone's notes")
    before = _snapshot(case)
    refused = run("report", "evidence/server.db", "-o", str(report))
    assert refused.exit_code == 2 and "incident-images" in refused.output
    assert "not empty" in refused.output and _snapshot(case) == before
    forced = run("report", "evidence/server.db", "-o", str(report), "--force")
    assert forced.exit_code == 0 and not (images / "notes.txt").exists()
    assert {p.name for p in images.iterdir()} == names


def test_devices_and_stdout_are_written_directly(case):
    null = run("audit", "evidence/server.db", "-o", "/dev/null")
    assert null.exit_code == 0 and null.output == ""
    dash = run("audit", "evidence/server.db", "--format", "json", "-o", "-")
    assert dash.exit_code == 0 and json.loads(dash.output)["findings"]
    full = run("audit", "evidence/server.db", "-o", "/dev/full")
    assert full.exit_code == 2
    assert full.output.strip() == "dstack-audit: cannot write /dev/full: No space left on device"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "evidence/server.db", "-o", "afile/x.json"], "cannot write afile/x.json: "),
        (["audit", "evidence/server.db", "-o", "missing/x.json"], "cannot write missing/x.json: "),
        (["audit", "evidence/server.db", "--bundle", "afile/b"], "cannot write afile/b: "),
        (["ingest", "evidence/server.db", "--to", "afile/d/e"], "cannot write afile/d/e: "),
        (["report", "evidence/server.db", "-o", "missing/r.html"], "cannot write missing/r.html: "),
    ],
)
def test_unwritable_output_is_one_line(case, args, message):
    (case / "afile").write_text("a regular file, not a folder\n")
    (case / "out").mkdir()
    before = _snapshot(case)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"dstack-audit: {message}"), result.output
    assert "internal error" not in result.output and _snapshot(case) == before


def _run_ids(dataset: Path) -> set[str]:
    report = run("audit", str(dataset), "--format", "json")
    assert report.exit_code == 0, report.output
    return {r["run_id"] for r in json.loads(report.output)["runs"]}


def test_ingest_refuses_a_used_folder_and_force_replaces_it_whole(case):
    shutil.copytree(CRASH, case / "other")
    first = run("ingest", "evidence/server.db", "--to", "dataset")
    assert first.exit_code == 0, first.output
    seed_runs = _run_ids(case / "dataset")
    (case / "dataset" / "stale.txt").write_text("left by someone\n")
    before = _snapshot(case)

    second = run("ingest", "other/server.db", "--to", "dataset")
    assert second.exit_code == 2
    assert second.output.strip() == (
        "dstack-audit: dataset: the folder is not empty; refusing to write into it (give --force "
        "to replace it whole, or name a new or empty folder)"
    )
    assert _snapshot(case) == before

    forced = run("ingest", "other/server.db", "--to", "dataset", "--force")
    assert forced.exit_code == 0, forced.output
    assert not (case / "dataset" / "stale.txt").exists()
    other_runs = _run_ids(case / "dataset")
    assert other_runs and not other_runs & seed_runs  # only the second server's runs
    assert other_runs == _run_ids(case / "other" / "server.db")
    assert sorted(p.name for p in case.iterdir()) == ["dataset", "evidence", "other"]


def test_bundle_refuses_a_used_folder_and_force_replaces_it_whole(case):
    assert run("audit", "evidence/server.db", "--bundle", "bundle").exit_code == 0
    (case / "bundle" / "stale.txt").write_text("old\n")
    refused = run("audit", "evidence/server.db", "--bundle", "bundle")
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (case / "bundle" / "stale.txt").exists()
    forced = run("audit", "evidence/server.db", "--bundle", "bundle", "--force")
    assert forced.exit_code == 0, forced.output
    assert sorted(p.name for p in (case / "bundle").iterdir()) == [
        "manifest.json",
        "report.json",
        "report.md",
    ]
    empty = case / "empty"
    empty.mkdir()
    assert run("audit", "evidence/server.db", "--bundle", "empty").exit_code == 0
    assert (empty / "manifest.json").is_file()


def test_bundle_from_relative_paths_verifies_from_any_directory(case, monkeypatch):
    made = run("audit", "evidence", "--bundle", "bundle")
    assert made.exit_code == 0, made.output
    elsewhere = case / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    verified = run("verify", str(case / "bundle"))
    assert verified.exit_code == 0, verified.output
    assert "verified: 35 input(s) unchanged, the same 1 finding(s)" in verified.output
    assert Path.cwd() == elsewhere

    moved = case.parent / f"{case.name}-moved"
    monkeypatch.chdir(case.parent)
    case.rename(moved)  # evidence and bundle moved together: found relative to the bundle
    try:
        again = run("verify", str(moved / "bundle"))
        assert again.exit_code == 0, again.output
        assert "verified:" in again.output
        with (moved / "evidence" / "logs" / "server-info.standard.log").open("a") as log:
            log.write("\n")
        changed = run("verify", str(moved / "bundle"))
        assert changed.exit_code == 1
        assert "input changed: " in changed.output and "server-info.standard.log" in changed.output
    finally:
        moved.rename(case)


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        (b"garbage\n", "not a dstack-audit bundle manifest (Invalid JSON"),
        (b"[]", "not a dstack-audit bundle manifest (Input should be an object)"),
        (b'{"tool": "dstack-audit 0.1.0"}', "not a dstack-audit bundle manifest (created_at:"),
        (b"\xff\xfe\x00binary", "not a dstack-audit bundle manifest (Invalid JSON"),
        (None, "not a dstack-audit bundle (no manifest.json in it)"),
        ("folder", "manifest.json: cannot read it (Is a directory)"),
    ],
    ids=["text", "array", "fields-missing", "binary", "missing", "unreadable"],
)
def test_verify_of_a_garbage_manifest_is_one_line(case, manifest, problem):
    assert run("audit", "evidence/server.db", "--bundle", "bundle").exit_code == 0
    path = case / "bundle" / "manifest.json"
    if manifest is None:
        path.unlink()
    elif manifest == "folder":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(manifest)
    result = run("verify", "bundle")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1, result.output
    assert problem in result.output and "internal error" not in result.output


def test_verify_of_a_missing_bundle_or_bad_options_is_one_line(case):
    missing = run("verify", "no-such-bundle")
    assert missing.exit_code == 2
    assert (
        missing.output
        == "dstack-audit: no-such-bundle: not a dstack-audit bundle (no such folder)\n"
    )
    assert run("audit", "evidence/server.db", "--bundle", "bundle").exit_code == 0
    manifest = json.loads((case / "bundle" / "manifest.json").read_text())
    manifest["options"]["since"] = "yesterday"
    (case / "bundle" / "manifest.json").write_text(json.dumps(manifest))
    bad = run("verify", "bundle")
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert "manifest.json: not a dstack-audit bundle manifest (options.since: " in bad.output


def test_planned_outputs_are_checked_against_inputs_found_later(tmp_path):
    """An input found while reading (a file inside a folder, a database's -wal) is checked
    against every output planned before it."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    outputs = Outputs([evidence / "server.db"])
    with pytest.raises(AuditInputError, match="the folder holding the input"):
        outputs.file(evidence / "report.json")
    outputs.file(tmp_path / "report.json")
    with pytest.raises(AuditInputError, match="it lies inside the input folder"):
        outputs.add_inputs([tmp_path])


def test_force_never_replaces_the_working_directory(case, monkeypatch):
    work = case / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the investigator's notes\n")
    monkeypatch.chdir(work)
    before = _snapshot(case)
    result = run("audit", "../evidence/server.db", "--bundle", ".", "--force")
    assert result.exit_code == 2
    assert result.output == (
        "dstack-audit: .: refusing to replace the folder holding the working directory\n"
    )
    assert _snapshot(case) == before


def test_output_through_a_link_replaces_the_file_it_names_and_keeps_the_link(case):
    (case / "reports").mkdir()
    (case / "reports" / "latest.json").write_text("old\n")
    (case / "latest.json").symlink_to(case / "reports" / "latest.json")
    result = run("audit", "evidence/server.db", "--format", "json", "-o", "latest.json")
    assert result.exit_code == 0, result.output
    assert (case / "latest.json").is_symlink()
    assert json.loads((case / "reports" / "latest.json").read_text())["findings"]
    assert sorted(p.name for p in (case / "reports").iterdir()) == ["latest.json"]


def test_an_interrupted_write_to_redirected_stdout_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """`audit ... > out.json` (or `>> log`) interrupted while the output is written: the
    shell's file is cut back to where this output began, never left holding half a JSON."""
    from analyzer.outputs import plan

    (tmp_path / "evidence").mkdir()
    evidence = tmp_path / "evidence" / "server.db"  # stdout into its folder is refused
    evidence.write_bytes(b"evidence")
    target = tmp_path / "out.log"
    target.write_text("an earlier run's line\n")

    def pieces(interrupt: bool):
        for number in range(64):  # more than stdout's buffer: part of it reaches the file
            yield f"{number:04d}" + "x" * 65536 + "\n"
            if interrupt and number == 40:
                raise KeyboardInterrupt

    with target.open("a", encoding="utf-8") as appended:
        monkeypatch.setattr(sys, "stdout", appended)
        outputs = plan([evidence], files=(None,))
        with pytest.raises(KeyboardInterrupt):
            outputs.write_pieces(None, pieces(interrupt=True))
        assert target.read_text() == "an earlier run's line\n"
        outputs.write_pieces(None, pieces(interrupt=False))
    assert target.read_text().startswith("an earlier run's line\n0000x")
    assert target.stat().st_size == len("an earlier run's line\n") + 64 * (4 + 65536 + 1)


def test_a_full_device_is_named_by_the_real_errors_that_say_so():
    """ENOSPC as Python's own write, polars' and SQLite's say it, all real, each seen as a full
    disk (not a bug of ours); an error that is not one is not."""
    from analyzer.errors import out_of_room

    errors = []
    with pytest.raises(OSError) as python_write, open("/dev/full", "wb") as device:
        device.write(b"x" * 65536)
        device.flush()
    errors.append(python_write.value)
    import polars as pl

    with pytest.raises(OSError) as polars_write:
        pl.DataFrame({"a": range(100_000)}).write_ipc("/dev/full")
    errors.append(polars_write.value)
    import sqlite3

    database = sqlite3.connect(":memory:")
    database.executescript("PRAGMA max_page_count = 2; CREATE TABLE t (x)")
    with pytest.raises(sqlite3.OperationalError) as sqlite_write:
        database.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,)] * 100)
    errors.append(sqlite_write.value)
    assert [out_of_room(error) for error in errors] == ["no space left on device"] * 3
    assert out_of_room(FileNotFoundError(2, "No such file or directory")) is None
    assert out_of_room(ValueError("database or disk is full")) is None


def _on_a_full_disk(folder: Path, command: str) -> subprocess.CompletedProcess:
    """`command` (a shell's) run with `folder` a real 16 KiB tmpfs, mounted in a user and mount
    namespace of its own; it prints its exit status, then what is left in the folder."""
    script = f"mount -t tmpfs -o size=16k tmpfs {folder} && {command}; echo exit=$?; ls -A {folder}"
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )


def test_an_ingest_onto_a_full_disk_is_one_line_and_leaves_nothing_beside_its_target(tmp_path):
    """The dataset's Parquet files fill the disk: the command names its target and why, exits
    2, and no staging folder is left (polars' partitioned writer went on writing after its
    error, into the folder removed by then: 1 run in 3 left one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = _on_a_full_disk(
        disk, f"{sys.executable} -m analyzer ingest {SEED / 'server.db'} --to {disk}/dataset -q"
    )
    assert done.stdout.splitlines() == ["exit=2"]  # nothing left on the disk
    assert done.stderr == f"dstack-audit: cannot write {disk}/dataset: no space left on device\n"


def test_a_full_working_folder_is_one_line_naming_it_and_left_empty(tmp_path):
    """A partitioned audit whose TMPDIR is a real 16 KiB tmpfs (mounted in a user and mount
    namespace of its own): the disk fills as the partitions are written, and the command says
    so in one line that names the folder and what to do, exits 2, and leaves nothing there."""
    full = tmp_path / "full"
    full.mkdir()
    done = _on_a_full_disk(
        full,
        f"TMPDIR={full} {sys.executable} -m analyzer audit {SEED / 'server.db'} --partitions 2 "
        f"-q -o {tmp_path / 'report.json'}",
    )
    assert done.stdout.splitlines() == ["exit=2"]  # nothing left in the folder
    assert done.stderr == (
        f"dstack-audit: no space left on device while writing an output or a working file "
        f"(under {full}): free some space, or set TMPDIR to a folder with room\n"
    )
    assert not (tmp_path / "report.json").exists()


def test_a_private_folder_is_removed_though_a_late_writer_still_adds_files(tmp_path, monkeypatch):
    """A writer that goes on creating files in a private folder after its removal began (as
    polars' sink does for a moment after Ctrl-C interrupted a write_ipc: a 0-byte bucket
    file left the folder 'not empty', and the audit ended in an internal error, not 130):
    the folder is still removed, as soon as the writer can put nothing more in it."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    added: list[int] = []
    started = threading.Event()

    def late_writer(folder: Path) -> None:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # then it stops, as the sink does
            try:
                (folder / f"late-{len(added)}.arrow").touch()
            except FileNotFoundError:
                return  # the folder is gone: nothing can be put back
            added.append(len(added))
            started.set()

    with pytest.raises(KeyboardInterrupt), private_folder("dstack-audit-test-") as folder:
        writer = threading.Thread(target=late_writer, args=(folder,))
        writer.start()
        started.wait(5)
        raise KeyboardInterrupt
    writer.join()
    assert added and not folder.exists()
    assert not list(tmp_path.iterdir())


def test_a_folder_still_filled_past_the_wait_is_an_error_not_a_hang(tmp_path, monkeypatch):
    """A removal that cannot finish within its wait raises the file system's error."""
    folder = tmp_path / "held"
    folder.mkdir()
    (folder / "a").touch()
    calls = []

    def refused(path, *args, **kwargs):
        calls.append(path)
        raise OSError(39, "Directory not empty", str(path))

    monkeypatch.setattr("analyzer.outputs.shutil.rmtree", refused)
    with pytest.raises(OSError, match="not empty"):
        remove_folder(folder, wait=0.05)
    assert len(calls) > 1 and folder.exists()
