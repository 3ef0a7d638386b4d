"""What shared code asks of an env family, declared once by the family's own folder.

Each family package (``agentgym/envs/<family>/__init__.py``, or any package an :class:`EnvEntry
<agentgym.envs.EnvEntry>` points to) defines ``FAMILY = FamilySpec(...)``: the LLM prompt
template its envs are rendered with, its rule judge, its defaults for a trainer's config and the
env variable its real data is read from. Shared code looks a family up by name with
:func:`family_spec`:

* :func:`agentgym.wrappers.llm.make_llm_env` takes the prompt of ``env.unwrapped.family``;
* :func:`agentgym.algorithms.judges.rule_judge` builds the judge ``FAMILY.rule_judge`` describes;
* :func:`agentgym.algorithms.judges.llm_judge_templates` prompts an LLM judge as
  ``FAMILY.llm_judge`` says;
* the bundled trainer's ``Config.for_env`` starts from ``FAMILY.trainer_defaults``, and its
  ``--policy scored`` (choose among listed actions) refuses a family without
  ``FAMILY.lists_actions``;
* the test suite's real-data fixtures set ``FAMILY.data_env_var``.

So a new family is one folder (its env, its ``FAMILY``) plus one registration line (its
``EnvEntry``); nothing about it is written anywhere else.

The spec is plain data on purpose: ``agentgym.envs`` never imports ``agentgym.wrappers`` or
``agentgym.algorithms`` (and ``agentgym.algorithms`` never imports ``agentgym.envs``), so the
prompt is a :class:`PromptTemplate` defined here and the judge a :class:`JudgeSpec` that the
algorithms side turns into a judge. The step cap is not part of the spec: the registry entry's
cap is the only one.

Family packages are imported on first lookup (importing one costs ~0.1 s), never at
``import agentgym``.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

__all__ = [
    "HISTORY_INTRO",
    "ActionFormat",
    "FamilySpec",
    "FamilyTable",
    "JudgeSpec",
    "PromptTemplate",
    "family_names",
    "family_spec",
    "register_family",
]


ActionFormat = Literal["think_action", "search_answer", "plain"]
"""the ``fmt=`` argument of the LLM wrappers: how model text holds the action (rules in
:mod:`agentgym.wrappers.llm`)"""


@dataclass(frozen=True)
class PromptTemplate:
    """How one family's prompts look.

    ``first`` is used before any step has been taken (or when ``history_length`` is 0), ``later``
    afterwards. Both are :meth:`str.format` strings over these fields:

    ``{task_line}``        ``task_prefix + task + "\\n"``, or "" without a task
    ``{task}``             the task text ("" without one)
    ``{observation}``      the current env observation
    ``{admissible_line}``  ``admissible_line`` filled with the listed actions, or "" when the env
                           gives none
    ``{step_count}``       steps taken so far; ``{current_step}`` is ``step_count + 1``
    ``{history_length}``   how many past steps ``{history}`` shows
    ``{history}``          the recent steps, one per line (see ``history_style``)
    ``{instruction}``      the output-format instruction for the parser's format
    """

    first: str
    later: str
    task_prefix: str = "Your task is: "
    admissible_line: str = "Your admissible actions of the current situation are: [{actions}].\n"
    admissible_style: str = "quoted_lines"
    """``quoted_lines`` (verl-agent ALFWorld: ``'a'\\n 'b'``, ``help`` dropped), ``json``
    (Sokoban: ``"a", "b"``) or ``quoted_commas`` (WebShop: ``'a',\\n'b',``)"""
    default_admissible: tuple[str, ...] | None = None
    """listed when the env gives no admissible actions (Sokoban's four moves)"""
    history_style: str = "pairs"
    """``pairs``: ``[Observation n: '...', Action n: '...']`` lines (verl-agent's memory);
    ``search``: each query with the results it returned, in ``<search>``/``<information>`` tags"""
    instructions: tuple[tuple[str, str], ...] = ()
    """(format, instruction) overrides of the LLM wrappers' ``FORMAT_INSTRUCTIONS`` for this
    family"""
    default_fmt: ActionFormat = "think_action"
    """the action format this family's prompts ask for"""
    task_from_observation: bool = False
    """use the first observation as the task when the env's info names none (QA questions)"""
    task_key: tuple[str, ...] | None = None
    """the info keys the task is read from, tried in order; ``"goal.instruction_text"`` reads
    ``info["goal"]["instruction_text"]`` (a structured goal must not reach the prompt whole: it
    may hold the answer). A family's keys hold whatever template renders its envs (the
    trainer's compact ones too). None: ``("goal", "question", "instruction")``"""


#: verl-agent's history paragraph, shared by the templates that show (observation, action) pairs.
HISTORY_INTRO = (
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took:\n{history}\n"
    "You are now at step {current_step} and your current observation is: {observation}\n"
)


@dataclass(frozen=True)
class JudgeSpec:
    """A family's rule judge, as data :func:`agentgym.algorithms.judges.rule_judge` builds from.

    ``kind`` names a judge of :mod:`agentgym.algorithms.judges` (``"progress"``:
    ``ProgressJudge``, a round scores 1 when it raised an info value; ``"searchqa"``:
    ``SearchQAJudge``), or is a ``"module:callable"`` string for a family's own judge (called
    with ``options``; it returns a ``Judge``). ``options`` are the judge's keyword arguments.
    """

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FamilySpec:
    """Everything shared code asks of one env family (see the module docstring).

    A family's package declares one; shared code reads it by name with :func:`family_spec`:

    >>> FAMILY = FamilySpec(
    ...     prompt=PromptTemplate(first="{observation}\\n{instruction}",
    ...                           later="{history}\\n{observation}\\n{instruction}",
    ...                           default_fmt="plain"),
    ...     rule_judge=JudgeSpec("progress", {"key": "score"}),  # a round that raised score: 1
    ...     trainer_defaults={"lr": 1e-5},
    ... )
    >>> FAMILY.lists_actions, FAMILY.llm_judge, FAMILY.prompt.default_fmt
    (True, 'progress', 'plain')
    >>> FamilySpec(trainer_defaults={"max_steps": 5})
    Traceback (most recent call last):
    ValueError: trainer_defaults must not hold max_steps: the step cap is the registry entry's (EnvEntry(max_episode_steps=...))
    """

    prompt: PromptTemplate | None = None
    """the LLM prompt its envs are rendered with; None: the wrappers' generic template"""
    rule_judge: JudgeSpec | None = None
    """how to score a round from what the env reports; None where its info holds no per-round
    ground truth (an LLM judge is needed there)"""
    trainer_defaults: Mapping[str, Any] = field(default_factory=dict)
    """a trainer's config fields that differ from its defaults for this family (the bundled
    trainer's ``Config`` names: ``train_split``, ``eval_split``, ``max_new_tokens``...); never
    the step cap, which is the registry entry's"""
    data_env_var: str | None = None
    """the env variable its real data is read from (``ALFWORLD_DATA``); None for families that
    generate their tasks"""
    lists_actions: bool = True
    """whether its envs list ``info["admissible_actions"]`` (on every reset and step); False
    where actions are free text (SearchQA's queries and answers) and ``admissible_actions`` is
    always None: a policy that chooses among listed actions cannot play it"""
    llm_judge: str | tuple[str, ...] = "progress"
    """how an LLM judge is prompted to score one of its rounds: a name in
    :data:`agentgym.algorithms.judges.LLM_JUDGE_PROMPTS` (``"progress"``: did this step help
    solve the task; ``"search_rounds"``: CW-GRPO's retrieval utility x reasoning soundness), or
    the ``str.format`` templates themselves (fields ``observation``, ``action``, ``result``; a
    round's score is the product of the templates' verdicts)"""

    def __post_init__(self) -> None:
        if not isinstance(self.llm_judge, str) and not (
            isinstance(self.llm_judge, tuple)
            and self.llm_judge
            and all(isinstance(t, str) for t in self.llm_judge)
        ):
            raise TypeError(
                f"llm_judge must be a prompt-set name or a non-empty tuple of templates, not "
                f"{self.llm_judge!r}"
            )
        # One cap: a trainer passing a second one would override the registry's silently.
        capped = {"max_episode_steps", "max_steps"} & self.trainer_defaults.keys()
        if capped:
            raise ValueError(
                f"trainer_defaults must not hold {min(capped)}: the step cap is the registry "
                "entry's (EnvEntry(max_episode_steps=...))"
            )


# family name -> the module that defines its FAMILY (filled by agentgym.register_envs)
_MODULES: dict[str, str] = {}
_SPECS: dict[str, FamilySpec | None] = {}


def register_family(name: str, module: str) -> None:
    """Record that family ``name`` is declared by ``module`` (its ``FAMILY``, or a parent
    package's). :func:`agentgym.register_envs` does this for every registry entry, from the
    module of its entry point."""
    if _MODULES.get(name) != module:
        _MODULES[name] = module
        _SPECS.pop(name, None)


def family_names() -> list[str]:
    """The registered families, in registration order."""
    return list(_MODULES)


def family_spec(name: str) -> FamilySpec | None:
    """The :class:`FamilySpec` of family ``name``, or None when no registered family has that
    name or its package declares no ``FAMILY`` (shared code then uses its generic defaults).

    The family's package is imported on the first call for that family.

    >>> family_spec("sokoban").rule_judge
    JudgeSpec(kind='progress', options={'key': 'score'})
    >>> family_spec("searchqa").lists_actions, family_spec("searchqa").data_env_var
    (False, 'SEARCHQA_DATA')
    >>> family_spec("no-such-family") is None
    True
    """
    if name in _SPECS:
        return _SPECS[name]
    module = _MODULES.get(name)
    spec = _find_spec(module) if module is not None else None
    if module is not None and spec is None:
        # said once per family (the answer is cached): a forgotten FAMILY must not pass silently
        warnings.warn(
            f"the {name!r} family's package ({module}) declares no FAMILY: its envs get the "
            "generic prompt, no rule judge and no trainer defaults; define "
            "FAMILY = agentgym.family.FamilySpec(...) in it",
            stacklevel=2,
        )
    _SPECS[name] = spec
    return spec


def _find_spec(module: str) -> FamilySpec | None:
    # The entry point may be the family package itself or a module inside it: the nearest
    # package on the dotted path that defines FAMILY declares the family.
    parts = module.split(".")
    while parts:
        found = getattr(importlib.import_module(".".join(parts)), "FAMILY", None)
        if found is not None:
            if not isinstance(found, FamilySpec):
                raise TypeError(f"{'.'.join(parts)}.FAMILY must be a FamilySpec, not {found!r}")
            return found
        parts.pop()
    return None


V = TypeVar("V")


class FamilyTable(MutableMapping[str, V], Generic[V]):
    """A ``name -> value`` table built from the families: what ``select(name, spec)`` gives for
    each registered family (families it gives None for are left out), then ``fixed`` entries
    (names that belong to no family, and whatever callers add with ``table[k] = v``), then
    ``aliases`` (another name for a key, e.g. a name kept from an older release).

    The old module-level tables (``PROMPT_TEMPLATES``, ``RULE_JUDGES``...) are these views, so
    code that reads them sees every family without the family being written into them.

    >>> data_vars = FamilyTable(lambda name, spec: spec.data_env_var, fixed={"mine": "MINE_DATA"})
    >>> data_vars["alfworld"], data_vars["mine"], "sokoban" in data_vars  # sokoban: no data
    ('ALFWORLD_DATA', 'MINE_DATA', False)
    """

    def __init__(
        self,
        select: Callable[[str, FamilySpec], V | None],
        fixed: Mapping[str, V] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self._select = select
        self._fixed: dict[str, V] = dict(fixed or {})
        self._aliases = dict(aliases or {})

    def _from_family(self, key: str) -> V | None:
        if key in self._aliases and key not in _MODULES:
            key = self._aliases[key]
        spec = family_spec(key) if key in _MODULES else None
        return None if spec is None else self._select(key, spec)

    def __getitem__(self, key: str) -> V:
        if key in self._fixed:
            return self._fixed[key]
        value = self._from_family(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: V) -> None:
        self._fixed[key] = value

    def __delitem__(self, key: str) -> None:
        del self._fixed[key]  # a family's own entry goes with the family, not from here

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return key in self._fixed or self._from_family(key) is not None

    def __iter__(self) -> Iterator[str]:
        names = list(self._fixed)
        names += [
            n for n in family_names() if n not in self._fixed and self._from_family(n) is not None
        ]
        names += [a for a in self._aliases if a not in names and self._from_family(a) is not None]
        return iter(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"
