"""Judges: per-round contribution scores in [0, 1] for CW-GRPO (``compute_advantage("cw_grpo")``).

A judge reads finished trajectories (:class:`agentgym.wrappers.group.Trajectory`, or anything
with ``steps`` whose items have ``observation``, ``action``, ``state_key`` and ``info``) and
says how much each round contributed to solving the task:

* :class:`ProgressJudge`: a rule judge for envs that report progress in their info; a round
  scores 1 when it raised the progress value (the Corridor env's ``info["score"]`` is the share
  of rooms passed, so a round scores 1 exactly when it advanced a room).
  ALFWorld reports ``info["goal_progress"]`` (the share of the goal's facts that hold for one
  choice of objects) and ``info["goal_facts_met"]`` (the share some object meets), so the same
  judge over both keys scores a round 1 when it made a goal fact true; Sokoban's ``score`` is
  the share of boxes on targets.
* :class:`SearchQAJudge`: a rule judge for search-QA: a search round scores 1 when it retrieved
  a passage holding a golden answer (the env's ``info["retrieved_answer"]``); the answer round
  scores its F1 against the golden answers.
* :class:`LLMJudge`: a Hugging Face causal LM asked, through one or more prompt templates,
  whether the round helped; each template's score is ``P(yes) / (P(yes) + P(no))`` of the next
  token and the round's score is their product (CW-GRPO's judge multiplies a retrieval-utility
  and a reasoning-correctness verdict: :data:`CW_GRPO_TEMPLATES`), batched.

:func:`rule_judge` gives the rule judge of an env family (``corridor``, ``sokoban``,
``alfworld``, ``searchqa``): each family declares it in its package's ``FAMILY.rule_judge``
(a :class:`~agentgym.family.JudgeSpec`) and :func:`build_judge` builds it. ``judge(trajectories)`` returns one float64 array per trajectory,
shape (len(steps),); ``judge.score_last(trajectories)`` scores only each trajectory's last
round (what a step-level rollout needs after every step); :func:`row_contributions` flattens
``judge(trajectories)`` in the trajectories' (trajectory, step) order.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from agentgym.answers import normalize_answer
from agentgym.family import FamilySpec, FamilyTable, JudgeSpec, family_spec

__all__ = [
    "CW_GRPO_TEMPLATES",
    "DEFAULT_JUDGE_TEMPLATE",
    "LLM_JUDGE_PROMPTS",
    "RULE_JUDGES",
    "JUDGE_KINDS",
    "Judge",
    "LLMJudge",
    "ProgressJudge",
    "SearchQAJudge",
    "build_judge",
    "llm_judge_templates",
    "row_contributions",
    "rule_judge",
]


class _StepLike(Protocol):
    observation: str
    action: str
    state_key: Hashable
    info: dict[str, Any]


class _TrajectoryLike(Protocol):
    steps: Sequence[_StepLike]


class Judge(abc.ABC):
    """Scores every round of every trajectory: ``judge(trajs) -> [float64 (len(steps),), ...]``."""

    @abc.abstractmethod
    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        """Contribution of each round, in [0, 1], one array per trajectory."""

    def __call__(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        scores = self.score(trajectories)
        for traj, s in zip(trajectories, scores, strict=True):
            if s.shape != (len(traj.steps),) or not ((s >= 0.0) & (s <= 1.0)).all():
                raise ValueError(
                    f"{type(self).__name__} must give one score in [0, 1] per round; got {s!r}"
                )
        return scores

    def score_last(self, trajectories: Sequence[_TrajectoryLike]) -> np.ndarray:
        """float64 (len(trajectories),): the score of each trajectory's last round (each needs
        at least one step). Judges whose rounds cost something to score (an LLM) override it to
        score only those rounds."""
        if any(not traj.steps for traj in trajectories):
            raise ValueError("score_last needs trajectories of at least one step")
        return np.array([s[-1] for s in self(trajectories)], dtype=np.float64)


def row_contributions(trajectories: Sequence[_TrajectoryLike], judge: Judge) -> np.ndarray:
    """float64 (sum of lengths,): the judge's scores, trajectory after trajectory, step order."""
    scores = judge(trajectories)
    return np.concatenate(scores) if scores else np.zeros(0)


