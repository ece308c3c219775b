"""analyzer.catalogue: the messages understood and left aside are matched by one regex of all
their patterns, which must say of every message what each pattern says on its own."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyzer import catalogue

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _texts() -> pl.Series:
    """Every line of the bundled samples' server logs (real dstack output), and what follows
    each ": " in it (a logger's message, an entity line's body), stripped."""
    texts = set()
    for log in SAMPLES.glob("*/*/logs/*"):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split(": ")
            texts.update(": ".join(parts[i:]).strip() for i in range(len(parts)))
    return pl.Series("text", sorted(texts), dtype=pl.String)


@pytest.mark.parametrize("fold_tolerant", [False, True])
@pytest.mark.parametrize(
    ("templates", "irrelevant"),
    [
        (catalogue.EVENT_TEMPLATES, catalogue.KNOWN_IRRELEVANT),
        (catalogue.LOG_LINE_TEMPLATES, catalogue.LOG_LINE_IRRELEVANT),
    ],
    ids=["events", "log lines"],
)
def test_one_regex_of_the_irrelevant_patterns_says_what_each_says(
    templates, irrelevant, fold_tolerant
):
    prepare = catalogue.tolerant if fold_tolerant else str
    frame = pl.DataFrame([_texts()])
    text = pl.col("text")
    kinds = frame.select(
        catalogue.classify(text, templates, irrelevant, fold_tolerant=fold_tolerant)["kind"]
    ).to_series()
    unmatched = frame.select(
        catalogue.classify(text, templates, (), fold_tolerant=fold_tolerant)["kind"]
    ).to_series()
    each = frame.select(pl.any_horizontal(text.str.contains(prepare(p)) for p in irrelevant))
    expected = (unmatched == "unrecognised") & each.to_series()
    assert ((kinds == "other") == expected).all()
    assert expected.any()  # the samples' logs hold messages of these patterns
    assert (kinds == unmatched).sum() > 0  # and messages of the templates, or none of either
