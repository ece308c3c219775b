"""Errors the CLI turns into one line on stderr and exit code 2."""


class AuditInputError(Exception):
    """An input cannot be used: the message names the input and what is wrong with it."""

    def __init__(self, source: str, problem: str, hint: str | None = None) -> None:
        self.source = source
        self.problem = problem
        self.hint = hint
        text = f"{source}: {problem}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    def __reduce__(self):
        """Pickled by its parts, so an error raised on a Dask worker reaches the CLI intact."""
        return type(self), (self.source, self.problem, self.hint)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is (as Ctrl-C raises KeyboardInterrupt), so
    every `finally` runs: temporary folders and partial outputs are removed on the way out."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)
