"""The one place that knows what a secret looks like (reference section 3.11).

Two nets, cast over raw text before anything else touches it (templating, truncation,
hashing) and again over every rendered output:

- the secret *values* the sources saw (user tokens, env values and registry auth in run/job
  specs, private keys, the admin token printed at start-up, a database URL's password), masked
  wherever they occur, also JSON-escaped or with their digits templated to `N`;
- secret *shapes*: gitleaks' maintained rule set, vendored verbatim in `rules/gitleaks.toml`
  (cloud keys, forge, chat and model-hub tokens, JWTs, private key blocks, ~220 detectors),
  and the shapes of `PROJECT_RULES` that gitleaks leaves out or that dstack's evidence shows:
  key bodies without their BEGIN/END lines, `--token VALUE` arguments, `NAME=value` where
  NAME says key/token/secret/password/credential (a `NAME: value` of several words to its
  end), `NAME value` for upper-case names, `sshpass -p`/`mysql -pX`, URL passwords, `The admin
  token is ...`, and bare model, chat and registry keys whose gitleaks regexes ask for more.

A log's records are also masked as a run (sources/logs/masking.py): a key block from BEGIN to
END over several records, and a value on the record after its label.

A match keeps its place: only the secret (a rule's secret group) becomes `***`. gitleaks'
regexes are RE2's; they are translated to Python's `re` once (analyzer.gitleaks), and each
rule runs only over the texts holding one of its keywords (one Aho-Corasick pass in polars
picks them), so redaction stays a handful of C-level scans however many rules there are. A
rendered output's chunk is looked at only in its lines that may hold a keyword, and known
values are replaced only where a regex says a text may hold one (one regex pass each).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, AnyStr, TypeVar

import polars as pl

from analyzer.gitleaks import (
    GITLEAKS_FILE,
    GITLEAKS_TRANSLATED,
    GITLEAKS_VERSION,
    gitleaks_fingerprint,
    translate_gitleaks,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

Model = TypeVar("Model", bound="BaseModel")

MASK = "***"
MIN_SECRET_LENGTH = 4  # shorter values (e.g. "1", "true") would mask ordinary text

PROJECT_RULES_VERSION = 3  # bump when PROJECT_RULES change
RULE_SET = (
    f"gitleaks {GITLEAKS_VERSION} config/gitleaks.toml + dstack-audit {PROJECT_RULES_VERSION}"
)

# a bare `key` names ordinary entries (the report's own group rows): a key needs a qualifier;
# `pass` and `sig` only as a whole name or its last part (`db_pass`, `X-Amz-Signature`)
SECRET_NAME = (
    r"(?:[\w.-]*(?:token|secret|passw(?:or)?d|passphrase|pwd|credential|creds)[\w.-]*"
    r"|[\w.-]+key[\w.-]*|(?:[\w.-]*[_.-])?(?:pass|sig|signature))"
)
# A value as it stands after its name: quoted, the whole quoted text (spaces and all, also
# JSON-escaped quotes); bare, up to the next space or quote (`abc;tail` whole). A value that
# is `***` alone is masked already; one that only starts with it is not.
_VALUE = (
    r"(?:\"(?!\*\*\*\")((?:[^\"\\\n]|\\.)+)\""
    r"|'(?!\*\*\*')([^'\n]+)'"
    r"|\\\"(?!\*\*\*\\\")((?:[^\"\\\n]|\\[^\"\n])+)\\\""
    r"|[\"']?(?!\*\*\*(?:[\s\"'\\,;]|$))([^\s\"'\\]+))"
)
_NAME_END = r"(?:\\?[\"'])?[ \t]*(?:=|:)[ \t]*"

# (id, regex, keywords, secret group): dstack-audit's own shapes, in Python's syntax.
PROJECT_RULES: tuple[tuple[str, str, tuple[str, ...], int | None], ...] = (
    (
        "private-key-block",  # also a block cut before its END line
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        ("private key",),
        0,
    ),
    (
        "private-key-body",  # OpenSSH, PKCS#1/#8 (DER "MII..."), SEC1 EC bodies, no BEGIN line
        r"(?:b3BlbnNzaC1rZXktdjE|MII[A-Za-z0-9+/]{4}|MHcCAQEE|MIG[Hk]AgEA)[A-Za-z0-9+/=]*"
        r"(?:(?:\r?\n|\\r?\\n)[A-Za-z0-9+/=]+)*",
        ("b3blbnnzac1rzxktdje", "mii", "mhccaqee", "migh", "migk"),
        0,
    ),
    (
        "secret-argument",  # --token VALUE, --password=VALUE, -secret "VALUE"
        r"(?i)(?<![\w-])--?[\w-]*(?:token|passw(?:or)?d|secret|api[-_]?key|credential)s?"
        r"(?:=|[ \t]+)" + _VALUE,
        ("token", "passw", "secret", "key", "credential"),
        None,
    ),
    (
        "name-colon-words",  # token: abc def: a bare value of several words, to its end
        # (before name-value, which would mask its first word only; both refuse a line
        # break, so over a text of several lines they run in this order too)
        r"(?i)(?<![?&])\b" + SECRET_NAME + r"(?:\\?[\"'])?[ \t]*:[ \t]*"
        r"(?!\*\*\*(?:[\s\"'\\]|$))([^ \t\r\n\"'\\]+(?:[ \t]+[^\s\"'\\:=,;]+(?=[\s\"'\\,;]|$))+)",
        ("key", "token", "secret", "pass", "pwd", "credential", "creds", "sig"),
        1,
    ),
    (
        "name-value",  # AWS_SECRET_ACCESS_KEY=..., "token": "...", password: "a b c"
        r"(?i)(?<![?&])\b" + SECRET_NAME + _NAME_END + _VALUE,
        ("key", "token", "secret", "pass", "pwd", "credential", "creds", "sig"),
        None,
    ),
    (
        "url-query-secret",  # ?pass=, &sig= (Azure SAS), &X-Amz-Signature=, ?api_key=
        r"(?i)[?&;][\w.-]*(?:pass|pwd|token|secret|key|sig|auth|credential|session)[\w.-]*="
        r"(?!\*\*\*(?:[&\s#\"'\\]|$))([^&\s#\"'\\]+)",
        ("pass", "pwd", "token", "secret", "key", "sig", "auth", "credential", "session"),
        1,
    ),
    (
        "authorization-header",  # Authorization: Basic ..., Token ..., a scheme or none
        r"(?i)\b(?:proxy-)?authorization" + _NAME_END + r"(?:\\?[\"'])?(?:[a-z][\w-]*[ \t]+)?"
        r"(?!\*\*\*(?:[\s\"'\\]|$))([^\s\"'\\]+)",
        ("authorization",),
        1,
    ),
    (
        "basic-credentials",  # Basic dXNlcjpwYXNz without its header: base64 with a digit or +/
        r"(?<![\w-])Basic[ \t]+((?=[A-Za-z0-9+/]*[0-9+/])[A-Za-z0-9+/]{8,}={0,2})(?![\w+/=])",
        ("basic",),
        1,
    ),
    (
        "url-password",  # scheme://user:password@host, a raw / # ? @ in the password included
        r"://[^/\s:@\"'\\]*:(?!\d+(?:[/\s?#\"']|$))([^\s\"'\\<>]*)@",
        ("://",),
        1,
    ),
    ("admin-token-line", r"The admin token is (\S+)", ("the admin token is",), 1),
    ("bearer", r"(?i)\bBearer\s+(?!\*\*\*(?:[\s\"'\\]|$))([^\s\"'\\,;]+)", ("bearer",), 1),
    ("dstack-encrypted", r"enc:[a-z]+:[^:\s]+:([^\s\"'\\]+)", ("enc:",), 1),
    ("huggingface-token", r"\bhf_[A-Za-z0-9]{30,}", ("hf_",), 0),  # gitleaks': letters only
    # gitleaks' openai/anthropic rules need the keys' inner marks (`T3BlbkFJ`, `AA` at the
    # end): a key cut, templated or made up for an example has neither
    (
        "model-api-key",
        r"\bsk-(?:proj|svcacct|admin|ant-[a-z]{3,5}\d{2})-[A-Za-z0-9_-]{16,}|\bsk-[A-Za-z0-9]{40,}",
        ("sk-",),
        0,
    ),
    ("slack-token", r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}", ("xox",), 0),  # gitleaks': digits first
    ("docker-token", r"\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{8,}", ("dckr_",), 0),  # Docker Hub PAT
    # a JWT's header and payload are JSON objects: base64url of `{"` is `eyJ` (gitleaks' rule
    # asks for 17 characters after `ey`, which a short header or payload has not)
    ("jwt-short", r"\beyJ[A-Za-z0-9_-]{2,}\.eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*", ("eyj",), 0),
    (
        "name-space-value",  # AWS_SECRET_ACCESS_KEY value, as `aws configure set` and env dumps
        r"(?:(?:SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)"
        r"[A-Z0-9_]*|(?i:aws_secret_access_key|aws_session_token))[ \t]+"
        r"(?!\*\*\*(?:[\s\"'\\]|$))(?=[^\s\"'\\]*[0-9+/=_-])([^\s\"'\\]{6,})",
        ("secret", "token", "passw", "api_key", "access_key", "private_key", "credential"),
        1,
    ),
    (
        "password-option",  # sshpass -p X / -pX, mysql -pX (-p alone prompts: no secret)
        r"(?<![\w-])(?:sshpass(?:[ \t]+-[^\sp]\S*)*[ \t]+-p[ \t]*"
        r"|(?:mysql\w*|mariadb[\w-]*)\b[^\n|;&]*?[ \t]-p(?=[^\s]))" + _VALUE,
        ("sshpass", "mysql", "mariadb"),
        None,
    ),
)


# Keywords too common to select anything ("ey" is in "key", "s." in every dotted name,
# "token" in much of a report): the texts these rules run over are narrowed by a cheap regex
# first (in polars).
ROW_FILTERS = {
    "jwt": r"ey[a-zA-Z0-9]{17,}\.ey",
    "vault-service-token": r"hvs\.|s\.[a-zA-Z0-9]{24}",
    "octopus-deploy-api-key": r"API-[A-Z0-9]{26}",
    "twilio-api-key": r"SK[0-9a-fA-F]{32}",
    "azure-ad-client-secret": r"[0-9]Q~",
    "name-space-value": (
        r"(?:SECRET|TOKEN|PASSW|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)[A-Z0-9_]*[ \t]+\S"
        r"|(?i)aws_se(?:cret_access_key|ssion_token)[ \t]"
    ),
}


@dataclass(frozen=True)
class Rule:
    id: str
    source: str  # the Python regex (gitleaks' RE2 translated)
    keywords: tuple[str, ...]  # lowercase; a rule without keywords runs over every text
    group: int | None  # the secret's group; None: the first non-empty group (gitleaks' way)

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """Compiled on first use: most of the ~230 rules meet no text holding their keywords,
        and compiling them all costs a tenth of a second per process."""
        return re.compile(self.source, re.ASCII)

    @property
    def mentions_newline(self) -> bool:
        """Whether the regex names a newline at all, if only to refuse one (`[^"\\n]`): the
        rules a text of several lines meets first, over its whole text (``multi_line_order``)."""
        return any(mark in self.source for mark in _NEWLINE_MARKS)

    @property
    def spans_lines(self) -> bool:
        """Whether a match can hold a newline on purpose (a key block, a curl command): the
        regex names one outside a class that refuses it."""
        kept = _NEGATED_CLASS.sub("", self.source)
        return any(mark in kept for mark in _NEWLINE_MARKS)


_NEWLINE_MARKS = (r"\n", r"[\s\S", "(?s", r"\Z")
_NEGATED_CLASS = re.compile(r"\[\^(?:\\.|[^\]\\])*\]")


@cache
def rules() -> tuple[Rule, ...]:
    """The rule set: gitleaks' (translated) then the project's, each compiled on first use
    (tests/test_redact_rules.py compiles them all). The translation is read from
    ``GITLEAKS_TRANSLATED`` (parsing the TOML and translating costs 50 ms per process) when it
    was made from the vendored file as it is, else made here."""
    toml_text = GITLEAKS_FILE.read_text(encoding="utf-8")
    try:
        stored = json.loads(GITLEAKS_TRANSLATED.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    if stored.get("from") != gitleaks_fingerprint(toml_text):
        stored = translate_gitleaks(toml_text)
    loaded = [
        Rule(rule_id, regex, tuple(keywords), group)
        for rule_id, regex, keywords, group in stored["rules"]
    ]
    loaded += [
        Rule(rule_id, regex, keywords, group) for rule_id, regex, keywords, group in PROJECT_RULES
    ]
    return tuple(loaded)


def _masked(match: re.Match[str], group: int | None) -> str:
    if group is None:
        group = next((g for g in range(1, (match.re.groups or 0) + 1) if match.group(g)), 0)
    start, end = match.span(group)
    if start < 0 or start == end:
        return match.group(0)
    whole = match.start()
    text = match.group(0)
    return text[: start - whole] + MASK + text[end - whole :]


def _apply_rule(rule: Rule, text: str) -> str:
    return rule.pattern.sub(lambda match: _masked(match, rule.group), text)


@cache
def _keyword_rules() -> tuple[list[str], dict[str, list[int]], list[int]]:
    """Every keyword, the rules each one triggers, and the rules that have none."""
    triggered: dict[str, list[int]] = {}
    always = []
    for index, rule in enumerate(rules()):
        if not rule.keywords:
            always.append(index)
        for keyword in rule.keywords:
            triggered.setdefault(keyword, []).append(index)
    return sorted(triggered), triggered, always


@cache
def _keywords_of(only: frozenset[int] | None) -> tuple[list[str], dict[str, list[int]], list[int]]:
    """`_keyword_rules` of the rules `only` (all: None): a pass looks for their keywords
    alone (the rules that span lines run over whole texts, where other keywords abound)."""
    keywords, triggered, always = _keyword_rules()
    if only is None:
        return keywords, triggered, always
    mine = [k for k in keywords if any(i in only for i in triggered[k])]
    return mine, triggered, [i for i in always if i in only]


def redact_shapes(texts: pl.Series, *, dedupe: bool = True) -> pl.Series:
    """Every secret shape in a column of texts masked. Each distinct text is redacted once
    (`dedupe` false: the caller's texts are distinct already, or nearly).
    Rules that can span lines run over whole texts; every other rule runs over their lines (a
    long text costs what its lines holding a rule's keyword cost, not its length per rule)."""
    texts = texts.cast(pl.String)
    distinct = texts.drop_nulls().unique() if dedupe else texts.drop_nulls()
    if distinct.len() == 0:
        return texts
    if distinct.len() < texts.len():
        redacted = redact_shapes(distinct)
        changed = distinct != redacted
        if not changed.any():
            return texts
        return texts.replace(distinct.filter(changed), redacted.filter(changed))
    multi = texts.str.contains("\n", literal=True).fill_null(False)
    if not multi.any():
        return _run_rules(texts, None)
    if multi.all():  # a rendered output's chunk
        return _over_keyword_lines(texts).alias(texts.name)
    rows = multi.arg_true()
    joined = _over_keyword_lines(texts.gather(rows))
    single = _run_rules(texts.filter(~multi), None)
    return (
        pl.DataFrame({"text": texts})
        .with_row_index("row")
        .join(
            pl.concat(
                [
                    pl.DataFrame({"row": rows, "new": joined}),
                    pl.DataFrame({"row": (~multi).arg_true(), "new": single}),
                ]
            ),
            on="row",
            how="left",
            maintain_order="left",
        )["new"]
        .alias(texts.name)
    )


@cache
def multi_line_order() -> tuple[tuple[bool, tuple[frozenset[int], ...]], ...]:
    """The order the rules run in over a text of several lines, as steps (spans, rule sets):
    first every rule that names a newline, in their order, each over the whole text when it
    can span lines, else over its lines (as `name-value`, which only refuses newlines: over
    the lines holding its keywords, not a whole rendered report); then every other rule over
    the lines. Consecutive steps over lines share one split of the texts into lines."""
    first = [i for i, rule in enumerate(rules()) if rule.mentions_newline]
    runs = groupby(((rules()[i].spans_lines, i) for i in first), key=itemgetter(0))
    sets = [(spans, frozenset(i for _, i in run)) for spans, run in runs]
    sets.append((False, frozenset(range(len(rules()))) - frozenset(first)))
    return tuple(
        (spans, tuple(group for _, group in run)) for spans, run in groupby(sets, key=itemgetter(0))
    )


def _over_keyword_lines(texts: pl.Series) -> pl.Series:
    """Texts of several lines through ``multi_line_order``, looking only at the lines that
    may hold a keyword (one regex pass over every line: a rendered report's chunk holds few).
    When none of them holds a keyword of a rule that spans lines, each step over whole texts
    would change nothing, and each step over lines meets only these lines (a line changes
    only where a rule masks it, and `***` makes no keyword): the same result, from them
    alone. Else every step runs over the whole texts, in order."""
    steps = multi_line_order()
    lines = texts.str.split("\n")
    flat = lines.explode()
    held = _may_hold_keywords(flat, None)
    spanning = [group for spans, groups in steps if spans for group in groups]
    candidates = flat.filter(held) if held is not None else None
    if candidates is None or any(_may_span(candidates, group) for group in spanning):
        return _every_step(texts)
    given = candidates
    for group in (group for spans, groups in steps if not spans for group in groups):
        candidates = _per_distinct_line(candidates, group, narrow=False)
    if candidates is given:  # no line changed (most rendered text)
        return texts
    return _joined(lines, flat.scatter(held.arg_true(), candidates))


def _may_span(lines: pl.Series, group: frozenset[int]) -> bool:
    """Whether a rule of `group` (rules that span lines) may meet one of the `lines`."""
    held = _may_hold_keywords(lines, group)
    return held is None or bool(held.any())


def _every_step(texts: pl.Series) -> pl.Series:
    """Texts of several lines through every step of ``multi_line_order``, in order."""
    for spans, groups in multi_line_order():
        texts = _run_rules(texts, groups[0]) if spans else _over_lines(texts, groups)
    return texts


def _joined(lines: pl.Series, flat: pl.Series) -> pl.Series:
    """The texts split into `lines`, joined again from their lines `flat` (exploded)."""
    owner = pl.int_range(lines.len(), eager=True).repeat_by(lines.list.len())
    return (
        pl.DataFrame({"owner": owner.explode(), "line": flat})
        .group_by("owner", maintain_order=True)
        .agg(pl.col("line").str.join("\n"))["line"]
    )


def _over_lines(texts: pl.Series, groups: tuple[frozenset[int], ...]) -> pl.Series:
    """Each group of rules, one after the other, over every distinct line of the texts."""
    lines = texts.str.split("\n")
    flat = lines.explode()
    given = flat
    for group in groups:
        flat = _per_distinct_line(flat, group)
    if flat is given:  # no line changed (most rendered text): nothing to join again
        return texts
    return _joined(lines, flat)


def _per_distinct_line(lines: pl.Series, only: frozenset[int], *, narrow: bool = True) -> pl.Series:
    """The rules `only` over each distinct line once: a rendered report repeats most of its
    lines (closing brackets, the same fields and values). Only the lines that may hold one of
    their keywords are looked at (``_may_hold_keywords``; all of them without `narrow`, for
    lines that each hold some rule's keyword already: the rules' own search of their keywords
    narrows them as well, and a regex of this set of keywords is not built for them): their
    distinct ones in the same order as among all lines, so each rule meets the same texts in
    the same order."""
    held = _may_hold_keywords(lines, only) if narrow else None
    if held is not None and not held.any():
        return lines
    rows = held.arg_true() if held is not None else None
    candidates = lines.gather(rows) if rows is not None else lines
    distinct = candidates.unique(maintain_order=True)
    redacted = _run_rules(distinct, only)
    changed = distinct != redacted
    if not changed.any():
        return lines
    replaced = candidates.replace(distinct.filter(changed), redacted.filter(changed))
    return lines.clone().scatter(rows, replaced) if rows is not None else replaced


def _may_hold_keywords(texts: pl.Series, only: frozenset[int] | None) -> pl.Series | None:
    """Which texts may hold a keyword of the rules `only` (all: None), by one regex pass
    (several times cheaper than the Aho-Corasick pass that says which keywords): a text it
    leaves out holds none, as its Unicode case folding matches all the ASCII one does and
    more. None: some rule has no keyword, and every text may meet it."""
    keywords, _, always = _keywords_of(only)
    if always:
        return None
    if not keywords:
        return pl.repeat(False, texts.len(), dtype=pl.Boolean, eager=True)
    return texts.str.contains(_keyword_pattern(only)).fill_null(False)


@cache
def _keyword_pattern(only: frozenset[int] | None) -> str:
    return "(?i)" + "|".join(pl.escape_regex(keyword) for keyword in _keywords_of(only)[0])


def _run_rules(texts: pl.Series, only: frozenset[int] | None) -> pl.Series:
    """The rules (`only` those, or all) over the texts holding their keywords: one polars
    pass finds, per text, the keywords of those rules it holds; each rule then runs once over
    its texts joined by newlines (texts holding a newline themselves are run one by one).
    Only the texts some rule runs over travel into Python."""
    keywords, triggered, always = _keywords_of(only)
    wanted = (lambda i: i in only) if only is not None else (lambda i: True)
    found = (  # one query: the rows of each keyword found
        pl.LazyFrame({"text": texts if keywords else pl.Series([], dtype=pl.String)})
        .with_row_index("row")
        .select(
            "row",
            pl.col("text")
            .str.extract_many(keywords, ascii_case_insensitive=True, overlapping=True)
            .alias("keyword"),
        )
        .filter(pl.col("keyword").list.len() > 0)  # most texts hold no keyword
        .explode("keyword")
        .drop_nulls("keyword")
        .unique()
        .group_by("keyword")
        .agg("row")
        .collect()
    )
    rows_of_rule: dict[int, set[int]] = {}
    every_row = [index for index in always if wanted(index)]  # rules without a keyword
    if every_row:
        every = set(range(texts.len()))
        for index in every_row:
            rows_of_rule[index] = every
    for keyword, rows in found.iter_rows():
        for index in triggered[keyword.lower()]:
            if wanted(index):
                rows_of_rule.setdefault(index, set()).update(rows)
    if not rows_of_rule:
        return texts
    touched = sorted(set().union(*rows_of_rule.values()))
    values = dict(zip(touched, texts.gather(touched).to_list(), strict=True))
    for index in sorted(rows_of_rule):
        rule = rules()[index]
        rows = sorted(rows_of_rule[index])
        if rule.id in ROW_FILTERS:
            candidates = texts.gather(rows).str.contains(ROW_FILTERS[rule.id])
            rows = [r for r, keep in zip(rows, candidates, strict=True) if keep]
        rows = [r for r in rows if values[r] is not None]
        single = [r for r in rows if "\n" in values[r]]
        joined = [r for r in rows if "\n" not in values[r]]
        if joined:
            out = _apply_rule(rule, "\n".join(values[r] for r in joined)).split("\n")
            if len(out) != len(joined):  # a secret spanned texts: mask each text on its own
                out = [_apply_rule(rule, values[r]) for r in joined]
            for r, text in zip(joined, out, strict=True):
                values[r] = text
        for r in single:
            values[r] = _apply_rule(rule, values[r])
    return texts.clone().scatter(touched, [values[r] for r in touched])


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


def templated(value: str) -> str:
    """`value` as the notes of unrecognised log lines template it (ids -> <id>, numbers -> N;
    see sources/logs/messages.py), so a known value is recognised there too."""
    value = re.sub(r"[0-9a-f]{32}|[0-9a-f-]{36}", "<id>", value)
    return re.sub(r"\d+(\.\d+)?", "N", value)


@dataclass
class Redactor:
    values: set[str] = field(default_factory=set)
    _forms: tuple[frozenset[str], tuple[list[str], list[str]]] | None = field(
        default=None, repr=False, compare=False
    )

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
        texts = [
            _unshaped(frame.lazy(), name, dtype == pl.List(pl.String), None)
            for name, dtype in frame.schema.items()
            if dtype in (pl.String, pl.List(pl.String))
        ]
        if not texts:
            return
        for value in pl.concat(texts).drop_nulls().unique().collect()["text"].to_list():
            self.add([_unescape_json(value)])
            self.add([value])

    def apply(self, text: str) -> str:
        """`text` with every known value and every secret shape masked."""
        if text.isascii() and len(text.translate(_ASCII_HIDDEN)) == len(text):
            return self._masked(pl.Series([text]), dedupe=True)[0]  # nothing hidden in it
        return self.apply_series(pl.Series([text]))[0]

    def apply_series(self, texts: pl.Series, *, dedupe: bool = True) -> pl.Series:
        """The same as `apply`, over a whole column at once (`dedupe`: as in redact_shapes).
        A text holding hidden characters (``HIDDEN``) is matched also without them: when
        that finds more to mask, the text comes out cleaned and masked (else as it was)."""
        texts = texts.cast(pl.String)
        masked = self._masked(texts, dedupe=dedupe)
        hidden = texts.str.contains(HIDDEN).fill_null(False)
        if not hidden.any():
            return masked
        rows = hidden.arg_true()
        clean = texts.gather(rows).str.replace_all(HIDDEN, "")
        as_was = masked.gather(rows)
        found = pl.DataFrame(
            {
                "masked": self._masked(clean, dedupe=dedupe),
                "as_was": as_was,
                "as_was_clean": as_was.str.replace_all(HIDDEN, ""),
            }
        ).select(  # cleaned only where that masks more (a table's colours stay otherwise)
            pl.when(pl.col("masked") != pl.col("as_was_clean")).then("masked").otherwise("as_was")
        )
        return masked.scatter(rows, found.to_series())

    def _masked(self, texts: pl.Series, *, dedupe: bool) -> pl.Series:
        if self.values:
            everywhere, ordinary = self._value_forms()
            if everywhere and self._may_hold(texts, everywhere):
                texts = texts.str.replace_many(
                    everywhere, [MASK] * len(everywhere), ascii_case_insensitive=True
                )
            if ordinary:
                words = "|".join(ordinary)
                texts = texts.str.replace_all(
                    rf"(?i)^[ \t]*(?:{words})[ \t]*$", MASK
                ).str.replace_all(rf"(?i){_STANDS_BEFORE}(?:{words}){_STANDS_AFTER}", "${1}***${2}")
        return redact_shapes(texts, dedupe=dedupe)

    @staticmethod
    def _may_hold(texts: pl.Series, forms: list[str], also: str | None = None) -> bool:
        """Whether any text may hold one of the forms of known values (or match the regex
        `also`), by one regex pass: a fraction of the Aho-Corasick pass's cost, and most texts
        hold none. Its Unicode case folding matches all that the ASCII one does, so a text it
        leaves out holds none. Up to VALUE_PREFILTER forms (else: True): over a 47 MB report,
        160 forms cost 0.15 s (the replacement 0.22 s), 800 forms 0.6 s (0.26 s), and 4,000
        pass the regex's size limit."""
        if len(forms) > VALUE_PREFILTER:
            return True
        parts = [also] if also else []
        if forms:
            parts.append("(?i:" + "|".join(pl.escape_regex(form) for form in forms) + ")")
        return bool(parts) and bool(texts.str.contains("|".join(parts)).any())

    def apply_frame(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Every string column of `frame` (lists of strings too) redacted."""
        return self.apply_frames([frame])[0]

    def apply_frames(
        self, frames: list[pl.DataFrame], closed: Mapping[str, str] | None = None
    ) -> list[pl.DataFrame]:
        """Every string column of every frame (lists of strings too) redacted, each distinct
        text once over all of them: most columns repeat a few values (a server, a status),
        and a pass over a column costs about as much for one text as for thousands. A column
        `closed` names (analyzer.model.CLOSED_TEXT) keeps every value that has its shape (a
        regex): only its other values are redacted."""
        closed = closed or {}
        columns = [
            (index, name, dtype == pl.List(pl.String))
            for index, frame in enumerate(frames)
            for name, dtype in frame.schema.items()
            if dtype in (pl.String, pl.List(pl.String))
        ]
        if not columns:
            return frames
        texts = [
            _unshaped(frames[index].lazy(), name, is_list, closed.get(name))
            for index, name, is_list in columns
        ]
        distinct = pl.concat(texts).drop_nulls().unique().collect()["text"]
        redacted = self.apply_series(distinct, dedupe=False)
        changed = distinct != redacted
        if not changed.any():
            return frames
        old, new = distinct.filter(changed), redacted.filter(changed)
        # a closed column's own changed values: those without its shape (replacing a value
        # the column does not hold changes nothing in it)
        shapes = {name: closed[name] for _, name, _ in columns if name in closed}
        unshaped = pl.DataFrame({"old": old}).select(
            (~pl.col("old").str.contains(f"^(?:{shape})$")).alias(name)
            for name, shape in shapes.items()
        )
        updates: list[list[pl.Expr]] = [[] for _ in frames]
        for index, name, is_list in columns:
            olds, news = old, new
            if name in closed:  # only its values without the shape
                mine = unshaped[name]
                if not mine.any():
                    continue
                olds, news = old.filter(mine), new.filter(mine)
            updates[index].append(
                pl.col(name).list.eval(pl.element().replace(olds, news))
                if is_list
                else pl.col(name).replace(olds, news)
            )
        return [
            frame.with_columns(exprs) if exprs else frame
            for frame, exprs in zip(frames, updates, strict=True)
        ]

    def apply_data(self, data: object, *, controls: bool = False) -> object:
        """A JSON-like value (dicts, lists, strings) with every string redacted (and, with
        `controls`, its control characters removed), all strings in one column: the
        structure is never touched, only its texts."""
        strings: list[str] = []
        _collect(data, strings)
        if not strings:
            return data
        texts = pl.Series(strings, dtype=pl.String)
        if controls:  # cleaned first, then masked: a control inside a secret hides it
            texts = texts.str.replace_all(HIDDEN, "")
        texts = self.apply_series(texts)
        redacted = iter(texts.to_list())
        return _rebuild(data, redacted)

    def apply_model(self, model: Model, *, controls: bool = False) -> Model:
        """A pydantic model with every string in it redacted (dict keys too; and with
        `controls`, its control characters removed), as `apply_data` would redact its JSON
        (times and numbers are no text) but without the JSON round trip: each distinct string
        is redacted once, and only the models that hold a changed string are copied."""
        from pydantic import BaseModel

        strings: set[str] = set()
        _collect_strings(model, strings, BaseModel)
        if not strings:
            return model
        unique = list(strings)
        texts = pl.Series(unique, dtype=pl.String)
        if controls:  # cleaned first, then masked
            texts = texts.str.replace_all(HIDDEN, "")
        texts = self.apply_series(texts)
        changed = {old: new for old, new in zip(unique, texts.to_list(), strict=True) if old != new}
        return _replaced(model, changed, BaseModel) if changed else model

    def guard_model(self, model: Model, dumped: str | Sequence[str] | None = None) -> Model:
        """A model built from texts masked at the source (``apply_frames``), as `apply_model`
        with `controls` gives it, at the cost of one look at its JSON (`dumped`: that JSON,
        when it was written earlier, whole or in consecutive whole lines): the model itself
        when that JSON holds no known value and no hidden character (nothing for the walk to
        do that the source did not), else the walk. Known values are looked for because a text
        built from several masked ones (a name and a message joined) can hold one again, and
        hidden characters because the frames keep them (only a secret they hid is cleaned
        there). Secret shapes are not looked for: every text the model is built from was
        masked at the source, and every rendered output passes the whole rule set again."""
        if self.holds_known_or_hidden(model.model_dump_json() if dumped is None else dumped):
            return self.apply_model(model, controls=True)
        return model

    def holds_known_or_hidden(
        self, json_text: str | Sequence[str], *, raw_forms: bool = False
    ) -> bool:
        """Whether a JSON text (or its consecutive whole lines: no form of a value holds a
        line break, JSON escapes it) holds, inside its strings, a hidden character or any
        form of a known value (as JSON writes them: escaped; any case). Anything that could be
        one counts (a word that only looks like an ordinary value, an escaped backslash before
        an `r`): then the walk decides. With `raw_forms`, each form as it is given counts too,
        wherever it stands: false then, the final pass over these very texts finds no known
        value either (`apply` is `shapes_only` over them)."""
        pieces = [json_text] if isinstance(json_text, str) else json_text
        text = pl.Series(pieces, dtype=pl.String)
        # JSON escapes every C0 control: in an ASCII text, only DEL can stand raw
        if all(piece.isascii() for piece in pieces):
            raw = any("\x7f" in piece for piece in pieces)
        else:
            raw = bool(text.str.contains(HIDDEN).any())
        if raw:
            return True
        everywhere, ordinary = self._value_forms() if self.values else ([], [])
        escaped = list(dict.fromkeys(json.dumps(f, ensure_ascii=False)[1:-1] for f in everywhere))
        if raw_forms:
            escaped = list(dict.fromkeys([*everywhere, *escaped]))
        # one regex pass says when neither can be there (most reports): each is looked for
        # exactly only when it may be
        if self._may_hold(text, escaped, also=_HIDDEN_ESCAPED):
            if text.str.contains(_HIDDEN_ESCAPED).any():
                return True
            if escaped and text.str.contains_any(escaped, ascii_case_insensitive=True).any():
                return True
        return bool(ordinary) and text.str.contains(rf"(?i){'|'.join(ordinary)}").any()

    def _value_forms(self) -> tuple[list[str], list[str]]:
        """The forms each known value is matched in: those masked wherever they occur, longest
        first (Aho-Corasick in polars takes the first listed pattern at a position), and the
        ordinary words among them, as regexes masked only where they stand as a value."""
        key = frozenset(self.values)
        if self._forms is None or self._forms[0] != key:
            self._forms = (key, value_forms(self.values))
        return self._forms[1]


def _unshaped(frame: pl.LazyFrame, name: str, is_list: bool, shape: str | None) -> pl.LazyFrame:
    """The texts (`text`) of a column that do not have its closed `shape` (all of them
    without one)."""
    texts = frame.select((pl.col(name).explode() if is_list else pl.col(name)).alias("text"))
    if shape is None:
        return texts
    return texts.filter(~pl.col("text").str.contains(f"^(?:{shape})$").fill_null(False))


def ordinary_word(value: str) -> bool:
    """Whether a known value is an ordinary word (`debug`, `robot`, `/data/models`, `8000`),
    short and not random: masked where it stands as a value, never inside a file name, a
    path, a run name or prose (a run `degraded-old-debug` is no secret)."""
    return len(value) < ORDINARY_LENGTH and _ORDINARY.fullmatch(value) is not None


VALUE_PREFILTER = 200  # up to this many known values' forms are looked for by a regex first
ORDINARY_LENGTH = 16  # a value this long is masked wherever it occurs, whatever it looks like
_ORDINARY = re.compile(r"/?[A-Za-z]+(?:[-_. /:][A-Za-z]+)*/?|\d+")
# where an ordinary word stands as a value: `NAME=word`, `NAME="word"`, `"NAME": "word"` (JSON,
# escaped too), up to the end of the value (polars regex: the two groups are kept)
_STANDS_BEFORE = r"(=[ \t]*\\?[\"']?|:[ \t]*\\?[\"'])"
_STANDS_AFTER = r"(\\?[\"']|[\s,;&)}\]]|$)"


def value_forms(values: Iterable[str]) -> tuple[list[str], list[str]]:
    """See ``Redactor._value_forms``. A value is matched as given, without its hidden
    characters, JSON-escaped, templated as log notes template it, URL-encoded and in base64
    (standard and URL-safe, unpadded: `user:pass` of a registry's auth travels so); case is
    ignored in every form."""
    import base64
    from urllib.parse import quote, quote_plus

    forms: set[str] = set()
    words: set[str] = set()
    for given in values:
        clean = _CONTROLS.sub("", given)
        for value in {given, clean}:
            if len(value) < MIN_SECRET_LENGTH:
                continue
            if ordinary_word(value):
                words.add(re.sub(r"[^A-Za-z0-9_]", lambda m: f"[{m[0]}]", value))
                continue
            forms |= {value, json.dumps(value)[1:-1], quote(value, safe=""), quote_plus(value)}
            forms.add(quote(value))
            encoded = value.encode()
            forms |= {
                base64.b64encode(encoded).decode().rstrip("="),
                base64.urlsafe_b64encode(encoded).decode().rstrip("="),
            }
            form = templated(value)
            if len(re.sub(r"N|<id>", "", form)) >= MIN_SECRET_LENGTH:
                forms.add(form)
    ordered = sorted((f for f in forms if len(f) >= MIN_SECRET_LENGTH), key=len, reverse=True)
    return ordered, sorted(words, key=len, reverse=True)


def _collect(data: object, strings: list[str]) -> None:
    if isinstance(data, str):
        strings.append(data)
    elif isinstance(data, dict):
        for key, value in data.items():
            _collect(key, strings)
            _collect(value, strings)
    elif isinstance(data, list | tuple):
        for value in data:
            _collect(value, strings)


def _rebuild(data: object, redacted: Iterator[str]) -> object:
    if isinstance(data, str):
        return next(redacted)
    if isinstance(data, dict):
        return {_rebuild(key, redacted): _rebuild(value, redacted) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_rebuild(value, redacted) for value in data]
    return data


def _collect_strings(value: object, strings: set[str], model: type) -> None:
    if isinstance(value, str):
        strings.add(value)
    elif isinstance(value, model):
        for item in value.__dict__.values():
            _collect_strings(item, strings, model)
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect_strings(key, strings, model)
            _collect_strings(item, strings, model)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect_strings(item, strings, model)


def _replaced(value: object, changed: dict[str, str], model: type) -> object:
    """`value` with the `changed` strings replaced; the same object where nothing changed."""
    if isinstance(value, str):
        return changed.get(value, value)
    if isinstance(value, model):
        updates = {}
        for name, item in value.__dict__.items():
            new = _replaced(item, changed, model)
            if new is not item:
                updates[name] = new
        return value.model_copy(update=updates) if updates else value
    if isinstance(value, dict):
        pairs = [
            (_replaced(key, changed, model), _replaced(item, changed, model))
            for key, item in value.items()
        ]
        same = zip(pairs, value.items(), strict=True)
        if all(k is key and v is item for (k, v), (key, item) in same):
            return value
        return dict(pairs)
    if isinstance(value, list | tuple):
        items = [_replaced(item, changed, model) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    return value


# Characters that hide in text: C0 controls but tab and newline, DEL and C1 controls (a
# terminal acts on them: ESC sequences move the cursor or retitle the window, BEL rings; XML
# 1.0 forbids them in an SVG), and the invisible format characters: soft hyphen, zero-width
# spaces and joiners, bidi marks, embeddings, overrides and isolates (U+202E shows the text
# after it reversed), word joiners, the BOM, tag characters. Any of them inside a secret also
# hides it from every rule and known value: texts are matched with them removed.
_HIDDEN_RANGES = (
    (0x00, 0x08),
    (0x0B, 0x1F),
    (0x7F, 0x9F),
    (0xAD, 0xAD),
    (0x061C, 0x061C),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xE0000, 0xE007F),
)
_CONTROLS = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _HIDDEN_RANGES) + "]")
HIDDEN = "[" + "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in _HIDDEN_RANGES) + "]"  # polars
# the hidden characters JSON writes escaped: C0 controls but tab and newline (\u001b, \r, \b, \f)
_HIDDEN_ESCAPED = r"\\u00[01][0-9a-fA-F]|\\[bfr]"


_STYLE = re.compile("(\x1b\\[[0-9;]*m)")  # SGR: the colours and weights a terminal table uses


def without_controls(text: str, *, keep_styles: bool = False) -> str:
    """`text` as it may be displayed: its control and invisible format characters removed
    (``_CONTROLS``; newline and tab kept), the one sanitising of display text every renderer
    applies last (terminal, timeline, markdown, HTML, SVG, stderr). With `keep_styles`, the
    renderer's own SGR colour sequences stay (the data it drew from is cleaned already: every
    string of the report loses its control characters)."""
    if not keep_styles:
        return _cleaned(text)
    parts = _STYLE.split(text)
    return "".join(p if i % 2 else _cleaned(p) for i, p in enumerate(parts))


# the hidden characters that are ASCII (C0 controls but tab and newline, DEL), for translate
_ASCII_HIDDEN = dict.fromkeys(c for a, b in _HIDDEN_RANGES for c in range(a, min(b, 0x7F) + 1))


def _cleaned(text: str) -> str:
    """`text` without ``_CONTROLS``: an ASCII text (most rendered output) by one translate,
    several times faster than the regex."""
    return text.translate(_ASCII_HIDDEN) if text.isascii() else _CONTROLS.sub("", text)


CHUNK_CHARS = 4_000_000  # chunks of about this size: ~15 times it in memory, CPU as one pass


def redact_pieces(
    pieces: Iterable[str], redact: Callable[[str], str], *, chunk: int = CHUNK_CHARS
) -> Iterator[str]:
    """The final pass over a text given as consecutive pieces (analyzer.render.report_json):
    `redact` over consecutive pieces joined into chunks of about `chunk` characters, so every
    byte written is seen by it and only a chunk is held at a time.

    The same as `redact` over the whole text when no match crosses a boundary between pieces.
    Pieces are whole lines and whole JSON values (a run verdict, a finding), and JSON escapes
    every newline inside a string: a string, and every secret in it, lies on one line inside
    one piece. Known values are matched as they appear inside a string (raw, JSON-escaped);
    the rules confined to a line run per line anyway (redact_shapes); only a rule that spans
    lines could join the end of one item to the next one's start, an accident of two texts
    rendered one after the other, not a secret either holds (and a key block's BEGIN line left
    without its END is masked to the end of its chunk instead of the text's: its own string,
    the key with it, still is)."""
    return (redact(text) for text in chunked(pieces, chunk))


def chunked(pieces: Iterable[AnyStr], chunk: int = CHUNK_CHARS) -> Iterator[AnyStr]:
    """Consecutive pieces (all texts, or all bytes) joined into pieces of about `chunk`
    characters or bytes (the last shorter): the texts `redact_pieces` passes, and given them,
    passes as they are."""
    held: list[AnyStr] = []
    size = 0
    for piece in pieces:
        held.append(piece)
        size += len(piece)
        if size >= chunk:
            yield held[0][:0].join(held)  # "" or b"", as the pieces are
            held, size = [], 0
    if held:
        yield held[0][:0].join(held)


def shapes_only(text: str) -> str:
    """`Redactor.apply` over a text `holds_known_or_hidden(..., raw_forms=True)` found no
    known value and no hidden character in: only secret shapes are left to mask (its steps
    for known values and hidden characters would change nothing)."""
    return redact_shapes(pl.Series([text], dtype=pl.String))[0]


def _unescape_json(value: str) -> str:
    try:
        return json.loads(f'"{value}"')
    except ValueError:
        return value
