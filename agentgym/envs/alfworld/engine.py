"""A fast simulator for ALFWorld's TextWorld-PDDL games, text-identical to TextWorld's ``PddlEnv``.

Stock ALFWorld plays a ``game.tw-pddl`` file with ``textworld.envs.pddl.PddlEnv``: on every
reset it translates the PDDL problem to SAS twice with Fast Downward (~0.5 s), and on every
step it re-parses the text grammar for every applicable action and for the feedback (~28 ms).
This module does the same game with the work split by lifetime:

- once per process and string: grammar right-hand sides and queries (:mod:`.grammar`);
- once per domain text: action schemas compiled into join plans (:class:`Domain`);
- once per game file (shared by every env playing it, see :func:`load_game`): objects, types,
  entity names (ALFWorld's demangled ``"cabinet 1"`` names), static facts and their indexes,
  the initial fluent facts, the goal, and a cache of state-independent texts (commands such as
  ``"go to cabinet 1"``, feedback such as ``"You pick up the apple 1 from the countertop 1."``);
- per step: a join of each action's precondition against the fluent facts (a few hundred
  dictionary lookups), the effects, and one feedback derivation.

Semantics kept from the stock stack, because observations must match byte for byte:

- Applicable actions are the ground PDDL actions whose precondition holds, minus those Fast
  Downward's translator drops as no-ops (every effect already implied by the precondition, e.g.
  ``go to`` the receptacle the agent stands at); commands are the derived templates, and the
  admissible list is ``sorted(set(commands))``.
- TextWorld keeps, next to the true facts, a ``not_<pred>(...)`` fact for every atom an action
  made false (the grammar's "Next to it, you see" query reads ``not_inreceptacle``), so
  :class:`World` keeps those too; they never affect applicability, the goal or ``state_key``.
- ``won`` is the PDDL goal (Fast Downward's goal axiom) evaluated on the true facts.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import os
import struct
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agentgym.core import ProcessLocal
from agentgym.envs.alfworld.grammar import (
    parse_grammar_document,
    parse_symbols,
)

__all__ = ["Game", "World", "FrozenWorld", "load_game", "demangle_names", "clear_game_cache"]

_NOTHING_HAPPENS = "Nothing happens."
_NOOP = object()  # marks a ground action Fast Downward's translator drops
_EVAL_GLOBALS = {"__builtins__": builtins}
_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------
# PDDL parsing (Fast Downward's own parser and normaliser, the ones textworld uses)
# ---------------------------------------------------------------------------------------------
def _fd_parse(domain: str, problem: str):
    """Parse and normalise a PDDL domain + problem with Fast Downward's translator modules."""
    argv = sys.argv
    try:
        # fast_downward.translate.options parses sys.argv when first imported (as textworld's
        # pddl2sas knows); give it the arguments it expects, then restore ours.
        sys.argv = ["translate.py", "domain", "task"]
        from fast_downward.translate import normalize
        from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions
    finally:
        sys.argv = argv
    with contextlib.redirect_stdout(io.StringIO()):  # duplicate-atom warnings go to stdout
        domain_pddl = lisp_parser.parse_nested_list(domain.split("\n"))
        problem_pddl = lisp_parser.parse_nested_list(problem.split("\n"))
        task = parsing_functions.parse_task(domain_pddl, problem_pddl)
        normalize.normalize(task)
    return task


def _literals(condition) -> list[tuple[bool, str, tuple[str, ...]]]:
    """Flatten a normalised precondition (a conjunction of literals) to (positive, pred, args)."""
    from fast_downward.translate.pddl import conditions as c

    if isinstance(condition, c.Truth):
        return []
    if isinstance(condition, c.Literal):
        return [(not condition.negated, condition.predicate, tuple(condition.args))]
    if isinstance(condition, c.Conjunction):
        out = []
        for part in condition.parts:
            out.extend(_literals(part))
        return out
    raise NotImplementedError(f"unsupported PDDL condition after normalisation: {condition}")


# ---------------------------------------------------------------------------------------------
# Join plans: a conjunction of literals evaluated against indexed facts
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """A compiled conjunctive condition over variables ``0..nvars-1``.

    ``steps`` run in order; each either looks up a positive literal in an index (binding new
    variables), checks a negative literal / equality once its variables are bound, or
    enumerates the objects of a type for a variable no literal binds.
    """

    nvars: int
    steps: tuple
    var_types: tuple[str, ...]


def _compile_plan(
    literals: list[tuple[bool, str, tuple[str, ...]]],
    params: list[tuple[str, str]],
    bound: tuple[int, ...],
    size_hint: dict[str, int],
) -> _Plan:
    """Order ``literals`` greedily (most selective first) into a :class:`_Plan`.

    ``params`` are (name, type) of the variables; ``bound`` are the indices given on entry.
    """
    index = {name: i for i, (name, _) in enumerate(params)}
    is_bound = [False] * len(params)
    for i in bound:
        is_bound[i] = True

    def spec(args):
        return tuple(("v", index[a]) if a in index else ("k", a) for a in args)

    pending = [(pos, pred, spec(args)) for pos, pred, args in literals]
    steps: list[tuple] = []

    def flush_checks():
        keep = []
        for pos, pred, sp in pending:
            ready = all(kind == "k" or is_bound[v] for kind, v in sp)
            if ready and (not pos or pred == "="):
                steps.append(("eq" if pred == "=" else "neg", pos, pred, sp))
            else:
                keep.append((pos, pred, sp))
        pending[:] = keep

    flush_checks()
    while True:
        candidates = [(p, pr, sp) for p, pr, sp in pending if p and pr != "="]
        if not candidates:
            break

        def cost(item):
            _, pred, sp = item
            nbound = sum(1 for kind, v in sp if kind == "k" or is_bound[v])
            return size_hint.get(pred, 1000) / (30.0**nbound)

        best = min(candidates, key=cost)
        pending.remove(best)
        _, pred, sp = best
        key_positions = tuple(i for i, (kind, v) in enumerate(sp) if kind == "k" or is_bound[v])
        key_sources = tuple(sp[i] for i in key_positions)
        binds: list[tuple[int, int]] = []
        checks: list[tuple[int, int]] = []
        seen: dict[int, int] = {}
        for i, (_kind, v) in enumerate(sp):
            if i in key_positions:
                continue
            if v in seen:  # the same new variable twice in one literal: p(?x, ?x)
                checks.append((i, seen[v]))
            else:
                seen[v] = i
                binds.append((i, v))
        for _, v in binds:
            is_bound[v] = True
        steps.append(("pos", pred, key_positions, key_sources, tuple(binds), tuple(checks)))
        flush_checks()
    for v, flag in enumerate(is_bound):
        if not flag:
            steps.append(("enum", v))
            is_bound[v] = True
            flush_checks()
    if pending:  # only possible for malformed conditions
        raise ValueError(f"cannot order condition literals {pending}")
    return _Plan(len(params), tuple(steps), tuple(t for _, t in params))


