"""Evidence is every input, whatever its form (issue 23): a file:// URL, a hard link, a bind
mount, a block device and standard output redirected onto an input are all the evidence."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest
from conftest import CAPTURES, ROOT

SEED = CAPTURES / "v0.22.5" / "seed"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "analyzer", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, check=False, **kwargs)


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def evidence(tmp_path):
    shutil.copytree(SEED, tmp_path / "evidence")
    return tmp_path / "evidence"


def test_file_url_input_is_evidence(evidence):
    before = _snapshot(evidence)
    done = _cli("audit", f"file://{evidence}/server.db", "-o", str(evidence / "report.json"))
    assert done.returncode == 2 and "refused as an output" in done.stderr, done.stderr
    assert _snapshot(evidence) == before


def test_hard_link_to_an_input_is_the_input(evidence, tmp_path):
    (tmp_path / "out").mkdir()
    os.link(evidence / "server.db", tmp_path / "out" / "copy.db")
    before = _snapshot(evidence)
    done = _cli("audit", str(evidence / "server.db"), "-o", str(tmp_path / "out" / "copy.db"))
    assert done.returncode == 2 and "device and inode" in done.stderr, done.stderr
    assert _snapshot(evidence) == before


def test_bind_mount_of_the_evidence_folder_is_the_evidence(evidence, tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "--bind", str(evidence), str(mount)], check=False).returncode:
        pytest.skip("mount --bind needs root")
    try:
        before = _snapshot(evidence)
        done = _cli("audit", str(evidence / "server.db"), "-o", str(mount / "report.txt"))
        assert done.returncode == 2 and "by inode" in done.stderr, done.stderr
        assert _snapshot(evidence) == before
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_block_device_is_never_written(evidence, tmp_path):
    node = tmp_path / "disk"
    try:
        os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 250))
    except PermissionError:
        pytest.skip("mknod needs root")
    done = _cli("audit", str(evidence / "server.db"), "-o", str(node))
    assert done.returncode == 2 and "block device" in done.stderr, done.stderr


def test_stdout_appended_onto_an_input_is_refused(evidence):
    log = evidence / "logs" / "server-info.standard.log"
    before = log.read_bytes()
    with log.open("ab") as appended:
        done = subprocess.run(
            [sys.executable, "-m", "analyzer", "audit", str(log)],
            stdout=appended,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            check=False,
        )
    assert done.returncode == 2 and "standard output" in done.stderr, done.stderr
    assert log.read_bytes() == before


def test_standard_input_from_a_file_is_evidence(evidence):
    """Not listed in the issue: `audit - -o LOG < LOG` would replace the log it reads."""
    log = evidence / "logs" / "server-info.standard.log"
    before = log.read_bytes()
    with log.open("rb") as given:
        done = _cli("audit", "-", "-o", str(log), stdin=given)
    assert done.returncode == 2 and "refused as an output" in done.stderr, done.stderr
    assert log.read_bytes() == before


@pytest.mark.parametrize(
    ("command", "into"),
    [
        (("exposure", "server.db"), "exp.txt"),  # the case the issue names
        (("audit", "server.db", "--format", "json"), "report.json"),
        (("timeline", "web", "server.db"), "logs/timeline.txt"),  # below the folder
        (("verify", "."), "verify.txt"),  # a command that plans no file of its own
    ],
)
def test_stdout_redirected_into_the_evidence_folder_is_refused(evidence, command, into):
    """`cd ev && dstack-audit exposure server.db > exp.txt`: the shell makes the file, the
    tool refuses to fill it (exit 2, nothing written), as it refuses `-o` there."""
    target = evidence / into
    with target.open("wb") as redirected:
        done = subprocess.run(
            [sys.executable, "-m", "analyzer", *command],
            cwd=evidence,
            stdout=redirected,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "standard output: refused as an output: it lies inside" in done.stderr, done.stderr
    assert target.read_bytes() == b""


def test_stdout_redirected_beside_the_evidence_folder_is_written(evidence):
    """The rule is about the evidence's folders, not about files: next to them is fine."""
    target = evidence.parent / "exp.txt"
    with target.open("wb") as redirected:
        done = subprocess.run(
            [sys.executable, "-m", "analyzer", "exposure", "server.db"],
            cwd=evidence,
            stdout=redirected,
            stderr=subprocess.PIPE,
            env=ENV,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert target.read_bytes().startswith(b"Exposure as of ")
