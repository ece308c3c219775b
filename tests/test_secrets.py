"""Secrets never reach any output: planted in copies of real captures, searched for in every
output format, the timeline, the quarantine file and the error messages."""

from __future__ import annotations

import json
import re
import sqlite3
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import CAPTURES
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analyzer import redact
from analyzer.api import open_sources
from analyzer.cli import main
from analyzer.gitleaks import GITLEAKS_LEFT_OUT, python_regex
from analyzer.redact import MASK, RULE_SET, Redactor
from analyzer.sources.logs.masking import RecordRun, redact_record_run

ENV_SECRET = "hf_PlantedEnvValue_4242"
RUN_ENV_SECRET = "sk-planted-run-spec-secret-77"
REGISTRY_PASSWORD = "planted-registry-pass-99"
ADMIN_TOKEN = "0a1b2c3d-admin-token-planted-5e6f"
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAAplanted\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
# Shape-only secrets: no source knows them, only their shape gives them away (with digits,
# which the unrecognised-line notes template to N).
HF_TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC2dF4g"
AWS_KEY_ID = "AKIAZ7PLANTED4242QX6"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTED4242"
GITHUB_TOKEN = "ghp_" + "Pl4nt3dT0k3nW1thD1g1ts0123456789abcd"
GITLAB_TOKEN = "glpat-Pl4nt3dGitLab42xyz99"
SLACK_TOKEN = "xoxb-1234567890-1234567890123-Pl4nt3dSl4ck"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJwbGFudGVkLTQyIiwiaWF0IjoxNzAwMDAwMDAwfQ"
    ".Pl4nt3dSignatur3Pl4nt3dSignatur3abc"
)
KEY_BODY = (  # a PKCS#8 private key's first lines, without BEGIN/END
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCplanted4242\n"
    "pl4ntedK3yB0dyL1neTw0xq7Zc9Yw1Vb3Nm5Lk7Jh9Gf2Ds4Ap6Oi8Uy0Tr2Ew4Q"
)
CLI_TOKEN = "cli-Pl4nted-T0ken-4242"
SHAPES = (HF_TOKEN, AWS_KEY_ID, AWS_SECRET, GITHUB_TOKEN, GITLAB_TOKEN, SLACK_TOKEN, JWT, CLI_TOKEN)
TERMINATION_MESSAGE = (  # what a container's termination message could quote
    f"crash: HF_TOKEN={HF_TOKEN} aws {AWS_KEY_ID} AWS_SECRET_ACCESS_KEY={AWS_SECRET} "
    f"git {GITHUB_TOKEN} {GITLAB_TOKEN} slack {SLACK_TOKEN} jwt {JWT} "
    f"args: serve --token {CLI_TOKEN}\n{KEY_BODY.replace(chr(92) + 'n', chr(10))}"
)
PLANTED = (
    ENV_SECRET,
    RUN_ENV_SECRET,
    REGISTRY_PASSWORD,
    ADMIN_TOKEN,
    "b3BlbnNzaC1rZXktdjEAAAAAplanted",
    *SHAPES,
    "MIIEvQIBADANBgkq",
    "pl4ntedK3yB0dyL1ne",
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
        connection.execute(
            "UPDATE jobs SET termination_reason_message = ? WHERE status = 'TERMINATED'",
            (TERMINATION_MESSAGE,),
        )
    log = tmp_path / "server.log"
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    log.write_text(
        f"The admin token is {ADMIN_TOKEN}\n"
        + real
        + f"INFO 2026-11-02T09:10:00.000 dstack._internal.server.services.runs run(6e42c9)web: "
        f"odd new line quoting {ADMIN_TOKEN} and {ENV_SECRET}\n"
        + "INFO 2026-11-02T09:10:01.000 dstack._internal.server.services.runs run(6e42c9)web: "
        + TERMINATION_MESSAGE.replace("\n", " ")
        + "\n"
        + f"\x00 damaged {RUN_ENV_SECRET} {ADMIN_TOKEN} {HF_TOKEN} {JWT}\n"
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


def _every_output(db: Path, log: Path, tmp_path: Path) -> dict[str, str]:
    """Every output the tool writes from these inputs, by name: reports, timeline, bundle,
    quarantine, HTML and markdown reports, SVG plots, the ingested dataset (every column of
    every table, the manifest), the notebook frames."""
    runner = CliRunner()
    texts = {f"cli {i}": text for i, text in enumerate(_outputs(db, log, tmp_path))}
    bundle = tmp_path / "bundle"
    result = runner.invoke(main, ["audit", str(db), str(log), "--bundle", str(bundle)])
    assert result.exit_code == 0, result.output
    texts |= {f"bundle {p.name}": p.read_text() for p in bundle.iterdir()}
    for name in ("report.html", "report.md"):
        result = runner.invoke(main, ["report", str(db), str(log), "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        texts[name] = (tmp_path / name).read_text()
    for name, args in (
        ("run.svg", ["web", str(db), str(log)]),
        ("fleet.svg", ["--fleet", str(db)]),
    ):
        result = runner.invoke(main, ["plot", *args, "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        texts[name] = (tmp_path / name).read_text()
    dataset = tmp_path / "dataset"
    result = runner.invoke(main, ["ingest", str(db), str(log), "--to", str(dataset)])
    assert result.exit_code == 0, result.output
    for path in sorted(dataset.rglob("*.parquet")):
        texts[f"dataset {path.relative_to(dataset)}"] = pl.read_parquet(path).write_ndjson()
    audit = open_sources([db, log])
    for name, frame in audit.tables().items():
        texts[f"tables() {name}"] = frame.collect().write_ndjson()
    texts["sql()"] = audit.sql("SELECT * FROM transitions").write_ndjson()
    return texts


def test_planted_secrets_never_appear(planted, tmp_path_factory):
    db, log = planted
    outputs = _every_output(db, log, tmp_path_factory.mktemp("out"))  # never beside the evidence
    for name, text in outputs.items():
        for secret in PLANTED:
            assert secret not in text, (name, secret)
    everything = "\n".join(outputs.values())
    assert MASK in everything  # the failure message is still shown, redacted in place
    assert "Fleet is at capacity; env HF_TOKEN=***" in everything
    assert "AWS_SECRET_ACCESS_KEY=***" in everything  # the name stays, the value goes
    assert "--token ***" in everything
    assert RULE_SET in outputs["cli 2"]  # the JSON report names the rule set it was masked with


def test_unrecognised_line_note_masks_before_templating(tmp_path):
    """A known value with digits in an unrecognised dstack line: the input's note templates
    digits to N, and still shows no part of the value (seen: `hf_...N...` escaped)."""
    log = tmp_path / "server.log"
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    log.write_text(
        real + "INFO 2026-11-02T09:10:00.000 dstack._internal.server.services.runs run(6e42c9)web: "
        f"new wording quoting {HF_TOKEN} and {JWT}\n"
    )
    report = open_sources([log]).report
    notes = "\n".join(n for i in report.inputs for n in i.notes)
    assert "unrecognised dstack line" in notes
    for secret in (HF_TOKEN, JWT, redact.templated(HF_TOKEN), redact.templated(JWT)):
        assert secret not in notes
        assert secret[:12] not in notes


def test_capture_user_tokens_never_appear(tmp_path):
    with sqlite3.connect(CAPTURES / "v0.22.5" / "seed" / "server.db") as connection:
        tokens = [t.split(":")[-1] for (t,) in connection.execute("SELECT token FROM users")]
    result = CliRunner().invoke(
        main, ["audit", str(CAPTURES / "v0.22.5" / "seed"), "--format", "json"]
    )
    assert result.exit_code == 0
    for token in tokens:
        assert token not in result.output


@pytest.mark.parametrize(
    "password", ["S3cretPassw0rd", "Pa/ss4242word", "Pa#ss4242word", "Pa?ss4242word", "p@/s#s?w42"]
)
def test_password_in_a_database_url_never_appears_in_errors(password, tmp_path):
    url = f"postgresql://dstack:{password}@127.0.0.1:1/db"
    result = CliRunner().invoke(main, ["audit", url])
    assert result.exit_code == 2
    parts = [p for p in re.split(r"[/#?@]", password) if len(p) >= 2]
    for part in parts:
        assert part not in result.output, part
    from analyzer.sources.postgres import parse_url, url_without_password

    target = parse_url(url)
    for shown in (target.shown, target.anonymous, url_without_password(url), Redactor().apply(url)):
        assert shown.startswith("postgresql://dstack") and "127.0.0.1:1/db" in shown, shown
        for part in parts:
            assert part not in shown, (part, shown)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("postgresql://u:hunter22@db:5432/x", "postgresql://u:***@db:5432/x"),
        ("The admin token is abc-123-def", "The admin token is ***"),
        ("Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer ***"),
        ("enc:identity:noname:95f0fa56-dc10", "enc:identity:noname:***"),
        ("Job status changed RUNNING -> TERMINATING", "Job status changed RUNNING -> TERMINATING"),
        (f"key {AWS_KEY_ID}.", "key ***."),
        (f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}", "export AWS_SECRET_ACCESS_KEY=***"),
        ('"api_token": "abc123def"', '"api_token": "***"'),
        ("db_password: hunter22", "db_password: ***"),
        (f"python serve.py --token {CLI_TOKEN} --port 80", "python serve.py --token *** --port 80"),
        ("run --password=s3cr3t-42", "run --password=***"),
        (f"clone https://x:{GITHUB_TOKEN}@github.com/a/b", "clone https://x:***@github.com/a/b"),
        (f"HF said {HF_TOKEN}", "HF said ***"),
        (f"jwt={JWT}", "jwt=***"),
        (f"glab {GITLAB_TOKEN} and {SLACK_TOKEN}", "glab *** and ***"),
        ("postgresql://u:pa/ss#wo?rd@db:5432/x", "postgresql://u:***@db:5432/x"),
        ("http://host:8080/users/@me", "http://host:8080/users/@me"),
        ("the key: value of a group", "the key: value of a group"),  # a bare key is no secret
    ],
)
def test_secret_shapes(text, kept):
    assert Redactor().apply(text) == kept


def test_private_key_bodies_without_begin_end_lines():
    for body in (KEY_BODY, KEY_BODY.replace("\\n", "\n"), "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE"):
        out = Redactor().apply(f"key material: {body} end")
        assert out == "key material: *** end", out
    block = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAplanted\n-----END RSA PRIVATE KEY-----"
    )
    assert Redactor().apply(f"a {block} b") == "a *** b"
    assert Redactor().apply("cut -----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl") == "cut ***"


def test_every_vendored_rule_loads():
    """gitleaks' rules all translate and compile (RE2 -> Python), and the set is named."""
    import tomllib

    config = tomllib.loads(redact.GITLEAKS_FILE.read_text(encoding="utf-8"))
    expected = [r["id"] for r in config["rules"] if "regex" in r]
    loaded = [rule.id for rule in redact.rules()]
    assert [i for i in expected if i not in GITLEAKS_LEFT_OUT] == loaded[: len(expected) - 1]
    assert len(loaded) == len(expected) - 1 + len(redact.PROJECT_RULES)
    assert redact.GITLEAKS_VERSION in RULE_SET


@pytest.mark.parametrize(
    ("re2", "python"),
    [
        (r"\b(p8e-(?i)[a-z0-9]{4})x", r"\b(p8e-(?i:[a-z0-9]{4}))x"),
        (r"a(?i)b|c", r"a(?i:b)|(?i:c)"),
        (r"(?i)abc", r"(?i)abc"),
        (r"\b(sha256~[\w-]{43})(?:[^\w-]|\z)", r"\b(sha256~[\w-]{43})(?:[^\w-]|\Z)"),
        (r"\b(pat[[:alnum:]]{14})", r"\b(pat[0-9A-Za-z]{14})"),
    ],
)
def test_re2_translation(re2, python):
    assert python_regex(re2) == python


@pytest.mark.parametrize("capture_log", sorted(CAPTURES.glob("v*/*/logs/*.log")), ids=str)
def test_real_logs_lose_nothing_but_secrets(capture_log):
    """The shapes never mask dstack's own words: a real capture's log lines come out the same,
    but for the admin token line."""
    lines = pl.Series(capture_log.read_text(encoding="utf-8", errors="replace").splitlines())
    out = redact.redact_shapes(lines)
    changed = lines.filter(out != lines).to_list()
    assert all("The admin token is" in line for line in changed), changed[:3]


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _token(prefix: str, size: int, alphabet: str = _ALNUM):
    return st.text(alphabet, min_size=size, max_size=size).map(lambda body: prefix + body)


SECRETS = st.one_of(
    _token("hf_", 34),
    _token("ghp_", 36),
    _token("github_pat_", 82, _ALNUM + "_"),
    _token("glpat-", 20),
    _token("AKIA", 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
    st.builds(
        lambda a, b: f"xoxb-{a}-{b}", st.integers(10**9, 10**10 - 1), st.integers(10**11, 10**12)
    ),
    st.builds(
        lambda a, b, c: f"eyJ{a}.eyJ{b}.{c}", *(st.text(_ALNUM, min_size=20, max_size=40),) * 3
    ),
)
WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).map(
    lambda text: text.replace("_", " ")
)


@settings(max_examples=300, deadline=None)
@given(secret=SECRETS, before=WORDS, after=WORDS)
def test_generated_secret_shapes_never_survive(secret, before, after):
    for text in (f"{before} {secret} {after}", f"{before}\n{secret}\n{after}"):
        out = Redactor().apply(text)
        assert secret not in out
        assert MASK in out


SECRET_NAMED = re.compile(r"(?i)secret|token|key|pass|credential|bearer|basic|auth")


@settings(max_examples=200, deadline=None)
@given(
    value=st.text(_ALNUM + "-_./+", min_size=4, max_size=40),
    name=st.sampled_from(
        ["AWS_SECRET_ACCESS_KEY", "api_key", "DB_PASSWORD", "token", "client-secret", "creds"]
    ),
    sep=st.sampled_from(["=", ": ", " = ", '": "']),
    before=WORDS,
)
def test_generated_secret_fields_never_survive(value, name, sep, before):
    """The value never survives; the field's name does, unless the words before it mask the
    word that follows them (they end with a secret's own name, as `Bearer` or `TOKEN`, words
    Hypothesis takes from the rules' source: then the name goes with the value)."""
    out = Redactor().apply(f"{before} {name}{sep}{value} done")
    assert f"{sep}{value} done" not in out
    assert MASK in out
    if not SECRET_NAMED.search(before):
        assert f"{name}{sep}{MASK}" in out


@settings(max_examples=200, deadline=None)
@given(value=st.text(min_size=4, max_size=30), before=WORDS, after=WORDS)
def test_generated_known_values_never_survive(value, before, after):
    """Every known value that is not an ordinary word (those: test_ordinary_known_words...)."""
    assume(not redact.ordinary_word(value))
    redactor = Redactor()
    redactor.add([value])
    out = redactor.apply(f"{before}{value}{after}")
    assert value not in out or value in f"{before}{after}".replace(value, "")
    assert redactor.apply(out) == out  # masking twice changes nothing more


def _injected(copy_db, tmp_path) -> tuple[Path, Path]:
    db = copy_db("v0.22.5/seed")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE jobs SET termination_reason_message = ? WHERE status = 'FAILED'",
            (INJECTION,),
        )
    log = tmp_path / "server.log"
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    log.write_text(
        real
        + "INFO 2026-11-02T09:10:00.000 dstack._internal.server.services.runs run(6e42c9)web: "
        + INJECTION
        + "\n"
    )
    return db, log


INJECTION = (
    "Fleet is at capacity <img src=x onerror=alert(1)> ![x](http://evil.example/p.png) "
    "[click](javascript:alert(1)) <script>alert(2)</script> \x1b]0;owned\x07\x1b[31mred\x1b[0m "
    "\x9b2J -- <!-- & www.evil.example"
)
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_output_injection_is_neutralised(copy_db, tmp_path, tmp_path_factory):
    db, log = _injected(copy_db, tmp_path)
    out = tmp_path_factory.mktemp("out")  # never beside the evidence
    runner = CliRunner()
    outputs = {}
    for fmt in ("table", "json", "markdown"):
        result = runner.invoke(main, ["audit", str(db), str(log), "--format", fmt])
        assert result.exit_code == 0, result.output
        outputs[fmt] = result.output
    result = runner.invoke(main, ["timeline", "web", str(db), str(log)])
    outputs["timeline"] = result.output
    for name in ("report.html", "report.md", "run.svg", "fleet.svg"):
        command = ["report", str(db), str(log)]
        if name == "run.svg":
            command = ["plot", "web", str(db), str(log)]
        elif name == "fleet.svg":
            command = ["plot", "--fleet", str(db), str(log)]
        result = runner.invoke(main, [*command, "-o", str(out / name)])
        assert result.exit_code == 0, result.output
        outputs[name] = (out / name).read_text()
    for name, text in outputs.items():
        assert not CONTROLS.search(text), (name, CONTROLS.search(text))
    for name in ("markdown", "report.md", "report.html"):  # formats where markup is live
        assert not re.search(r"(?<!\\)<(?:img src=x|script>)", outputs[name]), name
    assert "Fleet is at capacity" in outputs["markdown"]  # the message is shown, inert
    for name in ("markdown", "report.md"):
        text = outputs[name]
        assert "](http" not in text and "](javascript" not in text, name
        assert "http://evil" not in text and "www.evil" not in text, name  # no autolink either
        assert "\\<img" in text, name
    assert "&lt;img src=x onerror=alert(1)&gt;" in outputs["report.html"]
    for name in ("run.svg", "fleet.svg"):
        ET.fromstring(outputs[name])  # well-formed XML


# --- a secret split across log records (issue 36) ----------------------------------------

# an ed25519 key's body lines: only the first has the shape of a key body (b3BlbnNzaC1...)
SPLIT_KEY = (
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "QyNTUxOQAAACBQbGFudGVkU3BsaXRLZXlCb2R5TGluZVR3bzQyNDI0MjQyNDI0MjQyAAAA",
    "kFBsYW50ZWRTcGxpdEtleUJvZHlMaW5lVGhyZWU0MjQyNDI0MjQyNDI0MjQyNDI0MjQyNA",
)


def _notes_of(tmp_path: Path, *messages: str, logger: str = "services.runs") -> str:
    """The input notes of the seed's log with `messages` logged one record each."""
    log = tmp_path / "server.log"
    real = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    lines = [
        f"INFO 2026-11-02T09:10:{n:02d}.000 dstack._internal.server.{logger} {message}\n"
        for n, message in enumerate(messages)
    ]
    log.write_text(real + "".join(lines))
    report = open_sources([log]).report
    return "\n".join(n for i in report.inputs for n in i.notes)


@pytest.mark.parametrize(
    ("begin", "end"),
    [
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"),
        # not in the issue: another block, its END on the record of the next message
        ("-----BEGIN EC PRIVATE KEY-----", "-----END EC PRIVATE KEY----- key loaded"),
    ],
)
def test_a_key_logged_a_line_a_record_never_reaches_a_note(tmp_path, begin, end):
    """A key block from BEGIN to END, whatever the records: no body line of it in the notes,
    the records around it kept."""
    notes = _notes_of(tmp_path, "loading the key", begin, *SPLIT_KEY, end, "key done")
    assert "unrecognised dstack line" in notes
    for line in SPLIT_KEY:
        assert line[:16] not in notes and line[-16:] not in notes, notes
    assert "loading the key" in notes and "key done" in notes


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("registry password:", "Pl4ntedNextRecordPass42"),
        # not in the issue: a token label with `=`, and a command's option left at its end
        ("HF_TOKEN =", "Pl4ntedNextRecordToken42"),
        ("sshpass --password", "Pl4ntedNextRecordArg42"),
    ],
)
def test_a_value_on_the_record_after_its_label_never_reaches_a_note(tmp_path, label, value):
    notes = _notes_of(tmp_path, f"asking for the {label}", value, "after the value")
    assert value not in notes and redact.templated(value) not in notes, notes
    assert value[:10] not in notes
    assert "after the value" in notes