def _codegen(plan: _Plan, n_entry: int, first_only: bool):
    """Compile a plan to a Python function of nested loops (the per-step hot path).

    The function is ``f(L, H, TS, TL, out, v0, ..., v{n_entry-1})``: ``L(pred, positions, key)``
    returns the matching fact tuples, ``H(pred, args)`` tests an atom, ``TS``/``TL`` map a type
    to the set/list of its objects. It appends every solution's variable tuple to ``out``, or
    (``first_only``) returns True at the first solution.
    """
    lines = []
    entry = "".join(f", v{i}" for i in range(n_entry))
    lines.append(f"def f(L, H, TS, TL, out{entry}):")
    depth = 1
    types_used = sorted(set(plan.var_types))
    for t in types_used:
        lines.append(f"    T_{_ident(t)} = TS.get({t!r}, ())")

    def src(s):
        return repr(s[1]) if s[0] == "k" else f"v{s[1]}"

    def tup(items):
        items = list(items)
        return "(" + "".join(f"{x}, " for x in items) + ")"

    for n, step in enumerate(plan.steps):
        pad = "    " * depth
        kind = step[0]
        if kind == "pos":
            _, pred, positions, sources, binds, checks = step
            key = tup(src(x) for x in sources)
            lines.append(f"{pad}for a{n} in L({pred!r}, {positions!r}, {key}):")
            depth += 1
            pad = "    " * depth
            conds = []
            for pos, v in binds:
                lines.append(f"{pad}v{v} = a{n}[{pos}]")
                conds.append(f"v{v} in T_{_ident(plan.var_types[v])}")
            conds += [f"a{n}[{i}] == a{n}[{j}]" for i, j in checks]
            if conds:
                lines.append(f"{pad}if {' and '.join(conds)}:")
                depth += 1
        elif kind == "neg":
            _, _, pred, sp = step
            lines.append(f"{pad}if not H({pred!r}, {tup(src(x) for x in sp)}):")
            depth += 1
        elif kind == "eq":
            _, positive, _, sp = step
            op = "==" if positive else "!="
            lines.append(f"{pad}if {src(sp[0])} {op} {src(sp[1])}:")
            depth += 1
        else:
            v = step[1]
            lines.append(f"{pad}for v{v} in TL.get({plan.var_types[v]!r}, ()):")
            depth += 1
    pad = "    " * depth
    if first_only:
        lines.append(f"{pad}return True")
        lines.append("    return False")
    else:
        lines.append(f"{pad}out.append({tup(f'v{i}' for i in range(plan.nvars))})")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - code generated from the PDDL domain
    return namespace["f"]


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


@dataclass(frozen=True)
class _Effect:
    conditions: tuple[tuple[bool, str, tuple], ...]  # (positive, pred, argspec)
    positive: bool
    pred: str
    args: tuple  # argspec


@dataclass(frozen=True)
class _Schema:
    """One normalised action (a disjunctive precondition gives several schemas of one name)."""

    name: str
    n_external: int
    param_names: tuple[str, ...]  # without the '?', as textworld's placeholders name them
    plan: _Plan
    solve: Any  # the plan compiled by _codegen
    shared_name: bool  # another schema has this name (a split disjunction): dedupe ops
    pre_pos: frozenset  # (pred, argspec) of positive precondition literals
    pre_neg: frozenset
    effects: tuple[_Effect, ...]


class Domain:
    """A PDDL domain's action schemas compiled into join plans. One per domain text."""

    def __init__(self, task, size_hint: dict[str, int]):
        self.schemas: list[_Schema] = []
        fluent: set[str] = set()
        for action in task.actions:
            for eff in action.effects:
                fluent.add(eff.literal.predicate)
        self.fluent = frozenset(fluent)
        for action in task.actions:
            params = [(p.name, p.type_name) for p in action.parameters]
            lits = _literals(action.precondition)
            plan = _compile_plan(lits, params, (), size_hint)
            index = {name: i for i, (name, _) in enumerate(params)}

            def spec(args, index=index):
                return tuple(("v", index[a]) if a in index else ("k", a) for a in args)

            effects = []
            for eff in action.effects:
                if eff.parameters:
                    raise NotImplementedError("universally quantified effects are not supported")
                conds = tuple((p, pr, spec(a)) for p, pr, a in _literals(eff.condition))
                lit = eff.literal
                effects.append(_Effect(conds, not lit.negated, lit.predicate, spec(lit.args)))
            self.schemas.append(
                _Schema(
                    name=action.name,
                    n_external=action.num_external_parameters,
                    param_names=tuple(name.strip("?") for name, _ in params),
                    plan=plan,
                    solve=_codegen(plan, 0, False),
                    shared_name=sum(a.name == action.name for a in task.actions) > 1,
                    pre_pos=frozenset((pr, spec(a)) for p, pr, a in lits if p),
                    pre_neg=frozenset((pr, spec(a)) for p, pr, a in lits if not p),
                    effects=tuple(effects),
                )
            )


