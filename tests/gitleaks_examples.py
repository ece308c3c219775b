"""gitleaks' own examples of each rule, as data: the literal strings of the `tps` (texts its
rule must find) and `fps` (texts it must not) in `cmd/generate/config/rules/*.go` of the
release whose `config/gitleaks.toml` is vendored in analyzer/rules/ (MIT, its licence beside
it). Examples gitleaks generates at random (`secrets.NewSecret(...)`) are no literal and are
left out. No Go code is copied: the strings are read with a small scanner of Go's literals.

Regenerate after updating the vendored rules, from a checkout of the same tag:
`python tests/gitleaks_examples.py CHECKOUT v8.30.1 > tests/data/gitleaks-examples.json`
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

_FUNCTION = re.compile(r"^func \w+\([^)]*\) \*config\.Rule \{", re.M)
_RULE_ID = re.compile(r'RuleID:\s*"([^"]+)"')
_STATEMENT = re.compile(r"^\s*(tps|fps)\s*:?=", re.M)
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _literal(text: str, start: int) -> tuple[str, int]:
    """The Go string literal at `start` (interpreted or raw) and the index after it."""
    quote = text[start]
    end = start + 1
    while text[end] != quote:
        end += 2 if quote == '"' and text[end] == "\\" else 1
    raw = text[start : end + 1]
    value = raw[1:-1] if quote == "`" else ast.literal_eval(raw)
    return value, end + 1


def _whole_literal(term: str) -> str | None:
    """The value of a term that is one string literal alone, else None."""
    if term[:1] in '"`' and _literal(term, 0)[1] == len(term):
        return _literal(term, 0)[0]
    return None


def _walk(text: str, start: int) -> Iterator[tuple[int, str, int, str | None]]:
    """(index, the step's source, bracket depth after it, a literal's value) from `start`: a
    string literal is one step, a comment none."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char in '"`':
            value, end = _literal(text, i)
            yield i, text[i:end], depth, value
            i = end
            continue
        if text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
            continue
        depth += (char in _OPENERS) - (char in ")]}")
        yield i, char, depth, None
        i += 1


def _statement_end(text: str, start: int) -> int:
    """Where the statement starting at `start` ends: a line break outside any bracket."""
    return next(
        (i for i, char, depth, _ in _walk(text, start) if char == "\n" and not depth), len(text)
    )


def _slice_elements(text: str) -> list[str]:
    """The source of each element of every `[]string{...}` in `text`, without comments."""
    found: list[str] = []
    for opening in re.finditer(r"\[\]string\{", text):
        element: list[str] = []
        for _, step, depth, _ in _walk(text, opening.end() - 1):
            if (step == "," and depth == 1) or depth == 0:
                found.append("".join(element).strip())
                element = []
                if depth == 0:
                    break
            elif depth >= 1 and not (step == "{" and depth == 1 and not element):
                element.append(step)
    return [element for element in found if element]


_PATTERNS = {  # cmd/generate/config/utils/patterns.go: the character classes examples use
    "Numeric": "[0-9]{%s}",
    "Hex": "[a-f0-9]{%s}",
    "AlphaNumeric": "[a-z0-9]{%s}",
    "AlphaNumericExtendedShort": "[a-z0-9_-]{%s}",
    "AlphaNumericExtended": "[a-z0-9=_\\-]{%s}",
    "AlphaNumericExtendedLong": "[a-z0-9\\/=_\\+\\-]{%s}",
}


def _arguments(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose `(` is at `start`."""
    args, begun = [], start + 1
    for i, char, depth, _ in _walk(text, start):
        if (char == "," and depth == 1) or depth == 0:
            args.append(text[begun:i].strip())
            begun = i + 1
            if depth == 0:
                break
    return [a for a in args if a]


def _terms(expression: str) -> list[str]:
    """The terms of a `+` concatenation at its top level."""
    terms, begun = [], 0
    for i, char, depth, _ in _walk(expression, 0):
        if char == "+" and depth == 0:
            terms.append(expression[begun:i].strip())
            begun = i + 1
    return [*terms, expression[begun:].strip()]


def _regex(expression: str) -> str | None:
    """The regex a `secrets.NewSecret` argument spells: literals and utils patterns."""
    out = []
    for term in _terms(expression):
        call = re.fullmatch(r'utils\.(\w+)\("(\d+)"\)', term)
        if (literal := _whole_literal(term)) is not None:
            out.append(literal)
        elif call and call[1] in _PATTERNS:
            out.append(_PATTERNS[call[1]] % call[2])
        elif term == "utils.Hex8_4_4_4_12()":
            out.append("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
        else:
            return None
    return "".join(out)


def _parts(expression: str) -> list[list[str]] | None:
    """A concatenation of literals and `secrets.NewSecret(regex)` as its parts (["text", s] or
    ["regex", r]); None for any other expression."""
    parts = []
    for term in _terms(expression):
        generated = re.fullmatch(r"secrets\.NewSecret\((.*)\)", term, re.S)
        if (literal := _whole_literal(term)) is not None:
            parts.append(["text", literal])
        elif generated and (regex := _regex(generated[1])) is not None:
            parts.append(["regex", regex])
        else:
            return None
    return parts


def _samples(text: str) -> list[dict]:
    """Each `utils.GenerateSampleSecrets(identifier, secret)` whose secret is `_parts`: the
    identifier and the secret's parts."""
    found = []
    for call in re.finditer(r"GenerateSampleSecrets\(", text):
        args = _arguments(text, call.end() - 1)
        if len(args) == 2 and _whole_literal(args[0]) and (parts := _parts(args[1])):
            found.append({"identifier": _whole_literal(args[0]), "secret": parts})
    return found


def examples(rules_folder: Path) -> dict[str, dict[str, list]]:
    """rule id -> {"tps", "fps": literal texts; "generated": texts as parts; "samples": an
    identifier and a secret as parts, for gitleaks' sample forms}."""
    out: dict[str, dict[str, list]] = {}
    for path in sorted(rules_folder.glob("*.go")):
        text = path.read_text(encoding="utf-8")
        starts = [m.start() for m in _FUNCTION.finditer(text)] + [len(text)]
        for start, end in itertools.pairwise(starts):
            body = text[start:end]
            rule = _RULE_ID.search(body)
            if rule is None:
                continue
            kinds: dict[str, list] = {"tps": [], "fps": [], "samples": [], "generated": []}
            for statement in _STATEMENT.finditer(body):
                span = body[statement.start() : _statement_end(body, statement.end())]
                for element in _slice_elements(span):
                    parts = _parts(element)
                    if parts and all(kind == "text" for kind, _ in parts):
                        kinds[statement[1]].append("".join(text for _, text in parts))
                    elif parts and statement[1] == "tps":
                        kinds["generated"].append(parts)
                if statement[1] == "tps":
                    kinds["samples"] += _samples(span)
            if any(kinds.values()):
                out[rule[1]] = kinds
    return out


if __name__ == "__main__":
    checkout, tag = Path(sys.argv[1]), sys.argv[2]
    found = examples(checkout / "cmd" / "generate" / "config" / "rules")
    document = {"from": f"gitleaks {tag} cmd/generate/config/rules/*.go", "rules": found}
    print(json.dumps(document, indent=1, ensure_ascii=False))
