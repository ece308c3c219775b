"""Cells that a spreadsheet cannot run: the one rule for every CSV the tool writes.

A cell starting with `=`, `+`, `-` or `@` (or a tab or carriage return before one) is a formula
to Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)`, `=cmd|' /C calc'!A0`): data (a run
name, a termination message) must never become one. Such a text cell is prefixed with `'`, which
a spreadsheet shows as text and drops from the value (OWASP's "CSV injection" advice). Numbers
stay numbers. Display text is cleaned by `analyzer.redact.without_controls`, applied last.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """`value` as a CSV cell that cannot act: a text starting a formula is prefixed with `'`."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
