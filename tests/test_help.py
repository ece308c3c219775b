"""One set of --help conventions, over every command (issue 37): each says its usage and exit
status, every option says what it does, an option shared by several commands reads the same on
each, the inputs are SOURCE... everywhere, every command that reads them takes --token, every
command that draws a table takes --width."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from analyzer.cli import main

COMMANDS = sorted(main.commands)
# options that mean the same on every command that has them, so they must read the same
SHARED = (
    "--tz",
    "--token",
    "--width",
    "--log-tz",
    "--log-date",
    "--project",
    "--since",
    "--until",
    "--run",
    "--quiet",
    "--verbose",
    "--no-color",
)
# where a shared name means something else: synth writes logs in a zone, it does not read them;
# timeline and plot name one run's project, collect the project to collect
OTHER_MEANING = {("synth", "--log-tz"), ("timeline", "--project"), ("plot", "--project")}
OTHER_MEANING |= {("collect", "--project")}
SERVERS = {"guard"}  # a long-running server: its own log, no progress bars to quieten


def _options(name: str) -> dict[str, click.Option]:
    command = main.commands[name]
    return {
        max(p.opts, key=len): p
        for p in command.params
        if isinstance(p, click.Option) and p.name != "help"
    }


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_shows_its_usage_and_its_exit_status(name):
    result = CliRunner().invoke(
        main, [name, "--help"], prog_name="dstack-audit", terminal_width=100
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: dstack-audit {name} [OPTIONS]")
    assert "Exit status: " in result.output
    assert "SOURCES" not in result.output  # the inputs are SOURCE... everywhere
    short = main.commands[name].short_help
    assert short and short[0].isupper() and short.endswith("."), short


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_says_what_it_does(name):
    for flag, option in _options(name).items():
        assert option.help and option.help.rstrip().endswith("."), (name, flag, option.help)


def test_a_shared_option_reads_the_same_on_every_command():
    seen: dict[str, dict[str, str]] = {}
    for name in COMMANDS:
        for flag, option in _options(name).items():
            if flag in SHARED and (name, flag) not in OTHER_MEANING:
                seen.setdefault(flag, {})[name] = option.help
    for flag, helps in seen.items():
        assert len(set(helps.values())) == 1, (flag, helps)
    assert len(seen["--tz"]) >= 5 and len(seen["--token"]) >= 7


def test_inputs_are_named_alike_and_every_reader_takes_a_token():
    readers = []
    for name in COMMANDS:
        command = main.commands[name]
        ctx = click.Context(command, info_name=name)
        for argument in (p for p in command.params if isinstance(p, click.Argument)):
            metavar = argument.make_metavar(ctx) if _takes_ctx() else argument.make_metavar()
            assert metavar.strip("[].").replace(" ", "").isupper(), (name, metavar)
            if "SOURCE" in metavar:
                assert metavar.endswith("SOURCE..."), (name, metavar)
                readers.append(name)
    assert set(readers) == {"audit", "exposure", "ingest", "plot", "report", "timeline"}
    for name in readers:
        assert "--token" in _options(name), name


def _takes_ctx() -> bool:
    import inspect

    return "ctx" in inspect.signature(click.Argument.make_metavar).parameters


@pytest.mark.parametrize("name", COMMANDS)
def test_tables_take_a_width_and_every_command_its_ui_options(name):
    options = _options(name)
    fmt = options.get("--format")
    if fmt is not None and {"table", "text"} & set(fmt.type.choices):
        assert "--width" in options, name
    if name not in SERVERS:
        assert {"--quiet", "--verbose", "--no-color"} <= set(options), name


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "SRC", "--run", "nope"],
        ["report", "SRC", "-o", "OUT.html", "--run", "nope"],
        ["timeline", "nope", "SRC"],
        ["plot", "nope", "SRC", "-o", "OUT.png"],
    ],
    ids=lambda args: args[0],
)
def test_a_run_that_matches_nothing_is_the_same_error_everywhere(args, tmp_path):
    """A typo in --run (or RUN) is exit 2 naming it on every command, never an empty report."""
    from conftest import CAPTURES

    seed = str(CAPTURES / "v0.22.5" / "seed" / "server.db")
    args = [seed if a == "SRC" else a.replace("OUT", str(tmp_path / "out")) for a in args]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "dstack-audit: nope: no run with this name, project/name or id prefix in the given "
        "sources (dstack-audit audit SOURCE... --all-runs lists them)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_guards_missing_token_message_reads_whole(tmp_path):
    """The masker hides `--token VALUE`; the hint naming the option must not look like one."""
    result = CliRunner().invoke(
        main,
        ["guard", "--server", "http://127.0.0.1:9"],
        env={
            "DSTACK_TOKEN": None,
            "HOME": str(tmp_path),
            "DSTACK_AUDIT_GUARD_SECRET": "a-caller-secret-0123",  # checked first
        },
    )
    assert result.exit_code == 2, result.output
    assert "***" not in result.output
    assert result.output.rstrip().endswith(
        "(set DSTACK_TOKEN (a dstack user token) or give --token)"
    )
