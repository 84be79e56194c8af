"""The grammar engine's (llguidance's) errors, said in our own words.

Its text names its internals (`NoExtensionBias`, `<non-verbose/>`, item limits and fuel), echoes the grammar
and spans lines, so a client gets one of the phrases below instead, and the log gets the text (see
GrammarError). Each rule matches a class of errors, not one string; anything no rule knows gets a generic
phrase, never the engine's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from scheduler.errors import echoed

Kind = Literal["json_schema", "regex", "choice", "lark"]
NAMES: dict[Kind, str] = {"json_schema": "JSON schema", "regex": "regular expression", "choice": "choice list",
                          "lark": "grammar"}
GENERIC = {"compile": "cannot be compiled", "follow": "cannot be followed"}
MAX_DETAIL = 120  # characters of a detail (a name, a keyword) a phrase repeats


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    phrase: Callable[[re.Match[str], str, Kind], str]  # (the match, the whole text, the kind) -> the phrase


def _regex_syntax(found: re.Match[str], text: str, kind: Kind) -> str:
    reason = re.search(r"^error: (.+)$", text, re.MULTILINE)  # the regex parser's one-line reason
    detail = f" ({echoed(reason.group(1).strip(), MAX_DETAIL)})" if reason else ""
    return f"is not valid{detail}" if kind == "regex" else f"has an invalid regular expression{detail}"


def _quoted(template: str, strip: str = " \"'") -> Callable[[re.Match[str], str, Kind], str]:
    """A phrase naming what the engine quoted (a rule's name, a type, keywords), bounded."""
    return lambda found, text, kind: template.format(echoed(found.group(1).strip(strip), MAX_DETAIL))


def _fixed(phrase: str) -> Callable[[re.Match[str], str, Kind], str]:
    return lambda found, text, kind: phrase


def _at(found: re.Match[str], text: str, kind: Kind) -> str:
    return f"has a syntax error at line {found.group(1)}, column {found.group(2)}"


RULES = (  # the first that matches wins: the ones that key on the engine's own words before the vaguer ones
    Rule(re.compile(r"regex parse error|invalid regex"), _regex_syntax),
    Rule(re.compile(r'unknown name: "?([^"\n]*)"?'), _quoted('refers to an undefined rule or terminal "{}"')),
    Rule(re.compile(r"Unknown common regex: (\S+?);"), _quoted('imports an unknown terminal "{}"')),
    Rule(re.compile(r"Unimplemented keys: \[([^\]\n]*)\]"),
         _quoted("uses keywords this server does not support: {}", " ")),
    Rule(re.compile(r"Unknown format: (.+)"), _quoted('uses a format this server does not support: "{}"')),
    Rule(re.compile(r"Invalid type: (.+)"), _quoted('has an unknown type "{}"')),
    Rule(re.compile(r"Pointer .* does not exist|not present in a registry|invalid ref|Unresolved", re.IGNORECASE),
         _fixed("has a $ref that does not resolve (only references within the schema are supported)")),
    Rule(re.compile(r"NoExtensionBias|Unsatisfiable|Regex is empty"), _fixed("matches no string")),
    Rule(re.compile(r"too many|too big|too large|fuel|limit|exceeded|too deep", re.IGNORECASE),
         _fixed("is too large or too deeply recursive to {verb}")),
    Rule(re.compile(r"^(?:at )?(\d+)\((\d+)\):", re.MULTILINE), _at),
    Rule(re.compile(r"\b(\w+) must be an? (?:object|array|string|number|integer|boolean)"),
         _quoted('is malformed: "{}" has the wrong type')),
    Rule(re.compile(r"integer range|out of range|multipleOf|number", re.IGNORECASE),
         _fixed("has a number this server cannot use (out of range or too precise)")),
)


def described(text: str, kind: Kind, verb: Literal["compile", "follow"] = "compile") -> str:
    """What is wrong with a grammar of `kind`, as a phrase that follows "the <kind's name>", from the engine's
    error `text`; `verb`: "compile" when refusing a request, "follow" when a grammar failed mid-answer."""
    for rule in RULES:
        found = rule.pattern.search(text)
        if found:
            return rule.phrase(found, text, kind).replace("{verb}", verb)
    return GENERIC[verb]