class Goal:
    """A problem's goal: Fast Downward normalises it into axioms deriving ``new-axiom@N``.

    ``axioms[name]`` lists the compiled rules (n_external, plan, solve) of a derived predicate;
    ``rules[name]`` keeps the same rules raw, ``(params, literals)`` with params ``(name,
    type)`` (the first n_external are the axiom's arguments) and literals ``(positive, pred,
    args)``, for :class:`_GoalProgress`. ``literals`` is the goal itself, a conjunction.
    """

    def __init__(self, task, size_hint: dict[str, int]):
        self.axioms: dict[str, list[tuple[int, _Plan, Any]]] = defaultdict(list)
        self.rules: dict[str, list[tuple[tuple, tuple]]] = defaultdict(list)
        for ax in task.axioms:
            params = [(p.name, p.type_name) for p in ax.parameters]
            n_ext = ax.num_external_parameters
            literals = _literals(ax.condition)
            plan = _compile_plan(literals, params, tuple(range(n_ext)), size_hint)
            self.axioms[ax.name].append((n_ext, plan, _codegen(plan, n_ext, True)))
            self.rules[ax.name].append((tuple(params), tuple(literals)))
        self.literals = _literals(task.goal)


class _RuleProgress(NamedTuple):
    """One axiom rule grounded against a game's static facts (see :class:`_GoalProgress`)."""

    n_fluent: int  # goal facts (fluent or derived literals) per grounding
    atoms: np.ndarray  # int64 (groundings, n_fluent): ids into _GoalProgress.atoms, rows unique
    negative: np.ndarray  # bool (n_fluent,): the literal in that column is negated


class _GoalProgress:
    """How much of a game's goal holds: the ground truth behind ``World.goal_progress``.

    A goal literal that names a derived axiom (ALFWorld's single ``new-axiom@0()``) scores the
    best rule of the axiom; a rule scores the best of its groundings, and a grounding scores
    the fraction of the rule's goal facts (its fluent and derived literals, e.g.
    ``inreceptacle(o, r)``, ``isclean(o)``) that hold. Groundings are the typed assignments of
    the rule's variables that satisfy its static literals (types, ``objecttype``, ``=``...):
    they never change while the game is played, so they are enumerated once, here, and each
    one's goal facts are stored as ids of ground atoms. Any other goal literal scores 1 or 0.
    The goal's progress is the mean over its literals: in [0, 1], and exactly 1.0 iff every
    literal holds (a grounding with all its goal facts true is a solution of the rule), which
    is when :meth:`World.won` is True.

    Per state the work is one set membership per distinct ground atom, then a gather and a
    row sum over each rule's (groundings, n_fluent) id matrix.
    """

    def __init__(self, game: Game):
        goal = game.goal
        self.atoms: list[tuple[str, tuple]] = []  # distinct ground goal facts
        atom_ids: dict[tuple[str, tuple], int] = {}
        # per goal literal: (positive, pred, args, rules or None for a plain 0/1 literal)
        terms: list[tuple[bool, str, tuple, list[_RuleProgress] | None]] = []
        for positive, pred, args in goal.literals:
            rules = goal.rules.get(pred) if positive else None
            grounded = None
            if rules is not None:
                grounded = [
                    self._ground_rule(game, params, literals, args, atom_ids)
                    for params, literals in rules
                ]
            terms.append((positive, pred, args, grounded))
        # order atoms by predicate so that a state's truth vector is built group by group
        order = sorted(range(len(self.atoms)), key=lambda i: self.atoms[i])
        new_id = np.empty(len(order), dtype=np.int64)
        new_id[order] = np.arange(len(order))
        self.atoms = [self.atoms[i] for i in order]
        self.terms = [
            (
                pos,
                pred,
                args,
                None if rules is None else [r._replace(atoms=new_id[r.atoms]) for r in rules],
            )
            for pos, pred, args, rules in terms
        ]
        groups: dict[str, list[tuple]] = defaultdict(list)
        for pred, args in self.atoms:
            groups[pred].append(args)
        # (pred, argument tuples in atom order, is a derived axiom)
        self.groups = [(p, tuple(a), p in goal.axioms) for p, a in groups.items()]

    def _ground_rule(
        self,
        game: Game,
        params: tuple[tuple[str, str], ...],
        literals: tuple[tuple[bool, str, tuple[str, ...]], ...],
        entry: tuple[str, ...],
        atom_ids: dict[tuple[str, tuple], int],
    ) -> _RuleProgress:
        # goal facts can change while the game is played; the rest ('=', types) cannot
        changeable = game.domain.fluent | game.goal.axioms.keys()
        goal_facts = [lit for lit in literals if lit[1] in changeable]
        static = [lit for lit in literals if lit[1] not in changeable]
        size_hint = {p: len(s) for p, s in game.static.items()}
        plan = _compile_plan(static, list(params), tuple(range(len(entry))), size_hint)
        groundings: list[tuple] = []

        def lookup(pred, positions, key):
            return game.static_index(pred, positions).get(key, ())

        def holds(pred, args):
            return args in game.static.get(pred, ())

        _codegen(plan, len(entry), False)(
            lookup, holds, game.type_sets, game.type_objects, groundings, *entry
        )
        index = {name: i for i, (name, _) in enumerate(params)}
        specs = [tuple(index.get(a, a) for a in args) for _, _, args in goal_facts]
        rows = set()
        for binding in groundings:
            row = []
            for (_, pred, _), spec in zip(goal_facts, specs, strict=True):
                atom = (pred, tuple(binding[a] if isinstance(a, int) else a for a in spec))
                i = atom_ids.get(atom)
                if i is None:
                    i = atom_ids[atom] = len(self.atoms)
                    self.atoms.append(atom)
                row.append(i)
            rows.add(tuple(row))  # groundings differing only in static variables score alike
        atoms = np.array(sorted(rows), dtype=np.int64).reshape(len(rows), len(goal_facts))
        negative = np.array([not pos for pos, _, _ in goal_facts], dtype=bool)
        return _RuleProgress(len(goal_facts), atoms, negative)

    def progress(self, world: World) -> tuple[float, float]:
        """``(progress, facts met)`` in ``world``'s state, both in [0, 1].

        ``progress`` is the class docstring's measure (a single choice of objects); ``facts
        met`` scores each goal-fact position of a rule by whether *some* grounding satisfies
        it (some X is clean, some X is in a Y), best rule per literal, mean over literals. It
        rises when a step achieves a goal fact for any candidate object, where ``progress``
        may stay flat because another candidate already stood at that level (a dirty X that
        already sat in a Y keeps progress at 1/2 while another X is cleaned).
        """
        truth: list[bool] = []
        facts = world.facts
        for pred, arg_tuples, is_derived in self.groups:
            if is_derived:
                truth.extend(world._literal_true(True, pred, a) for a in arg_tuples)
            else:
                s = facts.get(pred)
                truth.extend([a in s for a in arg_tuples] if s else [False] * len(arg_tuples))
        true = np.array(truth, dtype=bool)
        total = met = 0.0
        for positive, pred, args, rules in self.terms:
            if rules is None:
                value = float(world._literal_true(positive, pred, args))
                total += value
                met += value
                continue
            best = best_met = 0.0
            for rule in rules:
                if not len(rule.atoms):
                    continue  # no grounding satisfies the static literals: never true
                if not rule.n_fluent:
                    best = best_met = 1.0
                    break
                sat = true[rule.atoms]
                if rule.negative.any():
                    sat ^= rule.negative
                n_true = int(sat.sum(axis=1).max())
                # n / n is exactly 1.0: a satisfied rule reports 1.0, not 0.999...
                best = max(best, n_true / rule.n_fluent)
                best_met = max(best_met, int(sat.any(axis=0).sum()) / rule.n_fluent)
            total += best
            met += best_met
        # a sum of k exact 1.0s divided by k is exactly 1.0 again
        if not self.terms:
            return 1.0, 1.0
        return total / len(self.terms), met / len(self.terms)


