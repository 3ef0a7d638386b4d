"""TextWorld's context-sensitive text grammar for PDDL games, re-implemented for speed.

A ``game.tw-pddl`` file carries a ``grammar`` document: action templates (``"take {o} from
{r}"``), feedback rules (``"#PickupObject.feedback#"``) and a JSON grammar of production rules
whose right-hand sides hold terminals, ``#nonterminals#``, ``{python expressions}``,
``{expression | conjunctive query}`` and ``[list of ...]`` symbols. TextWorld's ``PddlEnv``
re-parses every derivation string with a PEG parser on every step; here each string is parsed
once per process (module-level caches keyed by the string itself), and derivations run on
plain tuples.

The derivation semantics follow ``textworld.envs.pddl.textgen`` exactly (rule choice: the
first rule whose condition has a match; query matches: predicates in written order, facts in
sorted order, distinct placeholders bind distinct objects; lists: ``", "`` and ``", and "``
separators or ``#list_empty#``); the parity test against stock ALFWorld checks it.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

__all__ = ["ActionText", "Grammar", "parse_grammar_document", "parse_symbols", "parse_query"]

# Symbols are tuples, tagged by their first item:
#   ("t", text)                terminal
#   ("n", name)                nonterminal  #name#
#   ("e", code, source)        python expression, evaluated over the context's entities
#   ("c", inner, query|None)   conditional  {inner | query}; inner is an "n" or "e" symbol
#   ("l", conditional)         list         [{...}]
Symbol = tuple

# textworld's grammar and logic parsers are module-level tatsu parsers with mutable state: two
# threads parsing at once corrupt it (IndexError in tatsu), and envs of one process share the
# per-game caches that call them, so envs stepped from a thread pool must parse one at a time.
# Re-entrant: converting a parsed symbol parses its query.
_TEXTWORLD_PARSER_LOCK = threading.RLock()


def _convert(node: Any) -> Symbol:
    """Turn one of textworld's parsed CSG symbols into our tuple form."""
    kind = type(node).__name__
    if kind == "TerminalSymbol":
        return ("t", str(node.symbol))
    if kind == "NonterminalSymbol":
        return ("n", str(node.symbol))
    if kind == "EvalSymbol":
        source = str(node.expression)
        return ("e", compile(source, "<grammar>", "eval"), source)
    if kind == "ConditionalSymbol":
        query = parse_query(node.given) if node.given else None
        return ("c", _convert(node.expression), query)
    if kind == "ListSymbol":
        return ("l", _convert(node.symbol))
    raise ValueError(f"unknown grammar symbol {node!r}")


@cache
def parse_symbols(text: str) -> tuple[Symbol, ...]:
    """Parse a right-hand side (or a derivation start string) once per process."""
    from textworld.envs.pddl.textgen import _parse_and_convert

    with _TEXTWORLD_PARSER_LOCK:
        return tuple(_convert(s) for s in _parse_and_convert(text, rule_name="symbols"))


@cache
def parse_query(text: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """Parse a conjunctive query ``p(a:t, b:t) & q(...)`` into ``((pred, ((ph, type), ...)), ...)``."""
    from textworld.logic import Rule

    with _TEXTWORLD_PARSER_LOCK:
        rule = Rule.parse_conjunctive_query(text)
    return tuple(
        (pred.name, tuple((ph.name, ph.type) for ph in pred.parameters))
        for pred in rule.preconditions
    )


@dataclass(frozen=True)
class ActionText:
    """An action's command template and feedback start symbol, from the grammar document."""

    name: str
    template: str
    feedback: str


@dataclass(frozen=True)
class ProductionRule:
    condition: tuple | None  # parsed query, or None
    rhs: tuple[Symbol, ...]


class Grammar:
    """Production rules by left-hand side; ``rules[name]`` is tried in order."""

    __slots__ = ("rules",)

    def __init__(self, rules: dict[str, tuple[ProductionRule, ...]]):
        self.rules = rules


_BLOCK = r'"""(?:.|\n)*?"""'
_TOKEN = re.compile(
    rf"(?P<block>{_BLOCK})|(?P<str>\"[^\"]*\")|(?P<name>[\w/-]+)|(?P<punct>::|[{{}};])"
    r"|(?P<comment>#[^\n]*)|(?P<ws>\s+)",
)


def _tokens(text: str):
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse grammar document at {text[pos : pos + 40]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            yield kind, m.group()


def _rules_from_json(data: dict[str, list[dict[str, Any]]]) -> dict[str, list[ProductionRule]]:
    out: dict[str, list[ProductionRule]] = {}
    for name, rules in data.items():
        out[name] = [
            ProductionRule(
                condition=parse_query(r["condition"]) if r.get("condition") else None,
                rhs=parse_symbols(r["rhs"]),
            )
            for r in rules
        ]
    return out


@lru_cache(maxsize=64)
def _parse_json_block(code: str, strip_comment_lines: bool) -> dict[str, list[ProductionRule]]:
    text = textwrap.dedent(code[3:-3])
    if strip_comment_lines:  # textworld drops '#' lines from action-local grammars only
        text = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))
    return _rules_from_json(json.loads(text))


def parse_grammar_document(text: str) -> tuple[dict[str, ActionText], Grammar]:
    """Parse a ``game.tw-pddl`` grammar document (textworld's ``pddlStart`` rule).

    Returns the actions by lower-cased name and the merged production rules. Rules with the
    same left-hand side merge in document order (a later JSON block's rules for a name replace
    that name's rules within one block, and blocks extend one another), as in textworld's
    ``_ModelConverter.walk_PddlDocumentNode`` + ``ContextSensitiveGrammar.update``.
    """
    actions: dict[str, ActionText] = {}
    merged: dict[str, list[ProductionRule]] = {}
    tokens = list(_tokens(text))
    i = 0

    def expect(value: str) -> None:
        nonlocal i
        if tokens[i][1] != value:
            raise ValueError(f"expected {value!r} in grammar document, got {tokens[i][1]!r}")
        i += 1

    while i < len(tokens):
        kind, value = tokens[i]
        if value == "grammar":
            i += 1
            expect("::")
            block = tokens[i][1]
            i += 1
            expect(";")
            # top-level block: textworld's `grammar.update(json.loads(...))` is a dict update
            for name, rules in _parse_json_block(block, False).items():
                merged[name] = list(rules)
        elif value == "action":
            name = tokens[i + 1][1]
            i += 2
            expect("{")
            template = feedback = ""
            local: dict[str, list[ProductionRule]] = {}
            while tokens[i][1] != "}":
                key = tokens[i][1]
                i += 1
                expect("::")
                val = tokens[i][1]
                i += 1
                expect(";")
                if key == "template":
                    template = val[1:-1]
                elif key == "feedback":
                    feedback = val[1:-1]
                elif key == "grammar":
                    local = _parse_json_block(val, True)
            i += 1
            actions[name.lower()] = ActionText(name, template, feedback)
            for rname, rules in local.items():
                merged[rname] = list(rules)
        else:
            raise ValueError(f"unexpected token {value!r} in grammar document")
    return actions, Grammar({k: tuple(v) for k, v in merged.items()})
