"""The one place that knows what a secret looks like (reference section 3.11).

Two nets: the secret *values* the sources saw (user tokens, env values and registry auth in
run/job specs, private keys, the admin token printed at start-up, a database URL's password),
and secret *shapes* (private key blocks, URL passwords, "The admin token is ..." lines,
`Bearer` tokens, `enc:identity:noname:` payloads). Every output of the tool passes through
`Redactor.apply` last, so evidence text that contains a secret keeps its place with `***`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

MASK = "***"
MIN_SECRET_LENGTH = 4  # shorter values (e.g. "1", "true") would mask ordinary text

PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
            re.S,
        ),
        MASK,
    ),
    (re.compile(r"(The admin token is )\S+"), r"\1" + MASK),
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+(@)"), r"\1" + MASK + r"\2"),
    (re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1" + MASK),
    (re.compile(r"(enc:[a-z]+:[^:\s]+:)\S+"), r"\1" + MASK),
    (
        re.compile(
            r"""((?:password|passwd|secret|token|api[_-]?key)["']?\s*[:=]\s*["']?)[^\s"',;]+""",
            re.I,
        ),
        r"\1" + MASK,
    ),
)

# Literal words without which a pattern cannot match (checked first: scanning a large report
# with every pattern is what costs).
TRIGGERS: tuple[tuple[str, ...], ...] = (
    ("private key-----",),
    ("the admin token is",),
    ("://",),
    ("bearer",),
    ("enc:",),
    ("password", "passwd", "secret", "token", "api_key", "api-key", "apikey"),
)

# JSON paths (inside run_spec / job_spec_data) whose string values are secrets.
SECRET_JSON_OBJECTS = ("$.env", "$.configuration.env")
SECRET_JSON_SCALARS = (
    "$.registry_auth.password",
    "$.registry_auth.username",
    "$.configuration.registry_auth.password",
    "$.configuration.registry_auth.username",
    "$.ssh_key.private",
)
_JSON_STRING_VALUE = r'"(?:[^"\\]|\\.)*"\s*:\s*"((?:[^"\\]|\\.)*)"'


def json_secret_values(column: pl.Expr) -> list[pl.Expr]:
    """Expressions listing the secret strings inside a JSON text column, for Redactor.add."""
    values = [
        column.str.json_path_match(path)
        .str.extract_all(_JSON_STRING_VALUE)
        .list.eval(pl.element().str.extract(_JSON_STRING_VALUE, 1))
        .alias(f"o{i}")
        for i, path in enumerate(SECRET_JSON_OBJECTS)
    ]
    scalars = [
        column.str.json_path_match(path).alias(f"s{i}")
        for i, path in enumerate(SECRET_JSON_SCALARS)
    ]
    return values + scalars


@dataclass
class Redactor:
    values: set[str] = field(default_factory=set)

    def add(self, secrets: Iterable[str | None]) -> None:
        for secret in secrets:
            if secret is None:
                continue
            text = str(secret)
            if text.startswith("enc:identity:noname:"):
                self.values.add(text)
                text = text.removeprefix("enc:identity:noname:")
            if len(text) >= MIN_SECRET_LENGTH:
                self.values.add(text)

    def add_frame_values(self, frame: pl.DataFrame) -> None:
        """Every string in every column of `frame` (lists of strings included) is a secret."""
        for column in frame.columns:
            series = frame[column]
            if series.dtype == pl.List(pl.String):
                series = series.explode()
            for value in series.drop_nulls().unique().to_list():
                if isinstance(value, str):
                    self.add([_unescape_json(value)])
                    self.add([value])

    def apply(self, text: str) -> str:
        lowered = text.lower()
        for (pattern, replacement), triggers in zip(PATTERNS, TRIGGERS, strict=True):
            if any(trigger in lowered for trigger in triggers):
                text = pattern.sub(replacement, text)
        if self.values:
            text = pl.Series([text]).str.replace_many(*self._value_forms())[0]
        return text

    def _value_forms(self) -> tuple[list[str], list[str]]:
        """Every known value and its JSON-escaped form, longest first (Aho-Corasick in polars
        takes the first listed pattern at a position)."""
        forms = {form for value in self.values for form in (value, json.dumps(value)[1:-1])}
        ordered = sorted(forms, key=len, reverse=True)
        return ordered, [MASK] * len(ordered)

    def apply_expr(self, expr: pl.Expr) -> pl.Expr:
        """The same redaction as `apply`, in polars (for whole columns)."""
        for pattern, replacement in PATTERNS:
            flags = "(?s)" if pattern.flags & re.S else ""
            flags += "(?i)" if pattern.flags & re.I else ""
            expr = expr.str.replace_all(
                flags + pattern.pattern, replacement.replace("\\1", "${1}").replace("\\2", "${2}")
            )
        if self.values:
            expr = expr.str.replace_many(*self._value_forms())
        return expr


def _unescape_json(value: str) -> str:
    try:
        return json.loads(f'"{value}"')
    except ValueError:
        return value
