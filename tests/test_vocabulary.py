"""The vocabulary is declared once (analyzer/vocabulary.py) and every use agrees with it: the
catalogue, the health ladder, the rules and the contract derive from it, `conform` rejects a
value outside it, and no code compares a vocabulary column with an undeclared string."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import polars as pl
import pytest

from analyzer import vocabulary as vocab
from analyzer.catalogue import EVENT_TEMPLATES, LOG_LINE_TEMPLATES
from analyzer.contract import Finding, RunVerdict
from analyzer.model import (
    EVENTS_SCHEMA,
    INSTANCES_SCHEMA,
    JOBS_SCHEMA,
    VOCABULARY_COLUMNS,
    conform,
)
from analyzer.pipeline.rules import CATEGORY_ORDER
from analyzer.pipeline.timeline import HEALTH_PROOFS, UNHEALTHY_PROOFS
from analyzer.sources.base import SourceData

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"

# Column -> its vocabulary, as the code names the column: pl.col("kind"), row["kind"].
COLUMNS = {
    **VOCABULARY_COLUMNS,
    "health_proof": vocab.HEALTH_PROOFS,
    "health": vocab.HEALTH_STATES,
    "verdict": vocab.VERDICTS,
    "category": vocab.CATEGORIES,
    "confidence": vocab.CONFIDENCES,
}
# Attribute access (finding.category) is read for the contract's fields only: `.kind` is also
# an input's kind (InputRecord), a different word.
ATTRIBUTES = {"verdict", "category", "confidence"}
# Modules that read the canonical frames (the log reader's own `kind` is a record kind).
SCANNED = [
    *sorted((PACKAGE / "pipeline").glob("*.py")),
    *sorted((PACKAGE / "render").rglob("*.py")),
    PACKAGE / "api.py",
    *sorted((PACKAGE / "sources" / "api").glob("*.py")),
    PACKAGE / "sources" / "attach.py",
    PACKAGE / "sources" / "dstack_tables.py",
    PACKAGE / "sources" / "logs" / "messages.py",
]


def _column(node: ast.AST) -> str | None:
    """The vocabulary column an expression reads, if any: pl.col("c"), x["c"], x.c, and
    method chains on them (pl.col("c").first())."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if isinstance(node.func.value, ast.Name) and node.func.attr == "col":
            args = node.args
            if args and isinstance(args[0], ast.Constant) and args[0].value in COLUMNS:
                return args[0].value
            return None
        node = node.func.value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value if node.slice.value in COLUMNS else None
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
        return node.attr
    return None


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for item in node.elts for s in _strings(item)]
    return []