def test_a_key_block_open_at_the_end_of_a_chunk_stays_open_in_the_next():
    """The log is read in chunks: a block begun in one is masked in the next until its END."""
    run = RecordRun()
    first = redact_record_run(
        pl.Series(["a", "-----BEGIN RSA PRIVATE KEY-----", SPLIT_KEY[1]]), run
    )
    assert first.to_list() == ["a", MASK, MASK] and run.key_open
    second = redact_record_run(
        pl.Series([SPLIT_KEY[2], "-----END RSA PRIVATE KEY----- done", "b"]), run
    )
    assert second.to_list() == [MASK, f"{MASK} done", "b"] and not run.key_open


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # the shapes the issue lists
        ("key sk-proj-Pl4ntedBareProjKey1234567890", "key ***"),
        ("sk-ant-api03-Pl4ntedBareAnthropicKey42-x", "***"),
        ("bot xoxb-Pl4ntedSlackBot42", "bot ***"),
        ("got eyJhbGciOiJub25lIn0.eyJzdWIiOiI0MiJ9.c2ln ok", "got *** ok"),
        ("login dckr_pat_Pl4ntedDockerHub42", "login ***"),
        (
            "AWS_SECRET_ACCESS_KEY wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTED42",
            "AWS_SECRET_ACCESS_KEY ***",
        ),
        ("sshpass -p Pl4nted42 ssh h", "sshpass -p *** ssh h"),
        ("mysql -u root -pPl4nted42 db", "mysql -u root -p*** db"),
        ("token: abc def", "token: ***"),
        # not listed: another form of each class
        ("sk-svcacct-Pl4ntedServiceAccount42abc", "***"),
        ("xoxp-Pl4ntedSlackUser42 and more", "*** and more"),
        ("dckr_oat_Pl4ntedOrgToken42", "***"),
        (
            "aws configure set aws_secret_access_key Pl4nted/Secret42",
            "aws configure set aws_secret_access_key ***",
        ),
        ("sshpass -e -pPl4nted42 ssh", "sshpass -e -p*** ssh"),
        ("mariadb -h db -pPl4nted42", "mariadb -h db -p***"),
        ("api_key: one two three, user: bob", "api_key: ***, user: bob"),
        ("client_secret: a b user: kept", "client_secret: *** user: kept"),
        # kept: no value, or not a secret's
        ("mysql -u root -p db", "mysql -u root -p db"),
        ("set DSTACK_TOKEN or give --token", "set DSTACK_TOKEN or give --token"),
        ("INVALID_TOKEN for user", "INVALID_TOKEN for user"),
        ("the key: value of a group", "the key: value of a group"),
    ],
)
def test_secret_shapes_second_round(text, kept):
    assert Redactor().apply(text) == kept