# ---------------------------------------------------------------------------------------------
# ALFWorld's entity names
# ---------------------------------------------------------------------------------------------
def demangle_names(ids: list[str]) -> dict[str, str]:
    """ALFWorld's display names for PDDL object ids (its ``Demangler`` without shuffling).

    ``"cabinet_bar__minus_01_dot_23_bar_..."`` becomes ``"cabinet N"``: instances of one kind
    are numbered in decreasing order of their sorted ids (ALFWorld pops numbers off the end of
    a list), a ``basin`` id gets the suffix ``basin``, and an id without ``_bar_`` keeps its
    text followed by a space (``"agent1 "``), all exactly as ALFWorld prints them.
    """
    ids = sorted(ids)
    counts: Counter[str] = Counter()
    for ident in ids:
        head, sep, _ = ident.partition("_bar_")
        if sep:
            counts[head + ("basin" if "basin" in ident else "")] += 1
    remaining = {name: list(range(1, n + 1)) for name, n in counts.items()}
    names = {}
    for ident in ids:
        text = (
            ident.replace("_bar_", "|")
            .replace("_minus_", "-")
            .replace("_plus_", "+")
            .replace("_dot_", ".")
            .replace("_comma_", ",")
        )
        head, sep, _ = text.partition("|")
        if not sep:
            names[ident] = f"{text} "
        else:
            kind = head + ("basin" if "basin" in ident else "")
            names[ident] = f"{kind} {remaining[kind].pop()}"
    return names


