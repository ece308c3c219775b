"""The report's verdict names as a plain tuple: the contract's `Verdict` is built from it, and the
CLI offers it as `--verdict` choices without importing pydantic at start-up (issue 15)."""

from __future__ import annotations

VERDICTS: tuple[str, ...] = (
    "collateral_termination",
    "same_deployment_collateral",
    "newer_deployment_collateral",
    "no_healthy_victim",
    "no_incident",
    "inconclusive",
)