def compared_values(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, column, value) of every string a vocabulary column is compared with."""
    found = []
    for node in ast.walk(tree):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            pairs = [(a, b) for a in sides for b in sides if a is not b]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "is_in"
            and node.args
        ):
            pairs = [(node.func.value, node.args[0])]
        for column_side, value_side in pairs:
            column = _column(column_side)
            if column is not None:
                found.extend((node.lineno, column, value) for value in _strings(value_side))
    return found


def test_the_scan_sees_comparisons():
    tree = ast.parse(
        'pl.col("kind") == "job_ready"\nrow["health"] in ("healthy", "nope")\n'
        'pl.col("time_basis").is_in(["db_utc"])\nf.category != "x"\ninput.kind == "sqlite"'
    )
    assert compared_values(tree) == [
        (1, "kind", "job_ready"),
        (2, "health", "healthy"),
        (2, "health", "nope"),
        (3, "time_basis", "db_utc"),
        (4, "category", "x"),
    ]


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_compared_string_is_in_its_vocabulary(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    wrong = [(line, c, v) for line, c, v in compared_values(tree) if v not in COLUMNS[c]]
    assert wrong == []


def test_the_scan_covers_the_rules_and_the_ladder():
    seen = {
        column for path in SCANNED for _, column, _ in compared_values(ast.parse(path.read_text()))
    }
    assert {"kind", "time_basis", "origin", "entity_type", "health", "deployment_basis"} <= seen


def test_catalogue_kinds_are_event_kinds():
    assert {t.kind for t in EVENT_TEMPLATES + LOG_LINE_TEMPLATES} <= set(vocab.EVENT_KINDS)


def test_health_proofs_are_worded_once_each():
    assert tuple(HEALTH_PROOFS) == vocab.HEALTHY_PROOFS
    assert tuple(UNHEALTHY_PROOFS) == vocab.UNHEALTHY_PROOFS


def test_rules_and_contract_use_the_declared_categories():
    assert CATEGORY_ORDER == vocab.CATEGORIES
    assert get_args(Finding.model_fields["category"].annotation) == vocab.CATEGORIES
    assert get_args(RunVerdict.model_fields["verdict"].annotation) == vocab.VERDICTS
    assert vocab.VERDICTS[: len(vocab.CATEGORIES)] == vocab.CATEGORIES


@pytest.mark.parametrize(
    ("schema", "column"),
    [(EVENTS_SCHEMA, c) for c in ("kind", "time_basis", "origin", "entity_type")]
    + [(JOBS_SCHEMA, "deployment_basis")],
)
def test_conform_rejects_a_value_outside_the_vocabulary(schema, column):
    good = VOCABULARY_COLUMNS[column][0]
    assert conform(pl.DataFrame({column: [good, None]}), schema).collect()[column].to_list() == [
        good,
        None,
    ]
    with pytest.raises(pl.exceptions.InvalidOperationError, match="typo_value"):
        conform(pl.DataFrame({column: [good, "typo_value"]}), schema).collect()


def test_a_frame_in_its_schema_already_is_kept_as_it_is_unless_it_has_a_vocabulary():
    instances = conform(pl.DataFrame({"instance_id": ["i-1"]}), INSTANCES_SCHEMA).collect()
    reordered = instances.select(reversed(instances.columns))
    events = conform(pl.DataFrame({"kind": ["job_status"]}), EVENTS_SCHEMA).collect()
    data = SourceData(instances=instances, events=events).conformed()
    assert data.instances is instances  # what every partition shares stays one frame
    assert data.events is not events  # its vocabulary is checked again
    assert SourceData(instances=reordered).conformed().instances.columns == instances.columns
    typo = events.with_columns(kind=pl.lit("typo_value"))
    with pytest.raises(pl.exceptions.InvalidOperationError, match="typo_value"):
        SourceData(events=typo).conformed()


def _limitation_codes(tree: ast.AST) -> list[str]:
    """Codes written as `code="..."` or as the first argument of a limitation helper."""
    codes = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        codes += [s for k in node.keywords if k.arg == "code" for s in _strings(k.value)]
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if name in ("Limitation", "LimitationRecord", "limit") and node.args:
            codes += _strings(node.args[0])
    return codes


def test_every_limitation_code_is_declared():
    codes = {
        code
        for path in PACKAGE.rglob("*.py")
        if path.name != "synth.py"
        for code in _limitation_codes(ast.parse(path.read_text()))
    }
    assert {"copy_taken_mid_cascade", "no_events_table", "missing_columns"} <= codes
    assert codes - set(vocab.LIMITATION_CODES) == set()


def assigned_values(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, column, value) of every pl.lit("...") inside an expression aliased to a
    vocabulary column: pl.when(...).then(pl.lit("db_utc")).alias("time_basis")."""
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "alias"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in COLUMNS
        ):
            continue
        column = node.args[0].value
        for sub in ast.walk(node.func.value):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "lit"
                and sub.args
            ):
                found.extend((node.lineno, column, value) for value in _strings(sub.args[0]))
    return found


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_assigned_string_is_in_its_vocabulary(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    wrong = [(line, c, v) for line, c, v in assigned_values(tree) if v not in COLUMNS[c]]
    assert wrong == []


def test_the_scan_sees_assignments():
    tree = ast.parse(
        'pl.when(x).then(pl.lit("db_utc")).otherwise(pl.lit("oops")).alias("time_basis")\n'
        'pl.lit("x").alias("message")'
    )
    assert sorted(assigned_values(tree)) == [(1, "time_basis", "db_utc"), (1, "time_basis", "oops")]
