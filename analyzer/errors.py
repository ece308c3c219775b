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


# errno's ENOSPC and EDQUOT on Linux, and their texts (polars words them "(os error 28)" in an
# OSError of no errno, or only "No space left on device" in a parquet writer's ComputeError)
NO_SPACE = "no space left on device"
_FULL = {28: NO_SPACE, 122: "disk quota exceeded"}


def out_of_room(error: BaseException) -> str | None:
    """How `error` says a disk (or a quota) is full, or None when it does not: an OSError of
    ENOSPC or EDQUOT from Python's own writes, polars' errors that say one in their text, or
    SQLite's SQLITE_FULL from a database written in a working folder. Not a bug of ours: the
    machine's, and the user can act on it."""
    said = str(error).lower()
    for code, words in _FULL.items():
        if getattr(error, "errno", None) == code or f"(os error {code})" in said or words in said:
            return words
    if getattr(error, "sqlite_errorname", None) == "SQLITE_FULL":
        return NO_SPACE
    return None
