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


def _listen(url: str, token: str | None, host: str, port: int, mode: str, on_unknown: str):
    from analyzer.guard import serve

    try:
        return serve(url, token or "", host, port, mode, on_unknown)
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
    @token_option
    @clean_errors
    def guard(
        server_url: str, host: str, port: int, mode: str, on_unknown: str, token: str | None
    ) -> None:
        """Refuse, in `dstack apply` itself, the update of a running service that would start a
        replica with no room for it while a failure would stop its healthy replicas (#4186).

        \b
        Turn it on in the dstack server:
          server/config.yml:   plugins: [rest_plugin]
          environment:         DSTACK_PLUGIN_SERVICE_URI=http://HOST:PORT
        The token must read every project's runs and fleets (an admin's).
        One JSON line per decision on stderr: time, user, project, run,
        decision, reason.

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
            version = _check_server(target.url, target.token)
            service = _listen(target.url, target.token, host, port, mode, on_unknown)
        except AuditInputError as error:  # the token masked even where a message quotes it
            raise AuditInputError(
                redactor.apply(error.source), redactor.apply(error.problem), error.hint
            ) from None
        where = f"http://{host}:{service.server_address[1]}"
        click.echo(
            redactor.apply(
                without_controls(
                    f"dstack-audit guard: {where} checks applies for dstack {version} at "
                    f"{display_url(target.url)} (--mode {mode}, --on-unknown {on_unknown})"
                )
            ),
            err=True,
        )
        try:
            service.serve_forever()
        finally:
            service.server_close()