# ---------------------------------------------------------------------------------------------
# One game: everything that does not change while it is played
# ---------------------------------------------------------------------------------------------
class Game:
    """The immutable part of one ALFWorld game, shared by every :class:`World` playing it."""

    def __init__(self, data: dict[str, Any], path: str | None = None):
        from textworld.generator.game import EntityInfo

        self.path = path
        task = _fd_parse(data["pddl_domain"], data["pddl_problem"])
        self.obj_type: dict[str, str] = {o.name: o.type_name for o in task.objects}
        # textworld's fact set: the init atoms (minus '=' and numeric fluents)
        init: set[tuple[str, tuple[str, ...]]] = set()
        for atom in task.init:
            pred = getattr(atom, "predicate", None)
            if pred is None or pred == "=" or getattr(atom, "negated", False):
                continue
            init.add((pred, tuple(atom.args)))
        size_hint = Counter(pred for pred, _ in init)
        self.domain = _domain_for(data["pddl_domain"], task, size_hint)
        self.goal = Goal(task, size_hint)
        fluent = self.domain.fluent

        # types: each object's type and its ancestors
        parents: dict[str, set[str]] = defaultdict(set)
        for t in task.types:
            parents[t.name].update(n for n in t.supertype_names if n != t.name)
        self.type_objects: dict[str, list[str]] = defaultdict(list)
        self._obj_types: dict[str, frozenset[str]] = {}
        for obj, t in sorted(self.obj_type.items()):
            chain, todo = [], [t]
            while todo:
                t = todo.pop()
                if t not in chain:
                    chain.append(t)
                    todo.extend(parents.get(t, ()))
            self._obj_types[obj] = frozenset(chain)
            for t in chain:
                self.type_objects[t].append(obj)
        self.type_sets = {t: frozenset(objs) for t, objs in self.type_objects.items()}
        # per schema: binding -> (op, command) or _NOOP; filled as states are visited
        self.op_cache: list[dict] = [{} for _ in self.domain.schemas]

        static: dict[str, set] = defaultdict(set)
        self.init_fluent: dict[str, frozenset] = {}
        fl: dict[str, set] = defaultdict(set)
        for pred, args in init:
            (fl if pred in fluent else static)[pred].add(args)
        self.static = {p: frozenset(s) for p, s in static.items()}
        self.init_fluent = {p: frozenset(s) for p, s in fl.items()}
        self._static_index: dict[tuple, dict] = {}

        # entity names, as ALFWorld's AlfredDemangler assigns them
        ids = sorted({a for _, args in init for a in args})
        names = demangle_names(ids)
        self.entities: dict[str, Any] = {}
        for ident in ids:
            info = EntityInfo(ident, self.obj_type.get(ident))
            info.name = names[ident]
            info.definite = "the"
            info.indefinite = "a"
            self.entities[ident] = info
        self.names = {ident: info.name for ident, info in self.entities.items()}

        self.actions, self.grammar = parse_grammar_document(data["grammar"])

        # state_key: fluent predicates something reads (a precondition, the goal, the grammar);
        # bookkeeping-only ones (ALFWorld's `checked`) would split equal worlds apart.
        read: set[str] = set()
        for schema in self.domain.schemas:
            read.update(p for p, _ in schema.pre_pos | schema.pre_neg)
            for eff in schema.effects:
                read.update(p for _, p, _ in eff.conditions)
        for rules in self.goal.axioms.values():
            for _, plan, _ in rules:
                read.update(
                    st[1] if st[0] == "pos" else st[2] for st in plan.steps if st[0] != "enum"
                )
        read.update(p for _, p, _ in self.goal.literals)
        for rules in self.grammar.rules.values():
            for rule in rules:
                for p, _ in rule.condition or ():
                    read.add(p.removeprefix("not_"))
                _collect_query_preds(rule.rhs, read)
        self.key_predicates = frozenset(p for p in fluent if p in read)
        self._pred_code = {p: i for i, p in enumerate(sorted(fluent))}
        self._obj_code = {o: i for i, o in enumerate(sorted(self.obj_type))}
        self.fact_codes: dict[tuple, bytes] = {}
        # keys of different games never collide: they start with a digest of the problem
        self.key_prefix = hashlib.sha1(data["pddl_problem"].encode()).digest()[:6]
        self._static_symbols: dict[int, bool] = {}
        self.text_cache: dict[tuple, str] = {}  # state-independent texts, shared by worlds
        self._goal_progress: _GoalProgress | None = None
        intro = self.grammar.rules.get("task")
        self.goal_text = ""
        if intro:
            task_line = "".join(s[1] for s in intro[0].rhs if s[0] == "t")
            self.goal_text = task_line.split("Your task is to: ", 1)[-1]

    @property
    def goal_progress_model(self) -> _GoalProgress:
        """The goal grounded against the static facts, built on first use (about 0.3 ms on
        ALFWorld's games) and shared by every world playing this game."""
        model = self._goal_progress
        if model is None:
            # two threads may both build it: the results are equal and the assignment atomic
            model = self._goal_progress = _GoalProgress(self)
        return model

    def fact_code(self, pred: str, args: tuple) -> bytes:
        """Canonical bytes of a fluent fact: predicate and object ranks (sorted names), uint16."""
        code = struct.pack(
            f"<{1 + len(args)}H", self._pred_code[pred], *(self._obj_code[a] for a in args)
        )
        self.fact_codes[(pred, args)] = code
        return code

    # -- facts and indexes ------------------------------------------------------------------
    def static_index(self, pred: str, positions: tuple[int, ...]) -> dict:
        key = (pred, positions)
        idx = self._static_index.get(key)
        if idx is None:
            idx = defaultdict(list)
            for args in sorted(self.static.get(pred, ())):
                idx[tuple(args[i] for i in positions)].append(args)
            idx = dict(idx)
            self._static_index[key] = idx
        return idx

    def has_type(self, obj: str, t: str) -> bool:
        types = self._obj_types.get(obj)
        return types is not None and t in types

    # -- text -------------------------------------------------------------------------------
    def symbols_static(self, symbols: tuple, _stack: frozenset = frozenset()) -> bool:
        """Whether deriving ``symbols`` reads no fluent fact (so its text can be cached)."""
        fluent = self.domain.fluent
        for sym in symbols:
            kind = sym[0]
            if kind == "n":
                name = sym[1]
                if name in _stack:
                    continue
                cached = self._static_symbols.get(id(sym))
                if cached is None:
                    cached = True
                    for rule in self.grammar.rules.get(name, ()):
                        if rule.condition and any(
                            p in fluent or p.startswith("not_") for p, _ in rule.condition
                        ):
                            cached = False
                        if not self.symbols_static(rule.rhs, _stack | {name}):
                            cached = False
                    self._static_symbols[id(sym)] = cached
                if not cached:
                    return False
            elif kind == "c":
                if sym[2] and any(p in fluent or p.startswith("not_") for p, _ in sym[2]):
                    return False
                if not self.symbols_static((sym[1],), _stack):
                    return False
            elif kind == "l":
                if not self.symbols_static((sym[1],), _stack):
                    return False
        return True


def _collect_query_preds(symbols: tuple, out: set) -> None:
    for sym in symbols:
        if sym[0] == "c":
            for p, _ in sym[2] or ():
                out.add(p.removeprefix("not_"))
            _collect_query_preds((sym[1],), out)
        elif sym[0] == "l":
            _collect_query_preds((sym[1],), out)


