"""The secret rules are compiled on first use, and every one of them compiles."""

from __future__ import annotations

import json
import re

from analyzer import redact
from analyzer.redact import MASK, Redactor


def test_every_rule_compiles():
    compiled = [rule.pattern for rule in redact.rules()]
    assert len(compiled) == len(redact.rules()) > 200
    assert all(isinstance(pattern, re.Pattern) for pattern in compiled)
    assert all(p.pattern == rule.source for p, rule in zip(compiled, redact.rules(), strict=True))


def test_the_stored_translation_is_the_vendored_files():
    """rules/gitleaks.python.json is gitleaks.toml translated as it is now (regenerate it with
    analyzer.gitleaks.write_translated_gitleaks() after changing either)."""
    stored = json.loads(redact.GITLEAKS_TRANSLATED.read_text(encoding="utf-8"))
    assert stored == redact.translate_gitleaks(redact.GITLEAKS_FILE.read_text(encoding="utf-8"))


def test_a_stale_translation_is_not_used(tmp_path, monkeypatch):
    stale = tmp_path / "gitleaks.python.json"
    stale.write_text(json.dumps({"from": "another toml", "rules": [["x", "x", [], None]]}))
    monkeypatch.setattr(redact, "GITLEAKS_TRANSLATED", stale)
    redact.rules.cache_clear()
    try:
        assert "x" not in [rule.id for rule in redact.rules()]
        assert len(redact.rules()) > 200
    finally:
        redact.rules.cache_clear()


def test_a_rule_is_compiled_only_when_a_text_holds_its_keyword():
    redact.rules.cache_clear()
    redact._keyword_rules.cache_clear()
    token = "ghp_" + "Pl4nt3dT0k3nW1thD1g1ts0123456789abcd"
    assert Redactor().apply(f"no secret here, only {token}") == f"no secret here, only {MASK}"
    compiled = [rule.id for rule in redact.rules() if "pattern" in vars(rule)]
    assert "github-pat" in compiled
    assert 0 < len(compiled) < len(redact.rules()) / 4
