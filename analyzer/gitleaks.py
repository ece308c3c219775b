"""gitleaks' rules (vendored verbatim in `rules/gitleaks.toml`) in Python's syntax.

gitleaks' regexes are RE2's: each is translated to Python's `re` once (`python_regex`), its end
widened (`value_ended`), and the translation stored in `rules/gitleaks.python.json` with a
fingerprint of what it was made from, so a process reads it instead of parsing the TOML
(analyzer.redact.rules). rules/README.md says how to update them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

GITLEAKS_FILE = Path(__file__).parent / "rules" / "gitleaks.toml"
# GITLEAKS_FILE's rules translated (translate_gitleaks); regenerate after changing either file:
# python -c "import analyzer.gitleaks as g; g.write_translated_gitleaks()"
GITLEAKS_TRANSLATED = GITLEAKS_FILE.with_name("gitleaks.python.json")
GITLEAKS_VERSION = "v8.30.1"  # tag; commit 83d9cd684c87d95d656c1458ef04895a7f1cbd8e, MIT
# gitleaks' catch-all: it needs an entropy score to stay quiet on ordinary `key: value` text;
# analyzer.redact's `name-value` masks every value of a secret-named field instead.
GITLEAKS_LEFT_OUT = ("generic-api-key",)


_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "digit": "0-9",
    "lower": "a-z",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
    "word": "0-9A-Za-z_",
    "space": r"\t\n\v\f\r ",
}


def python_regex(re2: str) -> str:
    """An RE2 (Go) regex as Python's `re` reads it. The differences gitleaks' rules use:
    `\\z` (Python: `\\Z`), POSIX classes such as `[[:alnum:]]`, and flags such as `(?i)` in the
    middle of a pattern, which RE2 applies up to the end of the enclosing group and Python
    refuses (they become scoped groups `(?i:...)`, closed and reopened around each `|`).
    `\\w \\d \\s \\b` are ASCII in RE2: the rules are compiled with `re.ASCII`."""
    out: list[str] = []
    scoped: list[list[str]] = [[]]  # per open group: the flag groups opened inside it
    i, n = 0, len(re2)
    while i < n:
        char = re2[i]
        if char == "\\":
            escape = re2[i : i + 2]
            out.append(r"\Z" if escape == r"\z" else escape)
            i += 2
        elif char == "[":
            end = i + 1 + (re2[i + 1 : i + 2] == "^")
            end += re2[end : end + 1] == "]"
            out.append(re2[i:end])
            while end < n and re2[end] != "]":
                posix = re.match(r"\[:(\w+):\]", re2[end:])
                if posix:
                    out.append(_POSIX_CLASSES[posix[1]])
                    end += posix.end()
                elif re2[end] == "\\":
                    out.append(re2[end : end + 2])
                    end += 2
                else:  # a literal [ inside a class is escaped (Python warns otherwise)
                    out.append("\\[" if re2[end] == "[" else re2[end])
                    end += 1
            out.append("]")
            i = end + 1
        elif char == "(":
            flags = re.match(r"\(\?([imsU-]+)\)", re2[i:])
            if flags and i > 0:
                out.append(f"(?{flags[1]}:")
                scoped[-1].append(flags[1])
                i += flags.end()
            else:
                out.append(char)
                scoped.append([])
                i += 1
        elif char == ")":
            out.append(")" * len(scoped.pop()) + ")")
            i += 1
        elif char == "|" and scoped[-1]:
            out.append(")" * len(scoped[-1]) + "|" + "".join(f"(?{f}:" for f in scoped[-1]))
            i += 1
        else:
            out.append(char)
            i += 1
    out.append(")" * len(scoped[-1]))
    return "".join(out)


# Where most gitleaks rules say a secret ends: a quote, a space, `;`, an escaped newline or the
# end. A secret followed by anything else (`(JWT)`, `token,`, `<b>TOKEN</b>`, a sentence's
# full stop, a file name's extension: `sk_live_....db`) went unmasked: the value ends, too, at
# any character that cannot continue it.
GITLEAKS_END = "(?:[\\x60'\"\\s;]|\\\\[nr]|$)"
VALUE_END = GITLEAKS_END[:-1] + r"|(?=[^\w.+/=~-])|(?=\.(?:\s|$))|(?=\.\w{1,8}(?:[^\w.]|$)))"


def gitleaks_fingerprint(toml_text: str) -> str:
    """What the translated rules were made from: the vendored file, the rules left out and
    how their ends are widened."""
    made_from = f"{toml_text}\n{GITLEAKS_LEFT_OUT!r}\n{VALUE_END}"
    return hashlib.sha256(made_from.encode()).hexdigest()


def value_ended(regex: str) -> str:
    """A translated gitleaks regex whose secret may end at any character that cannot continue
    it (``VALUE_END``), not only at gitleaks' few (``GITLEAKS_END``)."""
    if regex.endswith(GITLEAKS_END):
        return regex[: -len(GITLEAKS_END)] + VALUE_END
    return regex


def write_translated_gitleaks() -> None:
    translated = translate_gitleaks(GITLEAKS_FILE.read_text(encoding="utf-8"))
    rules = ",\n".join(json.dumps(rule) for rule in translated["rules"])
    text = f'{{"from": "{translated["from"]}",\n"rules": [\n{rules}\n]}}\n'
    GITLEAKS_TRANSLATED.write_text(text, encoding="utf-8")


def translate_gitleaks(toml_text: str) -> dict:
    """gitleaks' rules in Python's syntax (their ends widened, ``value_ended``), as
    ``rules/gitleaks.python.json`` stores them."""
    import tomllib

    config = tomllib.loads(toml_text)
    return {
        "from": gitleaks_fingerprint(toml_text),
        "rules": [
            [
                item["id"],
                value_ended(python_regex(item["regex"])),
                [k.lower() for k in item.get("keywords", ())],
                item.get("secretGroup"),
            ]
            for item in config["rules"]
            if "regex" in item and item["id"] not in GITLEAKS_LEFT_OUT
        ],
    }
