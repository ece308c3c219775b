"""The secret rules are compiled on first use, and every one of them compiles."""

from __future__ import annotations

import re

from analyzer import redact
from analyzer.redact import MASK, Redactor


def test_every_rule_compiles():
    compiled = [rule.pattern for rule in redact.rules()]
    assert len(compiled) == len(redact.rules()) > 200
    assert all(isinstance(pattern, re.Pattern) for pattern in compiled)
    assert all(p.pattern == rule.source for p, rule in zip(compiled, redact.rules(), strict=True))


def test_a_rule_is_compiled_only_when_a_text_holds_its_keyword():
    redact.rules.cache_clear()
    redact._keyword_rules.cache_clear()
    token = "ghp_" + "Pl4nt3dT0k3nW1thD1g1ts0123456789abcd"
    assert Redactor().apply(f"no secret here, only {token}") == f"no secret here, only {MASK}"
    compiled = [rule.id for rule in redact.rules() if "pattern" in vars(rule)]
    assert "github-pat" in compiled
    assert 0 < len(compiled) < len(redact.rules()) / 4
