"""The JSON report rendered piece by piece (analyzer.render.report_json) and its final
redaction pass chunk by chunk (analyzer.redact.redact_pieces): the bytes of the whole text
rendered and redacted at once, and no secret through, wherever the chunks end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from test_secrets import AWS_SECRET, GITHUB_TOKEN, JWT, KEY_BODY, PRIVATE_KEY, SLACK_TOKEN

from analyzer.api import audit_in_partitions, open_sources
from analyzer.cli import main
from analyzer.outputs import plan
from analyzer.redact import MASK, Redactor, redact_pieces, without_controls
from analyzer.render.report_json import (
    _as_piece,
    _as_piece_bytes,
    _last_of_list,
    _passed_texts,
    item_piece,
    json_pieces,
)

FLEET = Path(__file__).resolve().parents[1] / "samples" / "fleet"


@pytest.fixture(scope="module")
def fleet_report():
    return open_sources([FLEET]).report


def test_pieces_are_the_whole_json_in_whole_lines(fleet_report):
    assert fleet_report.runs and fleet_report.findings
    pieces = list(json_pieces(fleet_report))
    assert "".join(pieces) == fleet_report.model_dump_json(indent=2) + "\n"
    assert all(piece.endswith("\n") for piece in pieces)
    assert len(pieces) == len(fleet_report.runs) + len(fleet_report.findings) + 6


@pytest.mark.parametrize("empty", [("runs",), ("findings",), ("runs", "findings")])
def test_empty_lists_render_as_pydantic_does(fleet_report, empty):
    report = fleet_report.model_copy(update={name: [] for name in empty})
    assert "".join(json_pieces(report)) == report.model_dump_json(indent=2) + "\n"


def _planted(report, secrets: list[str], where: tuple[int, ...] = (0,)):
    """`report` with `secrets` in the notes of its findings at `where`, unredacted (the final
    pass is all that stands between them and the output)."""
    findings = list(report.findings)
    for index in where:
        finding = findings[index]
        findings[index] = finding.model_copy(update={"notes": [*finding.notes, *secrets]})
    return report.model_copy(update={"findings": findings})


def _final_pass(text: str) -> str:
    return without_controls(Redactor().apply(text))


SECRETS = [
    f"token {GITHUB_TOKEN} and AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
    f"slack {SLACK_TOKEN} jwt {JWT}",
    PRIVATE_KEY,  # a key block: its newlines JSON-escaped, on one line
    KEY_BODY,
]
GIVEN_AWAY = (GITHUB_TOKEN, AWS_SECRET, SLACK_TOKEN, JWT, "b3BlbnNzaC1rZXktdjE", "MIIEvQ")


def _written(report, tmp_path: Path, chunk: int) -> str:
    output = tmp_path / "report.json"
    outputs = plan([FLEET], files=(output,))
    outputs.write_pieces(output, redact_pieces(json_pieces(report), _final_pass, chunk=chunk))
    return output.read_text(encoding="utf-8")


@pytest.mark.parametrize("chunk", [1, 5_000, 10**9])  # every piece alone, some, all at once
def test_a_secret_planted_in_a_finding_is_masked_as_in_the_whole_text(
    fleet_report, tmp_path, chunk
):
    report = _planted(fleet_report, SECRETS)
    written = _written(report, tmp_path, chunk)
    assert written == _final_pass(report.model_dump_json(indent=2) + "\n")
    assert not [secret for secret in GIVEN_AWAY if secret in written]
    planted = json.loads(written)["findings"][0]["notes"][-len(SECRETS) :]
    assert planted[0].startswith("token ") and all(MASK in note for note in planted)


@pytest.mark.parametrize("chunk", [1, 5_000])
def test_secrets_in_two_findings_never_reach_the_output(fleet_report, tmp_path, chunk):
    """Over the whole text a key block's BEGIN in one finding and an END in another are one
    match of a rule spanning lines (everything between masked); chunk by chunk each finding
    is masked on its own: no secret through either way."""
    report = _planted(fleet_report, SECRETS, where=(0, -1))
    written = _written(report, tmp_path, chunk)
    assert not [secret for secret in GIVEN_AWAY if secret in written]
    assert len(json.loads(written)["findings"]) == len(report.findings)


def test_a_key_block_cut_before_its_end_is_masked_within_its_chunk(fleet_report):
    """Over the whole text such a block is masked to the end of the report; chunk by chunk,
    to the end of its chunk: the key with it either way, and later chunks stay whole."""
    cut = PRIVATE_KEY.split("-----END")[0]
    report = _planted(fleet_report, [cut])
    chunks = list(redact_pieces(json_pieces(report), _final_pass, chunk=1))
    text = "".join(chunks)
    assert "b3BlbnNzaC1rZXktdjE" not in text and "BEGIN OPENSSH" not in text
    assert chunks[-1] == "}\n"


def _texts(report) -> pl.Series:
    items = [*report.runs, *report.findings]
    return pl.Series([item.model_dump_json(indent=2) for item in items], dtype=pl.String)


@pytest.mark.parametrize("hidden", ["", "\x7f", "\u200b"])  # none, in ASCII text, or not
def test_items_passed_where_audited_are_the_pieces_passed_one_by_one(fleet_report, hidden):
    """A partition's runs and findings through the final pass in its own process
    (json_partitions): each comes back as the text whose piece is that piece passed alone,
    the command's pass over the pieces one chunk each (a hidden character inside a secret
    removed first)."""
    token = GITHUB_TOKEN[:12] + hidden + GITHUB_TOKEN[12:]
    report = _planted(fleet_report, [*SECRETS, f"again {token}"], where=(0, -1))
    texts = _texts(report)
    passed = _passed_texts(texts)
    assert passed is not None and (passed != texts).sum() == 2
    items = [*report.runs, *report.findings]
    clean = [Redactor().apply(without_controls(item_piece(item))) for item in items]
    assert [_as_piece(text) for text in passed] == clean
    assert not [secret for secret in GIVEN_AWAY if any(secret in text for text in passed)]


def test_an_item_whose_mask_crosses_its_lines_is_left_to_the_command(fleet_report):
    """A key block cut before its end is masked to the end of its piece, closing lines and
    all: no longer an item's text, so the whole partition is left to the command's pass."""
    cut = PRIVATE_KEY.split("-----END")[0]
    assert _passed_texts(_texts(_planted(fleet_report, [cut]))) is None


@pytest.mark.parametrize("partitions", [[], ["--partitions", "3"], ["--workers", "2"]])
def test_the_cli_writes_the_whole_json_report(tmp_path, partitions):
    """Streamed, the report is the bytes of the report rendered whole (partitions merged)."""
    target = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["audit", str(FLEET), "-q", "-o", str(target), *partitions])
    assert result.exit_code == 0, result.output
    report = audit_in_partitions([FLEET], 3) if partitions else open_sources([FLEET]).report
    assert target.read_bytes() == (report.model_dump_json(indent=2) + "\n").encode("utf-8")


def test_the_cli_writes_the_report_of_local_workers_to_standard_output():
    """`--workers` piped: the items as the bytes their spill files hold after the head, a
    real process's standard output (buffered, as a pipe has it): the bytes of the report
    rendered whole."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    command = [sys.executable, "-m", "analyzer", "audit", str(FLEET), "-q", "--format", "json"]
    done = subprocess.run([*command, "--workers", "2"], capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    report = audit_in_partitions([FLEET], 3)
    assert done.stdout == (report.model_dump_json(indent=2) + "\n").encode("utf-8")


@pytest.mark.parametrize(
    "text", ['{\n  "run_name": "web"\n}', '{\n  "why": "r\u00e9plica \u2014 \u0434\u0430"\n}', "{}"]
)
def test_an_item_s_bytes_are_its_text_s_piece_encoded(text):
    """An item written from its spill file's bytes (a report passed where it was audited) is
    its text's piece encoded, the last of its list too (non-ASCII text: UTF-8 as it lies)."""
    piece = _as_piece(text)
    assert _as_piece_bytes(text.encode("utf-8")) == piece.encode("utf-8")
    assert _last_of_list(piece) == piece.removesuffix(",\n") + "\n"
    assert _last_of_list(piece.encode("utf-8")) == (piece.removesuffix(",\n") + "\n").encode()
    masked = piece.removesuffix(",\n") + "[MASKED]"  # a mask to the end of its piece
    assert _last_of_list(masked) == masked + "\n"
    assert _last_of_list(masked.encode()) == (masked + "\n").encode()


def test_the_report_is_rendered_once_and_guarded_on_that_text():
    """api.rendered_report: the text the guard looked at is the JSON written; a text holding
    no known value gets the final pass of secret shapes only, one holding a value (a job's
    name made a secret here) is walked, rendered again and passed whole."""
    from analyzer.api import rendered_report
    from analyzer.redact import shapes_only

    clean = open_sources([FLEET])
    done = rendered_report(clean, json_pieces)
    assert done.report is clean.report  # Audit.report's cache: one report
    assert "".join(done.texts) == done.report.model_dump_json(indent=2) + "\n"
    assert done.redact is shapes_only

    holding = open_sources([FLEET])
    name = holding._assembled.findings[0].victims[0].job_name
    holding.evidence.redactor.add([name + "-secret"])
    assert rendered_report(holding, json_pieces).redact is shapes_only  # not in the text
    holding = open_sources([FLEET])
    holding.evidence.redactor.add([name])
    walked = rendered_report(holding, json_pieces)
    text = "".join(walked.texts)
    assert walked.redact is not shapes_only and walked.report is holding.report
    assert text == walked.report.model_dump_json(indent=2) + "\n"
    assert f'"{name}"' not in text and f'"{MASK}"' in text
    assert "".join(rendered_report(holding, json_pieces).texts) == text  # guarded already
