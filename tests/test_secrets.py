"""Secrets never reach any output: planted in copies of real captures, searched for in every
output format, the timeline, the quarantine file and the error messages."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES

from analyzer.cli import main
from analyzer.redact import MASK, Redactor

ENV_SECRET = "hf_PlantedEnvValue_4242"
RUN_ENV_SECRET = "sk-planted-run-spec-secret-77"
REGISTRY_PASSWORD = "planted-registry-pass-99"
ADMIN_TOKEN = "0a1b2c3d-admin-token-planted-5e6f"
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAAplanted\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
PLANTED = (
    ENV_SECRET,
    RUN_ENV_SECRET,
    REGISTRY_PASSWORD,
    ADMIN_TOKEN,
    "b3BlbnNzaC1rZXktdjEAAAAAplanted",
)


@pytest.fixture
def planted(copy_db, tmp_path):
    db = copy_db("v0.22.5/seed")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE jobs SET job_spec_data = json_set(job_spec_data, '$.env', json(?), "
            "'$.registry_auth', json(?), '$.ssh_key.private', ?)",
            (
                json.dumps({"HF_TOKEN": ENV_SECRET}),
                json.dumps({"username": "robot", "password": REGISTRY_PASSWORD}),
                PRIVATE_KEY,
            ),
        )
        connection.execute(
            "UPDATE runs SET run_spec = json_set(run_spec, '$.configuration.env', json(?))",
            (json.dumps({"OPENAI_API_KEY": RUN_ENV_SECRET}),),
        )
        # a failure message that quotes a secret, as an interpolation error might
        connection.execute(
            "UPDATE jobs SET termination_reason_message = ? WHERE status = 'FAILED'",
            (f"Fleet is at capacity; env HF_TOKEN={ENV_SECRET}",),
        )
    log = tmp_path / "server.log"
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    log.write_text(
        f"The admin token is {ADMIN_TOKEN}\n"
        + real
        + f"INFO 2026-11-02T09:10:00.000 dstack._internal.server.services.runs run(6e42c9)web: "
        f"odd new line quoting {ADMIN_TOKEN} and {ENV_SECRET}\n"
        + f"\x00 damaged {RUN_ENV_SECRET} {ADMIN_TOKEN}\n"
    )
    return db, log


def _outputs(db, log, out: Path) -> list[str]:
    runner = CliRunner()
    texts = []
    for fmt in ("table", "json", "markdown"):
        quarantine = out / f"quarantine-{fmt}.txt"
        result = runner.invoke(
            main, ["audit", str(db), str(log), "--format", fmt, "--quarantine", str(quarantine)]
        )
        assert result.exit_code == 0, result.output
        texts += [result.output, quarantine.read_text()]
    for source in ([str(db)], [str(log)]):
        result = runner.invoke(main, ["timeline", "web", *source])
        assert result.exit_code == 0, result.output
        texts.append(result.output)
    return texts


def test_planted_secrets_never_appear(planted, tmp_path_factory):
    db, log = planted
    outputs = _outputs(db, log, tmp_path_factory.mktemp("out"))  # never beside the evidence
    everything = "\n".join(outputs)
    for secret in PLANTED:
        assert secret not in everything, secret
    assert MASK in everything  # the failure message is still shown, redacted in place
    assert "Fleet is at capacity; env HF_TOKEN=***" in everything


def test_capture_user_tokens_never_appear(tmp_path):
    with sqlite3.connect(CAPTURES / "v0.22.5" / "seed" / "server.db") as connection:
        tokens = [t.split(":")[-1] for (t,) in connection.execute("SELECT token FROM users")]
    result = CliRunner().invoke(
        main, ["audit", str(CAPTURES / "v0.22.5" / "seed"), "--format", "json"]
    )
    assert result.exit_code == 0
    for token in tokens:
        assert token not in result.output


def test_password_in_a_database_url_never_appears_in_errors():
    result = CliRunner().invoke(
        main, ["audit", "postgresql://dstack:S3cretPassw0rd@127.0.0.1:1/db"]
    )
    assert result.exit_code == 2
    assert "S3cretPassw0rd" not in result.output


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("postgresql://u:hunter22@db:5432/x", "postgresql://u:***@db:5432/x"),
        ("The admin token is abc-123-def", "The admin token is ***"),
        ("Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer ***"),
        ("enc:identity:noname:95f0fa56-dc10", "enc:identity:noname:***"),
        ("Job status changed RUNNING -> TERMINATING", "Job status changed RUNNING -> TERMINATING"),
    ],
)
def test_secret_shapes(text, kept):
    assert Redactor().apply(text) == kept