_DOMAINS: dict[str, Domain] = {}
_GAMES: dict[str, Game] = {}


def _domain_for(text: str, task, size_hint) -> Domain:
    key = hashlib.sha1(text.encode()).hexdigest()
    domain = _DOMAINS.get(key)
    if domain is None:
        domain = _DOMAINS[key] = Domain(task, size_hint)
    return domain


def load_game(path: str | os.PathLike[str]) -> Game:
    """The :class:`Game` of a ``game.tw-pddl`` file, parsed once per process and shared."""
    path = os.fspath(path)
    game = _GAMES.get(path)
    if game is None:
        with _LOCK:
            game = _GAMES.get(path)
            if game is None:
                with open(path) as f:
                    data = json.load(f)
                game = _GAMES[path] = Game(data, path)
    return game


def clear_game_cache(domains: bool = False) -> None:
    """Forget every parsed game (and with ``domains``, every compiled domain): benchmarks use it
    to time a game's first load."""
    _GAMES.clear()
    if domains:
        _DOMAINS.clear()


# ---------------------------------------------------------------------------------------------
# The mutable state
# ---------------------------------------------------------------------------------------------
class _Op:
    """A ground action applicable in the current state."""

    __slots__ = ("schema", "args", "effects", "key")

    def __init__(self, schema: _Schema, args: tuple, effects: list, key: tuple):
        self.schema = schema
        self.args = args
        self.effects = effects
        self.key = key


class FrozenWorld(NamedTuple):
    """An immutable copy of a :class:`World`'s mutable state (:meth:`World.freeze`)."""

    facts: tuple[tuple[str, frozenset], ...]
    negated: tuple[tuple[str, frozenset], ...]
    derived: ProcessLocal
    """(game, fact indexes, operators, commands, state key, goal progress) of that state, reused by a thaw in
    this process into a world of the same game"""


