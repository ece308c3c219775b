"""Both notebooks run top to bottom on the bundled samples, and their outputs hold the values
the samples prove (a notebook that breaks fails CI)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _run(name: str) -> str:
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), (
        "notebooks are stored without outputs"
    )
    NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    texts = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            data = output.get("data", {})
            texts.append(data.get("text/plain", ""))
            texts.append(data.get("text/html", ""))
            if "image/png" in data:
                texts.append("<png>")
    return "\n".join(texts)


def test_post_incident_notebook():
    out = _run("post_incident.ipynb")
    assert "1 finding(s), 1 healthy replica(s) killed" in out
    assert "victim: web-0-0 699fe818-acc2-4e08-b121-d16ed8fd32f1" in out
    assert "culprit: web-0-1 failed_to_start_due_to_no_capacity" in out
    assert "<png>" in out  # the swimlane rendered
    assert "seconds_to_first_failure" in out and "10.86" in out  # 09:08:50.796 -> 09:09:01.659
    assert "ecs-circuit-breaker-rollback" in out


def test_fleet_audit_notebook():
    truth = json.loads((ROOT / "samples" / "fleet" / "truth.json").read_text())
    victims = sum(len(run["broad_victims"]) for run in truth["runs"])
    out = _run("fleet_audit.ipynb")
    assert f"{len(truth['runs'])} runs," in out and f"{victims} victims" in out
    assert "precision 1.0 recall 1.0" in out
    assert "findings" in out  # incidents counted per run, findings beside them
    assert "<png>" in out


@pytest.mark.parametrize("name", ["post_incident.ipynb", "fleet_audit.ipynb"])
def test_notebooks_are_stored_clean(name):
    book = json.loads((NOTEBOOKS / name).read_text())
    for cell in book["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


@pytest.mark.parametrize("name", ["post_incident.ipynb", "fleet_audit.ipynb"])
def test_a_notebook_copied_elsewhere_says_what_to_set(name, tmp_path):
    """Copied out of the repository, a notebook stops at its first cell with one sentence
    saying what to point at the evidence, not a traceback from deep in the library."""
    from nbclient.exceptions import CellExecutionError

    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert "pip install '.[notebook]'" in book.cells[0].source  # how to run it, in it
    client = NotebookClient(
        book, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(CellExecutionError) as stopped:
        client.execute()
    assert stopped.value.ename == "SystemExit", stopped.value
    assert "is not here: set " in stopped.value.evalue
    assert not any(cell.get("outputs") for cell in book.cells[2:] if cell.cell_type == "code")
