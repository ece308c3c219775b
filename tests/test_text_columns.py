"""Where a secret can sit: every text column of the evidence is decided once
(analyzer.model.FREE_TEXT, CLOSED_TEXT), and a value of a closed column's shape holds no
secret shape (so evidence._redact may leave it as it is)."""

from __future__ import annotations

import re

import polars as pl
import pytest

from analyzer import model
from analyzer.pipeline.evidence import Evidence
from analyzer.redact import Redactor, _keyword_rules

TEXT = (pl.String, pl.List(pl.String))


def _text_columns() -> set[str]:
    empty = Evidence(runs=pl.DataFrame(), jobs=pl.DataFrame(), events=pl.DataFrame())
    schemas = [
        model.RUNS_SCHEMA,
        model.JOBS_SCHEMA,
        model.FLEETS_SCHEMA,
        model.INSTANCES_SCHEMA,
        model.EVENTS_SCHEMA,
        dict(empty.unparsed.schema),
    ]
    return {name for schema in schemas for name, dtype in schema.items() if dtype in TEXT}


def test_every_text_column_of_the_evidence_is_decided_once():
    columns = _text_columns()
    closed = set(model.CLOSED_TEXT)
    assert not closed & model.FREE_TEXT
    assert columns - closed - model.FREE_TEXT == set(), "decide: FREE_TEXT or CLOSED_TEXT"
    assert (closed | model.FREE_TEXT) - columns == set(), "no such column any more"


def _members(shape: str, keywords: list[str]) -> list[str]:
    """Texts of `shape` holding a keyword at every place it fits, filled with the characters
    a rule's regex could want around it (hex digits, both cases of letters)."""
    fits = re.compile(f"(?:{shape})").fullmatch
    templates = [
        "00000000-0000-0000-0000-000000000000",
        "0" * 32,
        "0" * 6,
        "2026-11-02 09:09:20.483000+00:00",
        "2026-11-02T09:09:20Z",
        "09:09:20,483",
    ]
    templates += [f"{table}:{t}" for table in ("runs", "jobs", "events") for t in templates[:2]]
    filled = {re.sub(r"[0-9a-f]", fill, t) for t in templates for fill in "0aAfF9"}
    found = []
    for template in filter(fits, filled):
        for form in {form for keyword in keywords for form in (keyword, keyword.upper())}:
            for at in range(len(template) - len(form) + 1):
                text = template[:at] + form + template[at + len(form) :]
                if fits(text):
                    found.append(text)
    return found


@pytest.mark.parametrize("shape", sorted(set(model.CLOSED_TEXT.values())))
def test_no_secret_shape_fits_a_value_of_a_closed_shape(shape):
    keywords, _, always = _keyword_rules()
    assert always == [], "a rule without keywords could fire on any closed value"
    members = _members(shape, keywords)
    if shape == model.ID_TEXT:  # an id can hold some rules' keywords (`4b1d`, `eaaa`, `acca`)
        assert any("4b1d" in text for text in members)
    masked = Redactor().apply_series(pl.Series(members, dtype=pl.String))
    assert masked.to_list() == members


def test_a_closed_column_masks_what_has_not_its_shape():
    secret = "ghp_" + "a1B2c3D4e5" * 3 + "a1B2c3"
    redactor = Redactor()
    redactor.add(["db-password-value-1"])
    uuid = "6e42c918-0000-4000-8000-000000000001"
    events = pl.DataFrame(
        {
            "entity_id": [uuid, secret, "db-password-value-1"],
            "message": ["ok", f"token {secret}", "db-password-value-1"],
            "provenance": [[f"events:{uuid}"], [f"/logs/{secret}.log:3"], ["jobs:x"]],
        }
    )
    (masked,) = redactor.apply_frames([events], model.CLOSED_TEXT)
    assert masked["entity_id"].to_list() == [uuid, "***", "***"]
    assert masked["message"].to_list() == ["ok", "token ***", "***"]
    assert masked["provenance"].to_list() == [[f"events:{uuid}"], ["/logs/***.log:3"], ["jobs:x"]]
    assert secret not in str(masked.rows())
