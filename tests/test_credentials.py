"""Credentials go only where the user sent them (docs/threat-model.md, "bundles", "live servers",
"environment"): an altered bundle makes `verify` open no network source and read nothing but the
bundle and its recorded inputs; a token is never shown, whatever a server does with it."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, one_line_error
from fake_dstack import FakeDstack, run

from analyzer.cli import main

SEED = CAPTURES / "v0.22.5" / "seed"
TOKEN = "5f0c3f6e-8d7a-4c1b-9e2f-0a1b2c3d4e5f"
PASSWORD = "Tr0ub4dor-and-3-horses"


@pytest.fixture
def bundle(tmp_path, monkeypatch) -> Path:
    """A genuine bundle of a copy of the seed capture (its manifest then altered by a test)."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    shutil.copyfile(SEED / "server.db", evidence / "server.db")
    folder = tmp_path / "bundle"
    monkeypatch.chdir(tmp_path)
    made = CliRunner().invoke(main, ["audit", "evidence/server.db", "--bundle", str(folder)])
    assert made.exit_code == 0, made.output
    assert CliRunner().invoke(main, ["verify", str(folder)]).exit_code == 0
    return folder


def altered(folder: Path, **fields) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))


@pytest.fixture
def listener():
    """A TCP port that records whether anything connected (a PostgreSQL server stand-in)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)

    def connected() -> bool:
        try:
            sock.accept()[0].close()
        except BlockingIOError:
            return False
        return True

    try:
        yield sock.getsockname()[1], connected
    finally:
        sock.close()


def test_verify_never_opens_a_network_source_named_in_an_altered_bundle(
    bundle, listener, monkeypatch
):
    port, connected = listener
    monkeypatch.setenv("DSTACK_TOKEN", TOKEN)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with FakeDstack() as server:
        for source in (
            server.url,
            f"postgresql://dstack@127.0.0.1:{port}/dstack",
            f"postgres+psycopg://dstack@127.0.0.1:{port}/dstack",
            "dstack:main",
            "s3://evidence-bucket/dataset",
        ):
            altered(bundle, sources=[source], given_sources=[source])
            result = CliRunner().invoke(main, ["verify", str(bundle)])
            line = one_line_error(result)
            assert "names a source it cannot hold" in line, line
            assert "`verify` reads only local files, never a network source" in line, line
            assert TOKEN not in result.output and PASSWORD not in result.output
        assert server.requests == []
    assert not connected()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("-", "is standard input"),
        ("/dev/stdin", "which is no file or folder"),  # not in the issue: stdin by its path
        ("/dev/zero", "which is no file or folder"),  # not in the issue: a device read for ever
        ("/etc/passwd", "which is none of the inputs it recorded"),
        ("../../../../../../../../etc", "which is none of the inputs it recorded"),
        ("evidence/../../../../../../../../etc/passwd", "which is none of the inputs it recorded"),
    ],
)
def test_verify_reads_only_the_bundle_and_its_recorded_inputs(bundle, source, expected):
    altered(bundle, given_sources=[source], sources=[source])
    result = CliRunner().invoke(main, ["verify", str(bundle)], input="audit me\n")
    line = one_line_error(result)
    assert expected in line and "an altered bundle?" in line
    assert "root:" not in result.output


def test_a_bundle_never_names_a_network_source_or_stdin(tmp_path, listener):
    port, connected = listener
    runner = CliRunner()
    for source, hint in (
        (f"postgresql://dstack:{PASSWORD}@127.0.0.1:{port}/dstack", "ingest it first"),
        ("-", "save it to a file"),
    ):
        result = runner.invoke(main, ["audit", source, "--bundle", str(tmp_path / "b")])
        line = one_line_error(result)
        assert "`verify` reads only local files" in line and hint in line
        assert PASSWORD not in result.output
    assert not connected() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "name",
    # an AWS key id; a Stripe key, whose gitleaks rule wants a quote or a space after it
    ["AKIAIOSFODNN7EXAMPLE", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"],
)
def test_verbose_never_prints_secret_shaped_file_names(tmp_path, name):
    folder = tmp_path / "evidence"
    folder.mkdir()
    shutil.copyfile(SEED / "server.db", folder / f"{name}.db")
    result = CliRunner().invoke(main, ["audit", "-v", str(folder)])
    assert result.exit_code in (0, 1), result.output
    assert "dstack-audit: read " in result.output and name not in result.output


def test_verbose_never_prints_a_postgresql_password(listener):
    """The password never shows in any form, also on the -v lines (the reader's own lines:
    the URL as shown, never as given); with a server, tests/test_postgres.py checks the read."""
    port, _ = listener
    url = f"postgresql://dstack:{PASSWORD}@127.0.0.1:{port}/dstack?connect_timeout=1"
    result = CliRunner().invoke(main, ["audit", "-v", url])
    assert result.exit_code == 2
    assert PASSWORD not in result.output and "Tr0ub4dor" not in result.output


def echoing(request) -> None:
    """A server that puts the token it was sent back into every answer it can."""
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    if request.path == "/api/projects/list":
        request.json([{"project_name": "main", "project_id": "p", "owner": {"token": token}}])
    elif request.path == "/api/runs/list":
        item = run(1) | {"run_spec": {"run_name": token}, "echo": token}
        request.json([] if request.body["prev_run_id"] else [item])
    elif request.path.endswith("/runs/get"):
        request.json(run(1) | {"run_spec": {"run_name": token}, "jobs": [], "note": token})
    else:
        request.json([{"id": "e1", "recorded_at": "2026-01-01T00:00:00+00:00", "message": token}])


def every_text(folder: Path) -> str:
    return "\n".join(
        f"{path.relative_to(folder)}\n{path.read_text(errors='replace')}"
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    )


def test_a_server_that_echoes_the_token_never_gets_it_into_an_output(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTACK_TOKEN", TOKEN)
    answers = {p: echoing for p in ("/api/projects/list", "/api/runs/list", "/api/events/list")}
    answers["/api/project/main/runs/get"] = echoing
    for listed in ("/api/fleets/list", "/api/instances/list"):  # no fleet: nothing to echo
        answers[listed] = lambda request: request.json([])
    runner = CliRunner()
    with FakeDstack(answers) as server:
        target = tmp_path / "c"
        collected = runner.invoke(main, ["collect", server.url, "--to", str(target)])
        assert collected.exit_code == 0, collected.output
        live = runner.invoke(main, ["audit", server.url, "--format", "json"])
    assert "the server put the token back in its answers" in collected.output
    manifest = json.loads((target / "manifest.json").read_text())
    assert "/api/runs/list" in manifest["token_echoed"]
    offline = runner.invoke(main, ["audit", str(target), "--format", "json", "--all-runs"])
    verified = runner.invoke(main, ["verify", str(target)])
    assert verified.exit_code == 0, verified.output  # the pages as written, masked
    for text in (collected.output, live.output, offline.output, every_text(target)):
        assert TOKEN not in text


def test_a_redirect_never_takes_the_token_to_another_host(tmp_path, monkeypatch):
    """Not in the issue: a 307 to another server is not followed, so the other server never
    sees the Authorization header."""
    monkeypatch.setenv("DSTACK_TOKEN", TOKEN)
    with FakeDstack() as elsewhere:

        def redirect(request) -> None:
            request.raw(b"", 307, {"Location": elsewhere.url + request.path})

        with FakeDstack({"/api/projects/list": redirect}) as server:
            line = one_line_error(
                CliRunner().invoke(main, ["collect", server.url, "--to", str(tmp_path / "c")])
            )
    assert "POST /api/projects/list answered HTTP 307" in line
    assert elsewhere.requests == []


@pytest.mark.parametrize("where", ["environment", "configuration"])
def test_a_token_with_a_newline_never_shows_even_in_part(tmp_path, monkeypatch, where):
    head, tail = "5f0c3f6e-8d7a-4c1b", "9e2f-0a1b2c3d4e5f"
    token = f"{head}\n{tail}"
    home = tmp_path / "home"
    (home / ".dstack").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with FakeDstack() as server:
        if where == "environment":
            monkeypatch.setenv("DSTACK_TOKEN", token)
            source = server.url
        else:
            monkeypatch.delenv("DSTACK_TOKEN", raising=False)
            config = {"projects": [{"name": "main", "url": server.url, "token": token}]}
            (home / ".dstack" / "config.yml").write_text(json.dumps(config))
            source = "dstack:main"
        for args in (["audit", source], ["collect", source, "--to", str(tmp_path / "c")]):
            result = CliRunner().invoke(main, args)
            line = one_line_error(result)
            assert "the token has a line break at character 19" in line
            assert head not in result.output and tail not in result.output
            assert "5f0c" not in result.output and "4e5f" not in result.output
        assert all("authorization" not in {h.lower() for h in r.headers} for r in server.requests)