class World:
    """The state of one game being played: the true fluent facts plus TextWorld's ``not_`` facts.

    ``facts[pred]`` holds the argument tuples of the true fluent atoms; ``negated[pred]`` holds
    those an action made false (TextWorld's ``not_pred`` facts, which its grammar reads).
    """

    __slots__ = ("game", "facts", "negated", "_index", "_ops", "_commands", "_key", "_progress")

    def __init__(self, game: Game):
        self.game = game
        self.facts: dict[str, set] = {p: set(s) for p, s in game.init_fluent.items()}
        self.negated: dict[str, set] = {}
        self._index: dict[tuple, dict] = {}
        self._ops: dict[str, _Op] | None = None
        self._commands: list[str] | None = None
        self._key: bytes | None = None
        self._progress: tuple[float, float] | None = None

    # -- serialisation ----------------------------------------------------------------------
    def dump(self) -> tuple:
        """A picklable copy of the mutable state (see :meth:`restore`)."""
        return (
            {p: sorted(s) for p, s in self.facts.items()},
            {p: sorted(s) for p, s in self.negated.items()},
        )

    def restore(self, dumped: tuple) -> None:
        facts, negated = dumped
        self.facts = {p: set(s) for p, s in facts.items()}
        self.negated = {p: set(s) for p, s in negated.items()}
        self._index.clear()
        self._ops = self._commands = self._key = self._progress = None

    def freeze(self) -> FrozenWorld:
        """An immutable copy of the facts (a few hundred small tuples, shared with this world:
        they are immutable), with this state's derived caches shared too: the world replaces
        its caches when the facts change and never edits them in place, except the index dict,
        which is copied."""
        derived = (
            self.game,
            tuple(self._index.items()),
            self._ops,
            None if self._commands is None else tuple(self._commands),
            self._key,
            self._progress,
        )
        return FrozenWorld(
            tuple((p, frozenset(s)) for p, s in self.facts.items()),
            tuple((p, frozenset(s)) for p, s in self.negated.items()),
            ProcessLocal(derived),
        )

    def thaw(self, frozen: FrozenWorld) -> None:
        """Put a :meth:`freeze` copy back (any number of times). The derived caches come back
        too when the copy was frozen in this process from a world of the same game object."""
        self.facts = {p: set(s) for p, s in frozen.facts}
        self.negated = {p: set(s) for p, s in frozen.negated}
        derived = frozen.derived.value
        if derived is not None and derived[0] is self.game:
            _, index, self._ops, commands, self._key, self._progress = derived
            self._index = dict(index)
            self._commands = None if commands is None else list(commands)
        else:
            self._index = {}
            self._ops = self._commands = self._key = self._progress = None

    # -- fact access --------------------------------------------------------------------------
    def _lookup(self, pred: str, positions: tuple[int, ...], key: tuple) -> list:
        """Argument tuples of ``pred`` facts (true facts, or ``not_`` facts), sorted, matching key."""
        ikey = (pred, positions)
        idx = self._index.get(ikey)
        if idx is not None:
            return idx.get(key, ())
        game = self.game
        idx = game._static_index.get(ikey)
        if idx is not None:
            return idx.get(key, ())
        if pred in game.domain.fluent:
            source = self.facts.get(pred, ())
        elif pred.startswith("not_") and pred not in game.static:
            source = self.negated.get(pred[4:], ())
        else:
            return game.static_index(pred, positions).get(key, ())
        idx = defaultdict(list)
        for args in sorted(source):
            idx[tuple(args[i] for i in positions)].append(args)
        idx = self._index[ikey] = dict(idx)
        return idx.get(key, ())

    def holds(self, pred: str, args: tuple) -> bool:
        """Whether the (true, closed-world) atom ``pred(args)`` holds."""
        if pred in self.game.domain.fluent:
            s = self.facts.get(pred)
            return s is not None and args in s
        s = self.game.static.get(pred)
        return s is not None and args in s

    # -- conditions ---------------------------------------------------------------------------
    def _literal_true(self, positive: bool, pred: str, args: tuple) -> bool:
        if pred == "=":
            return (args[0] == args[1]) == positive
        axioms = self.game.goal.axioms.get(pred)
        if axioms is not None:
            game = self.game
            value = any(
                solve(self._lookup, self.holds, game.type_sets, game.type_objects, None, *args)
                for _, _, solve in axioms
            )
        else:
            value = self.holds(pred, args)
        return value == positive

    def won(self) -> bool:
        """The PDDL goal holds."""
        return all(self._literal_true(p, pred, args) for p, pred, args in self.game.goal.literals)

    def goal_progress(self) -> float:
        """How much of the goal holds, in [0, 1]; exactly 1.0 iff :meth:`won`.

        The fraction of goal facts (``inreceptacle(o, r)``, ``isclean(o)``, ``istoggled(l)``,
        ``holds(agent, o)``...) true for the best choice of objects that meets the goal's fixed
        conditions (types, ``o1 != o2``): a "clean X and put it in Y" task is at 1/2 once an X
        is clean, or once an X sits in a Y. Mean over the goal's literals when it has several
        (see :class:`_GoalProgress`). Computed once per state.
        """
        if self._progress is None:
            self._progress = self.game.goal_progress_model.progress(self)
        return self._progress[0]

    def goal_facts_met(self) -> float:
        """The share of the goal's fact positions that some choice of objects meets, in [0, 1]
        (``isclean(o)`` counts once any X is clean): at least :meth:`goal_progress`, rising
        whenever a step achieves a goal fact for any candidate object. Computed with it."""
        if self._progress is None:
            self._progress = self.game.goal_progress_model.progress(self)
        return self._progress[1]

    # -- actions ------------------------------------------------------------------------------
    def operators(self) -> dict[str, _Op]:
        """Applicable ground actions by command text (first found wins on a duplicate text)."""
        if self._ops is not None:
            return self._ops
        ops: dict[str, _Op] = {}
        seen: set[tuple] = set()
        game = self.game
        found: list[tuple] = []
        lookup, holds = self._lookup, self.holds
        type_sets, type_objects = game.type_sets, game.type_objects
        for si, schema in enumerate(game.domain.schemas):
            found.clear()
            schema.solve(lookup, holds, type_sets, type_objects, found)
            if not found:
                continue
            cache = game.op_cache[si]
            shared = schema.shared_name
            for binding in found:
                entry = cache.get(binding)
                if entry is None:
                    entry = cache[binding] = self._make_op(schema, binding)
                if entry is _NOOP:
                    continue
                op, command = entry
                if shared:
                    if op.key in seen:
                        continue
                    seen.add(op.key)
                if command is None:
                    command = self._command(op)
                if command not in ops:
                    ops[command] = op
        self._ops = ops
        return ops

    def admissible_commands(self) -> list[str]:
        """The admissible commands, sorted (as TextWorld's ``admissible_commands``)."""
        if self._commands is None:
            self._commands = sorted(self.operators())
        return self._commands

    def _make_op(self, schema: _Schema, binding: tuple):
        """The cached (op, command or None if state-dependent) of a binding, or _NOOP."""
        effects = self._ground_effects(schema, binding)
        if effects is None:
            return _NOOP
        op = _Op(schema, binding, effects, (schema.name, binding[: schema.n_external]))
        symbols = parse_symbols(self.game.actions[schema.name].template)
        return op, (self._command(op) if self.game.symbols_static(symbols) else None)

    @staticmethod
    def _ground_effects(schema: _Schema, binding: list) -> list | None:
        """The ground effects Fast Downward keeps, or None if the action is a no-op it drops."""

        def ground(sp):
            return tuple(s[1] if s[0] == "k" else binding[s[1]] for s in sp)

        pre_pos = {(p, ground(sp)) for p, sp in schema.pre_pos}
        pre_neg = {(p, ground(sp)) for p, sp in schema.pre_neg}
        raw = []
        for eff in schema.effects:
            conds = tuple((pos, pred, ground(sp)) for pos, pred, sp in eff.conditions)
            raw.append((conds, eff.positive, eff.pred, ground(eff.args)))
        adds = {(c, p, a) for c, pos, p, a in raw if pos}
        effects = []
        for conds, pos, pred, args in raw:
            if not pos and (conds, pred, args) in adds:
                continue  # an add of the same atom under the same condition wins over a delete
            if pos and (pred, args) in pre_pos:
                continue  # no change: the precondition already makes it true
            if not pos and (pred, args) in pre_neg:
                continue
            effects.append((conds, pos, pred, args))
        return effects or None

    def _context(self, op: _Op | None) -> tuple[dict, dict]:
        if op is None:
            return {}, {}
        params = op.schema.plan.var_types
        names = op.schema.param_names
        mapping = {}
        variables = {}
        for i in range(op.schema.n_external):
            mapping[(names[i], params[i])] = op.args[i]
            variables[names[i]] = self.game.entities[op.args[i]]
        return mapping, variables

    def _command(self, op: _Op) -> str:
        action = self.game.actions[op.schema.name]
        symbols = parse_symbols(action.template)
        mapping, variables = self._context(op)
        text = self.derive(symbols, mapping, variables)
        if "{" in text or "}" in text:  # textworld formats the derived template with all names
            try:
                text = text.format(**self.game.names)
            except (KeyError, IndexError, ValueError):
                pass
        return text

    def step(self, command: str) -> tuple[str, bool]:
        """Play ``command`` (stripped, as TextWorld does). Returns (feedback, changed)."""
        op = self.operators().get(command.strip())
        if op is None:
            return _NOTHING_HAPPENS, False
        self.apply(op)
        return self.feedback(op), True

    def apply(self, op: _Op) -> None:
        fired = [
            (pos, pred, args)
            for conds, pos, pred, args in op.effects
            if all(self._literal_true(p, pr, a) for p, pr, a in conds)
        ]
        changed = set()
        for pos, pred, args in fired:
            facts = self.facts.setdefault(pred, set())
            negated = self.negated.setdefault(pred, set())
            if pos:
                facts.add(args)
                negated.discard(args)
            else:
                facts.discard(args)
                negated.add(args)
            changed.add(pred)
        for key in list(self._index):
            if key[0].removeprefix("not_") in changed:
                del self._index[key]
        self._ops = self._commands = self._key = self._progress = None

    def feedback(self, op: _Op) -> str:
        action = self.game.actions[op.schema.name]
        symbols = parse_symbols(action.feedback)
        static = self.game.symbols_static(symbols)
        key = ("fb",) + op.key
        if static:
            text = self.game.text_cache.get(key)
            if text is not None:
                return text
        mapping, variables = self._context(op)
        text = self.derive(symbols, mapping, variables)
        if static:
            self.game.text_cache[key] = text
        return text

    def intro(self) -> str:
        """The first observation (the grammar's ``#intro#``)."""
        return self.derive(parse_symbols("#intro#"), {}, {})

    # -- text derivation (textworld.envs.pddl.textgen semantics) ----------------------------
    def query(self, query: tuple, mapping: dict) -> list[dict]:
        """All extensions of ``mapping`` matching ``query``, in textworld's order."""
        results: list[dict] = []
        game = self.game
        mapping = dict(mapping)
        used = set(mapping.values())
        n = len(query)

        def rec(i):
            if i == n:
                results.append(dict(mapping))
                return
            pred, params = query[i]
            positions = tuple(j for j, ph in enumerate(params) if ph in mapping)
            key = tuple(mapping[params[j]] for j in positions)
            new = [(j, ph) for j, ph in enumerate(params) if ph not in mapping]
            for args in self._lookup(pred, positions, key):
                added = []
                ok = True
                for j, ph in new:
                    obj = args[j]
                    existing = mapping.get(ph)
                    if existing is None:
                        if obj in used or not game.has_type(obj, ph[1]):
                            ok = False
                            break
                        mapping[ph] = obj
                        used.add(obj)
                        added.append(ph)
                    elif existing != obj:
                        ok = False
                        break
                if ok:
                    rec(i + 1)
                for ph in added:
                    used.discard(mapping.pop(ph))

        rec(0)
        return results

    def derive(self, symbols: tuple, mapping: dict, variables: dict) -> str:
        out: list[str] = []
        for sym in symbols:
            self._derive_symbol(sym, mapping, variables, out)
        return "".join(out)

    def _derive_symbol(self, sym: tuple, mapping: dict, variables: dict, out: list) -> None:
        kind = sym[0]
        if kind == "t":
            out.append(sym[1])
        elif kind == "n":
            rules = self.game.grammar.rules.get(sym[1])
            if not rules:
                raise KeyError(f"Can't find symbol '#{sym[1]}#' in the set of production rules.")
            for rule in rules:
                if rule.condition is None or self.query(rule.condition, mapping):
                    break
            else:
                raise IndexError(f"no applicable rule for #{sym[1]}#")
            for s in rule.rhs:
                self._derive_symbol(s, mapping, variables, out)
        elif kind == "e":
            out.append(str(eval(sym[1], _EVAL_GLOBALS, variables)))  # noqa: S307 - game grammar
        elif kind == "c":
            for m, v in self._contexts(sym[2], mapping, variables):
                self._derive_symbol(sym[1], m, v, out)
        elif kind == "l":
            inner = sym[1]
            items = self._contexts(inner[2], mapping, variables) if inner[0] == "c" else []
            if not items:
                self._derive_symbol(("n", "list_empty"), mapping, variables, out)
                return
            last = len(items) - 1
            for i, (m, v) in enumerate(items):
                if i == last and i > 0:
                    self._derive_symbol(("n", "list_last_separator"), mapping, variables, out)
                elif i > 0:
                    self._derive_symbol(("n", "list_separator"), mapping, variables, out)
                self._derive_symbol(inner[1], m, v, out)
        else:
            raise ValueError(f"unknown symbol {sym!r}")

    def _contexts(self, query, mapping, variables):
        if not query:
            return [(mapping, variables)]
        entities = self.game.entities
        out = []
        for m in self.query(query, mapping):
            v = dict(variables)
            for (name, _), obj in m.items():
                v[name] = entities[obj]
            out.append((m, v))
        return out

    # -- canonical state ----------------------------------------------------------------------
    def describe(self, all_facts: bool = False) -> list[str]:
        """The facts ``state_key`` encodes, readable: ``"inreceptacle(apple 1, fridge 1)"``
        (with ``all_facts``, every true fluent fact, bookkeeping ones included)."""
        names = self.game.names
        keep = self.game.key_predicates
        return sorted(
            f"{pred}({', '.join(names.get(a, a).strip() for a in args)})"
            for pred, s in self.facts.items()
            if all_facts or pred in keep
            for args in s
        )

    def state_key(self) -> bytes:
        """The true fluent facts that matter, as canonical bytes (see ``ALFWorldEnv.state_key``)."""
        if self._key is not None:
            return self._key
        codes = self.game.fact_codes
        keep = self.game.key_predicates
        parts = []
        for pred, s in self.facts.items():
            if pred not in keep:
                continue
            for args in s:
                code = codes.get((pred, args))
                if code is None:
                    code = self.game.fact_code(pred, args)
                parts.append(code)
        parts.sort()
        self._key = self.game.key_prefix + b"".join(parts)
        return self._key
