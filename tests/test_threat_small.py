"""The smaller boundaries of issue 23 (docs/threat-model.md): `synth` over a folder kept, a WAL
database given through a symlink, a log that grows while it is read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES

from analyzer.cli import main

pytest.importorskip("numpy")  # synth's extra

SEED = CAPTURES / "v0.22.5" / "seed"
ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_synth_over_an_existing_folder_refuses_without_force(tmp_path):
    out = tmp_path / "server"
    out.mkdir()
    (out / "server.db").write_bytes(b"the evidence of another day")
    (out / "truth.json").write_text("{}")
    (out / "notes.txt").write_text("kept")
    before = snapshot(out)
    result = CliRunner().invoke(main, ["synth", str(out), "--runs", "2"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith(f"dstack-audit: {out}: the folder is not empty") and "--force" in line
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["server"]
    forced = CliRunner().invoke(main, ["synth", str(out), "--runs", "2", "--force"])
    assert forced.exit_code == 0, forced.output
    assert {p.name for p in out.iterdir()} == {"server.db", "logs", "truth.json"}
    assert json.loads((out / "truth.json").read_text())["runs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server"]  # no staging left


def test_synth_refuses_a_file_or_the_working_directory(tmp_path, monkeypatch):
    """Not in the issue: OUT a file, and OUT the folder the command runs in (--force or not)."""
    afile = tmp_path / "server.db"
    afile.write_bytes(b"x")
    result = CliRunner().invoke(main, ["synth", str(afile), "--runs", "2", "--force"])
    assert result.exit_code == 2 and afile.read_bytes() == b"x"
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "keep").write_text("k")
    monkeypatch.chdir(tmp_path / "here")
    result = CliRunner().invoke(main, ["synth", ".", "--runs", "2", "--force"])
    assert result.exit_code == 2 and "working directory" in result.output
    assert (tmp_path / "here" / "keep").read_text() == "k"
