"""Judges: per-round contribution scores in [0, 1] for CW-GRPO (``compute_advantage("cw_grpo")``).

A judge reads finished trajectories (:class:`agentgym.wrappers.group.Trajectory`, or anything
with ``steps`` whose items have ``observation``, ``action``, ``state_key`` and ``info``) and
says how much each round contributed to solving the task:

* :class:`ProgressJudge`: a rule judge for envs that report progress in their info; a round
  scores 1 when it raised the progress value (the Corridor env's ``info["score"]`` is the share
  of rooms passed, so a round scores 1 exactly when it advanced a room).
* :class:`SearchQAJudge`: a rule judge for search-QA: a search round scores 1 when it retrieved
  a passage holding a golden answer; the answer round scores its F1 against the golden answers.
* :class:`LLMJudge`: a Hugging Face causal LM asked, through a prompt template, whether the
  round helped; the score is ``P(yes) / (P(yes) + P(no))`` of the next token, batched.

``judge(trajectories)`` returns one float64 array per trajectory, shape (len(steps),);
:func:`row_contributions` flattens them in the trajectories' (trajectory, step) order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "DEFAULT_JUDGE_TEMPLATE",
    "Judge",
    "LLMJudge",
    "ProgressJudge",
    "SearchQAJudge",
    "row_contributions",
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


def row_contributions(trajectories: Sequence[_TrajectoryLike], judge: Judge) -> np.ndarray:
    """float64 (sum of lengths,): the judge's scores, trajectory after trajectory, step order."""
    scores = judge(trajectories)
    return np.concatenate(scores) if scores else np.zeros(0)


class ProgressJudge(Judge):
    """A round scores 1 when it raised ``info[key]`` above every earlier value, else 0.

    The progress before the first round is ``start`` (the Corridor env starts at score 0 and
    each room passed adds ``1 / length``). A dead end and the ``back`` out of it leave the
    progress where it was, so neither counts; the round through the right door does.
    """

    def __init__(self, key: str = "score", start: float = 0.0) -> None:
        self.key, self.start = key, float(start)

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        out = []
        for traj in trajectories:
            progress = np.array(
                [float(s.info.get(self.key, self.start)) for s in traj.steps], dtype=np.float64
            )
            best_before = np.maximum.accumulate(np.concatenate([[self.start], progress]))[:-1]
            out.append((progress > best_before).astype(np.float64))
        return out


class SearchQAJudge(Judge):
    """Search-QA rule judge: did the round retrieve a passage holding a golden answer.

    The retrieved passage ids of a round are those its ``info["state_key"][1]`` (the passages
    retrieved so far, after the round) adds to its ``state_key[1]`` (before the round);
    ``passage_text`` maps an id to its text (a dict, or e.g. a retriever's document lookup).
    The golden answers come from the trajectory's answer round (``info["golden_answers"]``),
    or from ``golden_answers`` by ``info["task_id"]`` for trajectories that never answered.
    A passage holds an answer when the normalised answer (SQuAD normalisation, as the env's
    exact match) is a substring of the normalised passage. The answer round scores its F1.
    """

    def __init__(
        self,
        passage_text: Mapping[str, str] | Callable[[str], str],
        golden_answers: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._text = passage_text.__getitem__ if isinstance(passage_text, Mapping) else passage_text
        self._golden = golden_answers or {}

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        from agentgym.envs.searchqa.qa import normalize_answer

        out = []
        for traj in trajectories:
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


class LLMJudge(Judge):
    """A causal LM judges each round: score = ``P(yes) / (P(yes) + P(no))`` for its next token.

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``), already on its device.
        tokenizer: its tokenizer; a missing pad token is set to the EOS token.
        template: a ``str.format`` template with ``{observation}``, ``{action}`` and
            ``{result}`` (the observation after the round: the next step's observation, or
            ``info["result"]`` / the empty string at the end).
        yes, no: the answer words; the first token of each (with a leading space) is compared.
        batch_size: prompts per forward pass.
        max_prompt_tokens: prompts are truncated from the left to this many tokens (the end
            of the template, where the question is, is kept).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: str = DEFAULT_JUDGE_TEMPLATE,
        yes: str = " yes",
        no: str = " no",
        batch_size: int = 16,
        max_prompt_tokens: int = 1024,
    ) -> None:
        self.model, self.tokenizer, self.template = model, tokenizer, template
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

    def prompts(self, trajectories: Sequence[_TrajectoryLike]) -> list[str]:
        """The judge's prompt of every round, trajectory after trajectory."""
        out = []
        for traj in trajectories:
            steps = traj.steps
            for t, step in enumerate(steps):
                result = (
                    steps[t + 1].observation
                    if t + 1 < len(steps)
                    else str(step.info.get("result", ""))
                )
                out.append(
                    self.template.format(
                        observation=step.observation, action=step.action, result=result
                    )
                )
        return out

    def score(self, trajectories: Sequence[_TrajectoryLike]) -> list[np.ndarray]:
        import torch

        prompts = self.prompts(trajectories)
        flat = np.zeros(len(prompts))
        device = next(self.model.parameters()).device
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"  # the last position is every prompt's next token
        self.tokenizer.truncation_side = "left"
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
        out, start = [], 0
        for traj in trajectories:
            out.append(flat[start : start + len(traj.steps)])
            start += len(traj.steps)
        return out
