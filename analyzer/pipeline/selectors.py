"""Which run a person means: `web`, `acme/web` or an id prefix, in the CLI and the library alike."""

from __future__ import annotations

import polars as pl

from analyzer.errors import AuditInputError


def run_filter(selector: str) -> pl.Expr:
    """Runs named `selector`, or `project/name`, or whose id starts with it (ids are lowercase)."""
    text = selector.strip()
    by_id = pl.col("run_id").str.starts_with(text.lower())
    project, slash, name = text.rpartition("/")
    if slash:
        return ((pl.col("project") == project) & (pl.col("run_name") == name)) | by_id
    return (pl.col("run_name") == text) | by_id


NO_SUCH_RUN = "no run with this name, project/name or id prefix in the given sources"


def matched_something(runs: pl.DataFrame, project: str | None, run: str | None) -> None:
    """A --run that selects no run is a typo, not an all-clear: an AuditInputError naming it,
    on every command alike (`timeline` included). A --project with no run keeps its empty
    scope (an audit or a report of a project with no run yet)."""
    if runs.height or not run:
        return
    where = f" of project {project!r}" if project else ""
    raise AuditInputError(
        run, NO_SUCH_RUN + where, "dstack-audit audit SOURCE... --all-runs lists them"
    )


def _when(value) -> str:
    """A submission time as the tool prints times (UTC, Z), not Python's repr."""
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "?"


def one_run(runs: pl.DataFrame, selector: str) -> dict:
    """The one run `selector` names in `runs`; none or several is an AuditInputError."""
    found = runs.filter(run_filter(selector))
    exact = found.filter(pl.col("run_id") == selector.strip().lower())
    if exact.height == 1:
        found = exact
    if found.height == 0:
        raise AuditInputError(selector, NO_SUCH_RUN)
    if found.height > 1:
        listed = "; ".join(
            f"{r['project']}/{r['run_name']} id {r['run_id'][:8]} submitted "
            f"{_when(r['submitted_at'])}"
            for r in found.head(10).iter_rows(named=True)
        )
        more = f" and {found.height - 10} more" if found.height > 10 else ""
        raise AuditInputError(
            selector,
            f"{found.height} runs match: {listed}{more}",
            "give project/name or a longer id prefix",
        )
    return found.row(0, named=True)
