"""A scripted searcher for the synthetic questions: search the entity, read, follow the hops.

It reads only what an agent reads (the question and the passages the env returns) plus the
question wording of :data:`.synthetic.QUESTION_TEMPLATES`, which tells it the start entity and
the relation chain. Each turn it searches ``"<entity> <relation keyword>"``, reads the fact
sentence about that entity from the returned passages, and moves to the object; after the last
hop it answers. A hop whose fact is not in the top-k passages ends the episode with its best
guess (the last entity it reached), so retrieval misses show up as wrong answers.

:class:`ScriptedSearchPolicy` has the signature of :func:`agentgym.rollout.random_policy`
(``policy(obs, infos, rng) -> actions``), so it drives ``run_group_rollout`` directly; it keeps
one small plan per env slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.envs.searchqa.synthetic import QUESTION_TEMPLATES, RELATIONS

__all__ = ["ScriptedSearchPolicy", "SearchPlan", "parse_question"]

_TEMPLATE_RES = [
    (tpl, re.compile("^" + re.escape(tpl.text).replace(re.escape("{e}"), "([A-Z].*?)") + "$"))
    for tpl in QUESTION_TEMPLATES
]


def parse_question(question: str) -> tuple[str, tuple[str, ...]] | None:
    """``(start entity, relation chain)`` of a synthetic question, or None if it is not one.

    >>> parse_question("In which country was Dovan Keltrix born?")
    ('Dovan Keltrix', ('born_in', 'located_in'))
    """
    for tpl, pattern in _TEMPLATE_RES:
        m = pattern.match(question.strip())
        if m:
            return m.group(1), tpl.chain
    return None


@dataclass
class SearchPlan:
    """Where one episode of the scripted searcher stands."""

    question: str
    entity: str
    chain: tuple[str, ...]
    hop: int = 0
    visited: list[str] = field(default_factory=list)

    def query(self) -> str:
        keyword = RELATIONS[self.chain[self.hop]][2]
        return f"{self.entity} {keyword}"

    def read(self, observation: str) -> bool:
        """Follow the current hop if the observation states it; True if it did."""
        pattern = RELATIONS[self.chain[self.hop]][3].format(s=re.escape(self.entity))
        m = re.search(pattern, observation)
        if m is None:
            return False
        self.entity = m.group(1)
        self.visited.append(self.entity)
        self.hop += 1
        return True

    def next_action(self, observation: str | None) -> str:
        """The action after ``observation`` (None right after reset)."""
        if observation is not None and self.hop < len(self.chain):
            if not self.read(observation):
                return f"answer[{self.entity}]"  # retrieval missed the fact: best guess
        if self.hop >= len(self.chain):
            return f"answer[{self.entity}]"
        return f"search[{self.query()}]"


class ScriptedSearchPolicy:
    """Policy over a batch of env slots (``policy(obs, infos, rng) -> list of actions``).

    A slot starts a new plan whenever its observation is its question (after a reset); slots
    whose question is not a synthetic one answer ``answer[unknown]``.
    """

    def __init__(self) -> None:
        self._plans: dict[int, SearchPlan | None] = {}

    def __call__(
        self, obs: list[str], infos: list[dict[str, Any]], rng: np.random.Generator | None = None
    ) -> list[str]:
        return [self.act(i, o, info) for i, (o, info) in enumerate(zip(obs, infos, strict=True))]

    def act(self, slot: int, observation: str, info: dict[str, Any]) -> str:
        question = info.get("question", "")
        if observation == question or slot not in self._plans:
            parsed = parse_question(question)
            self._plans[slot] = None if parsed is None else SearchPlan(question, *parsed)
            plan = self._plans[slot]
            return "answer[unknown]" if plan is None else plan.next_action(None)
        plan = self._plans[slot]
        if plan is None:
            return "answer[unknown]"
        return plan.next_action(observation)