class ProgressJudge(Judge):
    """A round scores 1 when it raised ``info[key]``, else 0.

    ``since="best"``: raised above every earlier value (the Corridor env starts at score 0 and
    each room passed adds ``1 / length``; a dead end and the ``back`` out of it leave it where
    it was, so neither counts, and a value lost and regained never scores twice, so no loop
    farms the judge). ``since="previous"``: raised above its value just before the round, into
    a state (``info["state_key"]``) the trajectory had not been in before. ALFWorld needs
    this: a goal fact is often undone on the way (taking the ladle off the countertop, where
    the goal wants it, to clean it), and the cleaning round must still count; a take-and-put-
    back loop returns to a state already seen and scores nothing.

    With several keys a round scores 1 when it raised any of them. The value before the first
    round is the trajectory's ``start_info[key]`` (the reset info, which
    :class:`~agentgym.wrappers.group.GroupVectorEnv` records), else ``start``. ALFWorld's judge
    reads ``("goal_progress", "goal_facts_met")`` with ``since="previous"``.
    """

    def __init__(
        self, key: str | Sequence[str] = "score", start: float = 0.0, since: str = "best"
    ) -> None:
        self.keys = (key,) if isinstance(key, str) else tuple(key)
        if not self.keys:
            raise ValueError("ProgressJudge needs at least one info key")
        if since not in ("best", "previous"):
            raise ValueError(f"since must be 'best' or 'previous', got {since!r}")
        self.start, self.since = float(start), since

    @property
    def key(self) -> str:
        """The first (with one key, the only) info key read."""
        return self.keys[0]

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        out = []
        for traj in trajectories:
            begin = getattr(traj, "start_info", None) or {}
            raised = np.zeros(len(traj.steps), dtype=bool)
            for key in self.keys:
                first = float(begin.get(key, self.start))
                value = np.array(
                    [first] + [float(s.info.get(key, first)) for s in traj.steps], np.float64
                )
                if self.since == "best":
                    raised |= value[1:] > np.maximum.accumulate(value)[:-1]
                else:
                    raised |= value[1:] > value[:-1]
            if self.since == "previous" and raised.any():
                seen = {begin.get("state_key", traj.steps[0].state_key if traj.steps else None)}
                for t, step in enumerate(traj.steps):
                    after = step.info.get("state_key")
                    if after in seen:
                        raised[t] = False  # back in a state already seen: nothing achieved
                    seen.add(after)
            out.append(raised.astype(np.float64))
        return out


