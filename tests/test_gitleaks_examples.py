"""Every vendored gitleaks rule against gitleaks' own examples of it (issue 36): the literal
texts its rule must find (`tps`), and the secrets gitleaks generates for it from a regex
(`secrets.NewSecret`), generated here the same way (a seeded pick of each class's
characters) and written in gitleaks' own sample forms (utils.GenerateSampleSecret(s)).
tests/data/gitleaks-examples.json is read from gitleaks' sources by tests/gitleaks_examples.py.
"""

from __future__ import annotations

import json
import random
import re
import tomllib
from pathlib import Path

import pytest

from analyzer import redact
from analyzer.gitleaks import GITLEAKS_FILE, GITLEAKS_LEFT_OUT, GITLEAKS_VERSION
from analyzer.redact import Redactor

EXAMPLES = json.loads(
    (Path(__file__).parent / "data" / "gitleaks-examples.json").read_text(encoding="utf-8")
)
VENDORED = [
    rule["id"]
    for rule in tomllib.loads(GITLEAKS_FILE.read_text(encoding="utf-8"))["rules"]
    if rule["id"] not in GITLEAKS_LEFT_OUT
]
TESTED = [rule for rule in VENDORED if rule in EXAMPLES["rules"]]
# gitleaks' sample forms (cmd/generate/config/utils/generate.go): GenerateSampleSecret's, and
# GenerateSampleSecrets' YAML and escaped-newline ones
FORMS = ('{i}_api_token = "{s}"', "{i}_token: {s}", '{{"config.ini": "{I}_TOKEN={s}\\n"}}')
_ATOM = re.compile(r"(\[(?:\\.|[^\]\\])+\]|\\.|[^\\\[\]{}()|*+?])(?:\{(\d+)(?:,(\d*))?\}|([+*?]))?")


def _characters(atom: str) -> list[str]:
    """The characters a class (`[a-z0-9_-]`) or a single (escaped) character stands for."""
    if not atom.startswith("["):
        return [atom[-1]]
    body = re.sub(r"\\(.)", r"\1", atom[1:-1])
    out: list[str] = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            out += [chr(c) for c in range(ord(body[i]), ord(body[i + 2]) + 1)]
            i += 3
        else:
            out.append(body[i])
            i += 1
    return out


def generated(regex: str, rng: random.Random) -> str | None:
    """A text the regex matches, for the plain ones gitleaks generates examples from (classes
    and characters, counted); None for any other."""
    out, place = [], 0
    while place < len(regex):
        atom = _ATOM.match(regex, place)
        if atom is None:
            return None
        low, high, sign = atom[2], atom[3], atom[4]
        count = int(high or low) if low else (8 if sign in ("+", "*") else 1)
        pool = _characters(atom[1])
        out += [rng.choice(pool) for _ in range(count)]
        place = atom.end()
    return "".join(out)


def test_the_examples_are_of_the_vendored_release():
    assert EXAMPLES["from"].startswith(f"gitleaks {GITLEAKS_VERSION} ")
    assert len(TESTED) > 0.9 * len(VENDORED), sorted(set(VENDORED) - set(TESTED))


def test_the_generator_makes_what_its_regex_matches():
    rng = random.Random(0)
    for regex in ("[a-z0-9=_\\-]{40}", "AKIA[A-Z2-7]{16}", "[0-9a-f]{8}-[0-9a-f]{4}", "x\\.y+"):
        text = generated(regex, rng)
        assert text is not None and re.fullmatch(regex, text), (regex, text)
    assert generated("(?:a|b){3}", rng) is None


def _joined(parts: list[list[str]], rng: random.Random) -> str | None:
    pieces = [text if kind == "text" else generated(text, rng) for kind, text in parts]
    return "".join(p for p in pieces if p is not None) if None not in pieces else None


@pytest.mark.parametrize("rule_id", TESTED)
def test_every_rule_masks_its_own_examples(rule_id):
    """Each example text (literal, or generated from gitleaks' parts): the rule itself finds
    it (the RE2 -> Python translation holds) and the secret it finds is gone from the masked
    text. Each generated sample secret: gone in each of gitleaks' forms, and the rule itself
    finds it in one of them."""
    rule = next(r for r in redact.rules() if r.id == rule_id)
    redactor = Redactor()
    examples = EXAMPLES["rules"][rule_id]
    rng = random.Random(rule_id)
    texts = examples["tps"] + [_joined(parts, rng) for parts in examples["generated"]]
    for text in filter(None, texts):
        match = rule.pattern.search(text)
        assert match is not None, (rule_id, text)
        group = rule.group
        if group is None:
            group = next((g for g in range(1, rule.pattern.groups + 1) if match[g]), 0)
        assert match[group] not in redactor.apply(text), (rule_id, text)
    for sample in examples["samples"]:
        secret, name = _joined(sample["secret"], rng), sample["identifier"]
        if secret is None:
            continue  # a regex this generator does not make (4 of gitleaks' at v8.30.1)
        forms = [form.format(i=name, I=name.upper(), s=secret) for form in FORMS]
        for text in forms:
            assert secret not in redactor.apply(text), (rule_id, text)
        assert any(rule.pattern.search(text) for text in forms), (rule_id, forms)
