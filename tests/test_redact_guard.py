"""The final output guard's shortcuts (analyzer.redact): a rendered output's chunk is looked at
only in its lines that may hold a rule's keyword, and known values are replaced only when a
regex says a text may hold one. Each shortcut must give what the whole pass gives."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analyzer import redact
from analyzer.redact import MASK, VALUE_PREFILTER, Redactor

EXAMPLES = json.loads(
    (Path(__file__).parent / "data" / "gitleaks-examples.json").read_text(encoding="utf-8")
)
REPORT_LINES = [
    "{",
    '  "key": "default",',
    '  "message": "Fleet is at capacity",',
    '  "disk_mib": 102400,',
    '  "sha256": "44a970f755ba2aac2d46b3990aba935b2cff05e5f7ae2f5eb796732291c3481d",',
    '  "provenance": ["events:3f2c", "jobs:api-server-0"],',
    "}",
]


def _secret_lines() -> list[str]:
    """gitleaks' own examples of its rules (one line each), as a report would quote them."""
    texts = [text for examples in EXAMPLES["rules"].values() for text in examples["tps"]]
    return [json.dumps(text)[1:-1] for text in texts]


def _chunks(lines: list[str], size: int) -> list[str]:
    """Report-like chunks: the ordinary lines with secret lines among them, `size` at a time."""
    mixed = [line for i, secret in enumerate(lines) for line in (REPORT_LINES[i % 7], secret)]
    return ["\n".join(mixed[i : i + size]) for i in range(0, len(mixed), size)]


@pytest.mark.parametrize("size", [3, 40, 400])
def test_keyword_lines_give_what_every_step_gives(size):
    """The same texts out of the shortcut as out of every step over whole texts, for chunks
    holding gitleaks' examples of every rule and for chunks of ordinary lines only, taken
    together and one by one (a chunk with a key block takes every step; the others do not)."""
    chunks = [*_chunks(_secret_lines(), size), "\n".join(REPORT_LINES * 50)]
    texts = pl.Series(chunks, dtype=pl.String)
    shortcut = redact._over_keyword_lines(texts)
    assert shortcut.to_list() == redact._every_step(texts).to_list()
    assert (shortcut != texts).sum() >= (len(chunks) - 1) / 2  # it masks most of them
    if size >= 40:
        order = redact.multi_line_order()
        spanning = [group for spans, groups in order if spans for group in groups]
        took = {False: 0, True: 0}
        for chunk in chunks:
            one = pl.Series([chunk])
            took[any(redact._may_span(one.str.split("\n").explode(), g) for g in spanning)] += 1
            assert redact._over_keyword_lines(one).to_list() == redact._every_step(one).to_list()
        assert took[False] and took[True]


def test_no_keyword_holds_the_mask():
    """The shortcut's premise: masking a line (`***`) never makes a keyword it did not hold."""
    keywords, _, always = redact._keyword_rules()
    assert not always
    assert not [keyword for keyword in keywords if "*" in keyword]


def test_a_chunk_without_keywords_is_returned_as_it_is():
    texts = pl.Series(["\n".join(['  "count": 3,', "}"] * 1000)])
    assert redact._over_keyword_lines(texts) is texts
    assert redact._may_hold_keywords(texts, None).to_list() == [False]
    lines = pl.Series(["token: x", "nothing"])
    assert redact._may_hold_keywords(lines, None).to_list() == [True, False]
    assert redact._may_hold_keywords(lines, frozenset()).to_list() == [False, False]  # no rule


@pytest.mark.parametrize("count", [1, VALUE_PREFILTER])
def test_known_values_are_masked_in_any_case(count):
    """With few values (looked for by a regex first) and with more forms than the regex takes
    (replaced at once), a value is masked in any ASCII case and JSON-escaped."""
    redactor = Redactor()
    values = [f"s3cr3t-{i:04d}-value" for i in range(count)]
    redactor.add([*values, 'pa"ss-word-9'])
    text = f'one {values[-1].upper()} two\n  "x": "PA\\"SS-word-9"\nnothing here'
    assert redactor.apply(text) == f'one {MASK} two\n  "x": "{MASK}"\nnothing here'
    assert redactor.apply("nothing here\nat all") == "nothing here\nat all"


@pytest.mark.parametrize("count", [0, 1, VALUE_PREFILTER])
def test_the_report_guard_sees_a_known_value_or_a_hidden_character(count):
    """Redactor.holds_known_or_hidden (one regex pass first): a known value in any case and
    JSON-escaped, an escaped control character; nothing in a text holding neither."""
    redactor = Redactor()
    values = [f"s3cr3t-{i:04d}-value" for i in range(count)]
    redactor.add(values)
    clean = json.dumps({"job_name": "web-0-1", "message": "Fleet is at capacity"})
    assert not redactor.holds_known_or_hidden(clean)
    assert redactor.holds_known_or_hidden(json.dumps({"job_name": "web\x1b[2J"}))
    assert redactor.holds_known_or_hidden(json.dumps({"m": "a\rb"}))
    if values:
        assert redactor.holds_known_or_hidden(json.dumps({"m": f"x {values[-1].upper()} y"}))


@pytest.mark.parametrize("count", [1, VALUE_PREFILTER])
def test_a_text_the_look_finds_clean_needs_only_the_shapes(count):
    """`holds_known_or_hidden(..., raw_forms=True)` false: the final pass over those very texts
    gives what `shapes_only` gives (the CLI then runs only that). A value as it is given,
    outside any string (a quote of it joins two JSON strings), is seen only with raw_forms."""
    redactor = Redactor()
    values = [f"s3cr3t-{i:04d}-value" for i in range(count)]
    redactor.add([*values, 'zone"'])
    texts = [
        json.dumps({"job_name": "web-0-1", "message": "Fleet is at capacity"}, indent=2),
        '{\n  "m": "aws key AKIAIOSFODNN7EXAMPLE in it"\n}\n',  # a shape: masked by both
        json.dumps({"zone": "web"}, indent=2),  # the value `zone"`, raw, across a string's end
        json.dumps({"m": f"x {values[-1].upper()} y"}, indent=2),
        json.dumps({"m": "a\u200bb"}, ensure_ascii=False),  # a hidden character, raw
        json.dumps({"m": "a\rb"}),
    ]
    clean = [not redactor.holds_known_or_hidden([text], raw_forms=True) for text in texts]
    assert clean == [True, True, False, False, False, False]
    assert not redactor.holds_known_or_hidden([texts[2]])  # as the guard alone looks
    final = [redactor.apply(redact.without_controls(text)) for text in texts]
    same = [redact.shapes_only(text) == passed for text, passed in zip(texts, final, strict=True)]
    assert same == [True, True, False, False, False, True]  # an escaped \r: the guard's walk
    assert MASK in redact.shapes_only(texts[1])
    pieces = ["{\n", '  "a": 1,\n', '  "b": 2\n', "}\n"]
    assert list(redact.chunked(pieces, 12)) == ["{\n" + '  "a": 1,\n', '  "b": 2\n' + "}\n"]
    assert list(redact.chunked(list(redact.chunked(pieces, 12)), 12)) == list(
        redact.chunked(pieces, 12)
    )