class SearchQAJudge(Judge):
    """Search-QA rule judge: did the round retrieve a passage holding a golden answer.

    The env knows: ``AgentGym/SearchQA-v0`` sets ``info["retrieved_answer"]`` on every step (a
    search round that brought a new passage containing a golden answer), and that is what this
    judge reads, so it needs no passage texts and works on trajectories played in other
    processes. For trajectories without that key (recorded elsewhere), give ``passage_text``:
    the round's new passage ids are those its ``info["state_key"][1]`` (the passages retrieved
    so far, after the round) adds to its ``state_key[1]`` (before the round), and
    ``passage_text`` maps an id to its text (a dict, or e.g. a retriever's document lookup).
    The golden answers then come from the trajectory's answer round (``info["golden_answers"]``),
    or from ``golden_answers`` by ``info["task_id"]`` for trajectories that never answered.
    A passage holds an answer when the normalised answer (SQuAD normalisation, as the env's
    exact match) is a substring of the normalised passage. The answer round scores its F1.
    """

    def __init__(
        self,
        passage_text: Mapping[str, str] | Callable[[str], str] | None = None,
        golden_answers: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if isinstance(passage_text, Mapping):
            self._text: Callable[[str], str] | None = passage_text.__getitem__
        else:
            self._text = passage_text
        self._golden = golden_answers or {}

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        out = []
        for traj in trajectories:
            if all("retrieved_answer" in step.info or "f1" in step.info for step in traj.steps):
                out.append(
                    np.array(
                        [
                            float(step.info["f1"])
                            if "f1" in step.info
                            else float(bool(step.info["retrieved_answer"]))
                            for step in traj.steps
                        ],
                        dtype=np.float64,
                    )
                )
                continue
            if self._text is None:
                raise ValueError(
                    "these search-QA steps carry no info['retrieved_answer'] (they were not "
                    "played by AgentGym/SearchQA-v0): give SearchQAJudge(passage_text=...) so "
                    "it can read the retrieved passages"
                )
            golden: Sequence[str] = ()
            for step in traj.steps:
                golden = step.info.get("golden_answers") or golden
            if not golden and traj.steps:
                golden = self._golden.get(traj.steps[0].info.get("task_id", ""), ())
            answers = [a for a in (normalize_answer(g) for g in golden) if a]
            scores = np.zeros(len(traj.steps))
            for t, step in enumerate(traj.steps):
                if "f1" in step.info:  # the answer round
                    scores[t] = float(step.info["f1"])
                    continue
                before, after = _retrieved(step.state_key), _retrieved(step.info.get("state_key"))
                new = after - before
                if answers and any(
                    a in normalize_answer(self._text(doc)) for doc in new for a in answers
                ):
                    scores[t] = 1.0
            out.append(scores)
        return out


def _retrieved(state_key: Any) -> frozenset:
    """The retrieved-passage ids of a search-QA state key (question id, ids, answer)."""
    if isinstance(state_key, tuple) and len(state_key) == 3:
        return frozenset(state_key[1])
    return frozenset()


DEFAULT_JUDGE_TEMPLATE = (
    "Task progress review.\n"
    "The agent saw:\n{observation}\n"
    "It did: {action}\n"
    "Result:\n{result}\n"
    "Did this step help solve the task? Answer yes or no.\nAnswer:"
)
"""prompt of :class:`LLMJudge`; fields ``observation``, ``action``, ``result`` (next text)"""

CW_GRPO_TEMPLATES = (
    "Search round review.\n"
    "Before this round the agent saw:\n{observation}\n"
    "It did: {action}\n"
    "It got back:\n{result}\n"
    "Did this round bring new information that is relevant to the question and was not "
    "already retrieved before? Answer yes or no.\nAnswer:",
    "Search round review.\n"
    "Before this round the agent saw:\n{observation}\n"
    "It did: {action}\n"
    "Is this action supported by what the agent had already found, and does it seek what is "
    "still missing to answer (or answer as that information says)? Answer yes or no.\nAnswer:",
)
"""CW-GRPO's two verdicts per round, retrieval utility and reasoning correctness, whose product
is the round's contribution (the paper's judge gives each 0 or 1; here each is P(yes))"""


LLM_JUDGE_PROMPTS: dict[str, tuple[str, ...]] = {
    "progress": (DEFAULT_JUDGE_TEMPLATE,),
    "search_rounds": CW_GRPO_TEMPLATES,
}
"""the prompt sets a family's ``FAMILY.llm_judge`` may name (:func:`llm_judge_templates`)"""


def llm_judge_templates(family: str | None) -> tuple[str, ...]:
    """The templates an :class:`LLMJudge` scores the rounds of ``family`` with, as its package's
    ``FAMILY.llm_judge`` says; ``"progress"`` (:data:`DEFAULT_JUDGE_TEMPLATE`) for a family that
    declares none or is not registered.

    >>> llm_judge_templates("searchqa") == CW_GRPO_TEMPLATES
    True
    >>> llm_judge_templates("sokoban") == (DEFAULT_JUDGE_TEMPLATE,)
    True

    Raises:
        ValueError: the family names a prompt set that :data:`LLM_JUDGE_PROMPTS` lacks.
    """
    spec = family_spec(family) if family is not None else None
    chosen = spec.llm_judge if spec is not None else "progress"
    if not isinstance(chosen, str):
        return chosen
    if chosen not in LLM_JUDGE_PROMPTS:
        raise ValueError(
            f"the {family!r} family's FAMILY.llm_judge names an unknown prompt set {chosen!r}; "
            f"use one of {sorted(LLM_JUDGE_PROMPTS)} or a tuple of templates"
        )
    return LLM_JUDGE_PROMPTS[chosen]


class LLMJudge(Judge):
    """A causal LM judges each round: score = ``P(yes) / (P(yes) + P(no))`` for its next token.

    With several templates the round's score is the product of their scores (CW-GRPO's
    contribution is retrieval utility times reasoning correctness: pass
    ``templates=CW_GRPO_TEMPLATES``).

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``), already on its device.
        tokenizer: its tokenizer; a missing pad token is set to the EOS token.
        template: a ``str.format`` template, or a sequence of them, with ``{observation}``,
            ``{action}`` and ``{result}`` (the observation after the round: the next step's
            observation, or ``info["result"]`` / the empty string at the end).
        yes, no: the answer words; the first token of each (with a leading space) is compared.
        batch_size: prompts per forward pass.
        max_prompt_tokens: prompts are truncated from the left to this many tokens (the end
            of the template, where the question is, is kept).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: str | Sequence[str] = DEFAULT_JUDGE_TEMPLATE,
        yes: str = " yes",
        no: str = " no",
        batch_size: int = 16,
        max_prompt_tokens: int = 1024,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.templates = (template,) if isinstance(template, str) else tuple(template)
        if not self.templates:
            raise ValueError("LLMJudge needs at least one template")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        ids = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in (yes, no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise ValueError(
                f"the tokenizer must give {yes!r} and {no!r} different first tokens; pick "
                "other answer words"
            )
        self.yes_id, self.no_id = ids[0][0], ids[1][0]
        self.batch_size, self.max_prompt_tokens = batch_size, max_prompt_tokens

    @property
    def template(self) -> str:
        """The first (with one template, the only) prompt template."""
        return self.templates[0]

    def _fields(self, steps: Sequence[_StepLike], t: int) -> dict[str, str]:
        step = steps[t]
        result = (
            steps[t + 1].observation if t + 1 < len(steps) else str(step.info.get("result", ""))
        )
        return {"observation": step.observation, "action": step.action, "result": result}

    def prompts(self, trajectories: Sequence[_TrajectoryLike]) -> list[str]:
        """The judge's prompts of every round, trajectory after trajectory, then template after
        template (``len(templates) x rounds`` prompts)."""
        fields = [self._fields(t.steps, i) for t in trajectories for i in range(len(t.steps))]
        return [tpl.format(**f) for tpl in self.templates for f in fields]

    def _yes_probability(self, prompts: list[str]) -> np.ndarray:
        """float64 (len(prompts),): ``P(yes) / (P(yes) + P(no))`` of each prompt's next token."""
        import torch

        flat = np.zeros(len(prompts))
        device = next(self.model.parameters()).device
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"  # the last position is every prompt's next token
        self.tokenizer.truncation_side = "left"
        was_training = getattr(self.model, "training", False)
        self.model.eval()  # the policy may judge between its updates: no dropout in a verdict
        try:
            with torch.inference_mode():
                for lo in range(0, len(prompts), self.batch_size):
                    enc = self.tokenizer(
                        prompts[lo : lo + self.batch_size],
                        return_tensors="pt",
                        padding=True,
                        truncation=True,
                        max_length=self.max_prompt_tokens,
                    ).to(device)
                    logits = self.model(**enc).logits[:, -1, :].float()
                    pair = torch.stack([logits[:, self.yes_id], logits[:, self.no_id]], dim=1)
                    flat[lo : lo + len(pair)] = torch.softmax(pair, dim=1)[:, 0].cpu().numpy()
        finally:
            self.tokenizer.padding_side = side
            self.model.train(was_training)
        return flat

    def _product(self, probabilities: np.ndarray, rounds: int) -> np.ndarray:
        return probabilities.reshape(len(self.templates), rounds).prod(axis=0)

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        rounds = sum(len(t.steps) for t in trajectories)
        flat = self._product(self._yes_probability(self.prompts(trajectories)), rounds)
        out, start = [], 0
        for traj in trajectories:
            out.append(flat[start : start + len(traj.steps)])
            start += len(traj.steps)
        return out

    def score_last(self, trajectories: Sequence[_TrajectoryLike]) -> np.ndarray:
        if any(not traj.steps for traj in trajectories):
            raise ValueError("score_last needs trajectories of at least one step")
        fields = [self._fields(t.steps, len(t.steps) - 1) for t in trajectories]
        prompts = [tpl.format(**f) for tpl in self.templates for f in fields]
        return self._product(self._yes_probability(prompts), len(trajectories))


#: The judges a family's :class:`~agentgym.family.JudgeSpec` may name by ``kind``.
JUDGE_KINDS: dict[str, Callable[..., Judge]] = {
    "progress": ProgressJudge,
    "searchqa": SearchQAJudge,
}


def build_judge(spec: JudgeSpec) -> Judge:
    """The judge a :class:`~agentgym.family.JudgeSpec` describes: a :data:`JUDGE_KINDS` judge,
    or the ``module:callable`` it names, called with ``spec.options``."""
    make = JUDGE_KINDS.get(spec.kind)
    if make is None:
        module, sep, attr = spec.kind.partition(":")
        if not sep:
            raise ValueError(
                f"unknown judge kind {spec.kind!r}; use one of {sorted(JUDGE_KINDS)} or a "
                "'module:callable' that returns a Judge"
            )
        make = getattr(importlib.import_module(module), attr)
    judge = make(**spec.options)
    if not isinstance(judge, Judge):
        raise TypeError(f"judge {spec.kind!r} gave {type(judge).__name__}, not a Judge")
    return judge


def _family_judge(name: str, spec: FamilySpec) -> Callable[[], Judge] | None:
    judge = spec.rule_judge
    return None if judge is None else (lambda: build_judge(judge))


RULE_JUDGES: FamilyTable[Callable[[], Judge]] = FamilyTable(_family_judge)
"""env family -> a factory of its rule judge, a view of what each family declares
(``FAMILY.rule_judge`` in its package): what the env knows about a round's contribution.
``RULE_JUDGES[family] = factory`` sets one for a family that declares none."""


def rule_judge(family: str) -> Judge:
    """The rule judge of an env family (``env.unwrapped.family``), as its package's
    ``FAMILY.rule_judge`` describes it (see :data:`RULE_JUDGES`).

    Raises:
        ValueError: the family reports nothing a rule could score a round by (WebShop's score
            exists only at the purchase): use an :class:`LLMJudge` there.
    """
    make = RULE_JUDGES.get(family)
    if make is None:
        raise ValueError(
            f"no rule judge for the {family!r} family (its info holds no per-round ground "
            f"truth); rule judges exist for {', '.join(sorted(RULE_JUDGES))}: use an LLM judge "
            "(the trainer's --judge llm) for this env"
        )
    return make()
