"""`dstack-audit guard`: the apply policy service dstack's `rest_plugin` calls (issue 25).

`register(main)` adds the command to the `dstack-audit` click group.
"""

from __future__ import annotations

import click

from analyzer.cli.options import clean_errors, token_option
from analyzer.errors import AuditInputError


def _check_server(url: str, token: str | None) -> str:
    """The server's version, once its token is known to work: a guard that cannot read the
    server would answer every apply `unknown`, so a wrong URL or token stops it at start."""
    from analyzer.sources.collect import Server, display_url

    label = display_url(url)
    if not token:
        raise AuditInputError(
            label, "no token was given", "set DSTACK_TOKEN (a dstack user token) or give --token"
        )
    server = Server(url, token)
    try:
        version, why = server.info()
        if version is None:
            raise AuditInputError(label, f"not a dstack server ({why})")
        server.call("/api/users/get_my_user", None)  # its answer holds the token: never shown
    finally:
        server.close()
    return version


SECRET_ENV = "DSTACK_AUDIT_GUARD_SECRET"
MIN_SECRET = 16


def _secret() -> str:
    """The secret callers must send (Basic auth password), from the environment only: a
    command line is visible to every user of the machine."""
    import os

    secret = os.environ.get(SECRET_ENV, "")
    if len(secret) < MIN_SECRET or not secret.isprintable() or ":" in secret:
        raise AuditInputError(
            "the environment",
            f"{SECRET_ENV} is unset, shorter than {MIN_SECRET} characters, or holds a colon",
            "generate one (openssl rand -hex 24), give it to the guard in this variable and to "
            "the dstack server in DSTACK_PLUGIN_SERVICE_URI (docs/guard.md, step 2)",
        )
    return secret


def _start(url: str, token: str, every: float):
    """The model, refreshed once now (a server it cannot read stops the guard at start), then
    in the background."""
    from analyzer.service.model import ServerModel

    model = ServerModel(url, token, every)
    try:
        model.refresh()
    except Exception as error:
        said = (str(error).splitlines() or [""])[0][:200]
        raise AuditInputError(url, f"cannot read the server's fleets and runs ({said})") from None
    model.start()
    return model


def _listen(host: str, port: int):
    from analyzer.service.http import listening

    try:
        return listening(host, port)
    except OSError as error:
        raise AuditInputError(
            f"--host {host} --port {port}", f"cannot listen ({error.strerror or error})"
        ) from None


def register(main: click.Group) -> None:
    @main.command(short_help="Refuse in dstack apply a rollout that would take a service down.")
    @click.option(
        "--server",
        "server_url",
        required=True,
        help="The dstack server whose applies are checked: its URL, or dstack:[PROJECT] for "
        "the dstack CLI's configured one.",
    )
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
    @click.option(
        "--port",
        default=8001,
        show_default=True,
        type=click.IntRange(0, 65535),
        help="Port to listen on (DSTACK_PLUGIN_SERVICE_URI points the server at it).",
    )
    @click.option(
        "--mode",
        type=click.Choice(["reject", "warn"]),
        default="reject",
        show_default=True,
        help="reject: refuse the apply with the reason; warn: approve it and log the reason.",
    )
    @click.option(
        "--on-unknown",
        type=click.Choice(["approve", "reject"]),
        default="approve",
        show_default=True,
        help="The answer when the guard cannot decide (it always logs why).",
    )
    @click.option(
        "--refresh",
        default=5.0,
        show_default=True,
        type=click.FloatRange(0.5, 3600),
        help="Seconds between two refreshes of the model of the server's fleets and runs.",
    )
    @click.option(
        "--max-age",
        default=60.0,
        show_default=True,
        type=click.FloatRange(1, 86400),
        help="A model older than this many seconds decides nothing (--on-unknown answers).",
    )
    @token_option
    @clean_errors
    def guard(
        server_url: str,
        host: str,
        port: int,
        mode: str,
        on_unknown: str,
        refresh: float,
        max_age: float,
        token: str | None,
    ) -> None:
        """Refuse, in `dstack apply` itself, the update of a running service that would start a
        replica with no room for it while a failure would stop its healthy replicas (#4186).

        \b
        Try it on a copy of a server's database (docs/guard.md says more):
          1. mkdir -p trial/data
             cp ~/.dstack/server/data/sqlite.db trial/data/
          2. trial/config.yml:  projects: []  (dstack 0.22.5 needs the key)
                                plugins: [rest_plugin]
          3. S=$(openssl rand -hex 24); export DSTACK_AUDIT_GUARD_SECRET=$S
          4. DSTACK_SERVER_DIR=trial \\
             DSTACK_SERVER_BACKGROUND_PROCESSING_DISABLED=1 \\
             DSTACK_PLUGIN_SERVICE_URI=http://dstack:$S@127.0.0.1:8001 \\
             dstack server --port 3001 &
          5. DSTACK_TOKEN=ADMIN_TOKEN dstack-audit guard --mode warn \\
             --server http://127.0.0.1:3001
        In production the URI points the real server at the guard.
        The token must read every project's runs and fleets (an admin's).
        Callers without the secret (Basic auth) get 401. GET /healthz is
        ready while the model is fresh; GET /metrics (with the secret) is
        Prometheus text. One JSON line per answer on stderr: time, user,
        project, run, decision, reason.

        Exit status: 130 on Ctrl-C, 2 unusable options or server.
        """
        from analyzer.redact import Redactor, without_controls
        from analyzer.sources.collect import display_url
        from analyzer.sources.live import target_of, use_token

        reset = use_token(token)
        try:
            target = target_of(server_url)
        finally:
            reset()
        redactor = Redactor()
        redactor.add({token, target.token})
        try:
            secret = _secret()
            redactor.add({secret})
            version = _check_server(target.url, target.token)
            model = _start(target.url, target.token or "", refresh)
            sock = _listen(host, port)
        except AuditInputError as error:  # the token masked even where a message quotes it
            raise AuditInputError(
                redactor.apply(error.source), redactor.apply(error.problem), error.hint
            ) from None
        from analyzer.service.http import Guard, Policy, raise_fd_limit, server

        raise_fd_limit()
        service = server(Guard(model, Policy(mode, on_unknown, max_age), secret, redactor), sock)
        where = f"http://{host}:{sock.getsockname()[1]}"
        click.echo(
            redactor.apply(
                without_controls(
                    f"dstack-audit guard: {where} checks applies for dstack {version} at "
                    f"{display_url(target.url)} (--mode {mode}, --on-unknown {on_unknown}, "
                    f"--max-age {max_age:g} s)"
                )
            ),
            err=True,
        )
        try:
            service.run(sockets=[sock])
        finally:
            model.stop()
            sock.close()
