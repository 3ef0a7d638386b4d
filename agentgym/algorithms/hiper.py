"""HiPER: hierarchical plan-execute credit assignment (Peng et al., arXiv 2602.16165).

HiPER makes an agent's implicit plan explicit. At every turn the model may state a subgoal
before its action; a turn that starts a new subgoal is a **planner turn**, the turns that follow
it under the same subgoal are **executor turns**, and a planner turn with its executor turns is
a **segment**. Hierarchical Advantage Estimation (HAE, the paper's Sec. 4) credits the two
levels separately:

* the **planner** (segment level, an SMDP over segment boundaries): at the start ``b_k`` of
  segment k, of ``d_k`` turns, with discounted segment return
  ``R_k = sum_{j < d_k} gamma**j r_{b_k + j}``,
  ``delta_k = R_k + gamma**d_k V_H(s_{b_{k+1}}) - V_H(s_{b_k})`` and
  ``A_H(k) = delta_k + (gamma**d_k lam_seg) A_H(k+1)`` (0 past the last segment);
* the **executor** (turn level, GAE *within* the segment only): for turn t of the segment,
  ``delta_t = r_t + gamma V_next - V_L(s_t)`` with ``V_next = V_L(s_{t+1})`` inside the segment
  and ``V_H(s_{b_{k+1}})`` at its last turn (the SMDP boundary: the executor is credited for
  handing the next planner a good state), and ``A_L(t) = delta_t + gamma lam_turn A_L(t+1)``
  with the recursion cut at the segment's end.

With ``lam_turn = lam_seg = 1`` both telescope: ``A_H(k) = G_{b_k} - V_H(s_{b_k})`` (the
discounted return from the planner turn) and ``A_L(t) = G^seg_t + gamma**(e_k + 1 - t)
V_H(s_{b_{k+1}}) - V_L(s_t)``. The equations above follow the authors' implementation
(``hiper_hae/core_hae.py`` of JonP07/HiPER-agent), which we read to pin down every convention:

* the first turn of an episode always starts a segment; a turn starts one when the model says
  ``<switch>SWITCH</switch>`` (their tag format; a missing tag means KEEP there);
* the invalid-action penalty is subtracted from the turn's reward *before* the recursions (their
  ``invalid_action_penalty_coef``, 0.1 in their ALFWorld and WebShop scripts), so unlike
  :func:`~agentgym.algorithms.advantage.gigpo` it reaches the earlier turns of its segment
  and the segment's return;
* ``gamma`` and ``lam_turn`` default to 1.0 and ``lam_seg`` to 0.95 (their config defaults);
* the end of a trajectory is terminal (bootstrap 0: their ``bootstrap_truncated=False``);
* ``norm="mean_std_norm"`` whitens each level over the batch rows it applies to
  (``(A - mean) / (std + epsilon)``, population std, their ``norm_adv=True`` used in their
  scripts); ``"mean_norm"`` returns the advantages as estimated (their default
  ``norm_adv=False``: the baselines already centre them).

Where this library differs, and why:

* **no critic.** HiPER trains a critic with two heads for ``V_H`` and ``V_L``; agentgym's
  estimators are critic-free. :func:`hierarchical_advantages` takes critic values when a caller
  has them; the registered ``"hiper"`` estimator uses the critic-free stand-in of GiGPO's step
  groups: ``V(s)`` is the mean discounted return of the group's turns acting from the same
  ``state_key`` (so ``V_L = V_H = V``; a state visited once is its own baseline and gets 0).
* **no termination head and no shaping.** Their third value head (the advantage of the
  ``<switch>`` tokens) and their optional KEEP / consistency penalties (0 in their config
  defaults) are not implemented.
* **per-row output.** The estimator returns, per turn, the executor advantage ``A_L`` as
  ``advantages`` / ``step_advantage`` and the planner advantage ``A_H`` as
  ``episode_advantage`` (0 on executor turns). The authors put ``A_H`` on the subgoal tokens of
  planner turns and ``A_L`` on the action tokens; :func:`plan_execute_token_advantages` does
  the same from token masks. A trainer that broadcasts ``advantages`` to every token trains
  the executor only.

The action format that lets a model state subgoals is :func:`parse_subgoal` (an optional
``<switch>KEEP|SWITCH</switch>`` and ``<subgoal>...</subgoal>`` before the family's own
format) and the wrapper :class:`SubgoalActions`, which sits on top of any family's parser:
``PromptRenderer(SubgoalActions(ParseActions(env)))``; it reports ``info["subgoal_start"]``,
the ``segment_starts`` input of the estimator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agentgym.algorithms.advantage import (
    AdvantageBatch,
    AdvantageConfig,
    AdvantageResult,
    register_advantage,
    step_group_stats,
)
from agentgym.core import InvalidAction, coerce_action, describe_action

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_SUBGOAL_CHARS",
    "SUBGOAL_INSTRUCTION",
    "HiPERConfig",
    "SubgoalActions",
    "SubgoalReply",
    "hierarchical_advantages",
    "hiper",
    "parse_subgoal",
    "plan_execute_token_advantages",
]

# ---------------------------------------------------------------------------------------------
# The plan-execute action format
# ---------------------------------------------------------------------------------------------

MAX_SUBGOAL_CHARS = 256
"""longest subgoal kept (and shown back in prompts); a longer one is cut, not rejected"""

SUBGOAL_INSTRUCTION = (
    "Before your answer you may state the sub-goal you are working on as "
    "<switch>SWITCH</switch><subgoal>the new sub-goal</subgoal> when you start a new one, or "
    "<switch>KEEP</switch> to keep the current sub-goal."
)
"""a sentence to add to a prompt template's instruction so the model knows the format"""

_SHOWN = "\nCurrent sub-goal: "
_PLAN_TAGS = re.compile(r"<(/?)(subgoal|switch)>", re.IGNORECASE)
_SWITCH_VALUES = ("KEEP", "SWITCH")


@dataclass(frozen=True, slots=True)
class SubgoalReply:
    """The result of :func:`parse_subgoal`: the plan part of a reply and the rest of it.

    Invariant: ``error`` is None exactly when the plan blocks are well formed (a reply with no
    plan blocks at all is well formed). ``text`` is the reply with the plan blocks cut out, for
    the family's own parser.
    """

    subgoal: str | None
    """the stated subgoal, whitespace-collapsed, cut to :data:`MAX_SUBGOAL_CHARS`; None if none"""
    switch: bool | None
    """True for ``<switch>SWITCH</switch>``, False for ``KEEP``, None when there is no tag"""
    text: str
    """the reply without its plan blocks"""
    error: str | None
    """why the plan blocks are malformed, in words a model can act on; None when well formed"""


def _plan_block(
    text: str, tags: list[tuple[str, bool, int, int]], name: str
) -> tuple[tuple[int, int, int, int] | None, str | None]:
    """(open start, content start, content end, close end) of the one ``<name>`` block."""
    opens = [t for t in tags if t[0] == name and not t[1]]
    closes = [t for t in tags if t[0] == name and t[1]]
    if not opens and not closes:
        return None, None
    if len(opens) != 1 or len(closes) != 1:
        return None, f"expected at most one complete <{name}>...</{name}> block"
    if closes[0][2] < opens[0][3]:
        return None, f"</{name}> comes before <{name}>"
    return (opens[0][2], opens[0][3], closes[0][2], closes[0][3]), None


def parse_subgoal(text: Any) -> SubgoalReply:
    """Split a reply into its optional plan blocks and the rest; never raises.

    The plan blocks are ``<switch>KEEP</switch>`` or ``<switch>SWITCH</switch>`` and
    ``<subgoal>...</subgoal>``, each at most once, anywhere in the reply (tags match
    case-insensitively; the switch value too). Both are optional, so every existing format
    (``think_action``, ``search_answer``, ``plain``) still parses unchanged: a reply without
    them is returned whole as ``text``. Linear in the length of the reply.

    >>> r = parse_subgoal("<switch>SWITCH</switch><subgoal>find the  key</subgoal>"
    ...                   "<think>t</think><action>go north</action>")
    >>> r.subgoal, r.switch, r.text, r.error
    ('find the key', True, '<think>t</think><action>go north</action>', None)
    >>> parse_subgoal("<subgoal>x").error
    'expected at most one complete <subgoal>...</subgoal> block'
    """
    text = coerce_action(text)
    if text is None:
        return SubgoalReply(None, None, "", "the response is not text")
    tags = [
        (m.group(2).lower(), bool(m.group(1)), m.start(), m.end())
        for m in _PLAN_TAGS.finditer(text)
    ]
    if not tags:
        return SubgoalReply(None, None, text, None)
    spans = []
    subgoal: str | None = None
    switch: bool | None = None
    for name in ("switch", "subgoal"):
        span, error = _plan_block(text, tags, name)
        if error is not None:
            return SubgoalReply(None, None, text, error)
        if span is None:
            continue
        if any(span[1] <= t[2] and t[3] <= span[2] for t in tags):
            return SubgoalReply(None, None, text, f"tags are not allowed inside <{name}>")
        content = " ".join(text[span[1] : span[2]].split())
        if name == "switch":
            if content.upper() not in _SWITCH_VALUES:
                return SubgoalReply(
                    None, None, text, "<switch> must hold KEEP or SWITCH, got " + repr(content[:20])
                )
            switch = content.upper() == "SWITCH"
        else:
            subgoal = content[:MAX_SUBGOAL_CHARS] or None
        spans.append((span[0], span[3]))
    rest, pos = [], 0
    for start, end in sorted(spans):
        rest.append(text[pos:start])
        pos = end
    rest.append(text[pos:])
    return SubgoalReply(subgoal, switch, "".join(rest).strip(), None)


class SubgoalActions(gym.Wrapper):
    """Read the plan part of every reply, and pass the rest to the family's parser below.

    Wrap a :class:`~agentgym.wrappers.llm.ParseActions` (any family, any format):
    ``SubgoalActions(ParseActions(env, fmt))``, under a ``PromptRenderer`` if prompts are
    rendered. Each ``step(reply)`` parses the plan blocks (:func:`parse_subgoal`) and steps the
    env below with the rest of the reply. A turn starts a new segment (a planner turn) when

    * it is the first turn of the episode, or
    * it says ``<switch>SWITCH</switch>``, or
    * it has no ``<switch>`` tag and states a subgoal different from the current one
      (whitespace-collapsed, case-insensitive): stating a subgoal is enough to plan.

    ``<switch>KEEP</switch>`` keeps the current subgoal whatever the reply says. Malformed plan
    blocks (an unclosed tag, two blocks, a switch value other than KEEP/SWITCH) never raise:
    the env is stepped with a :class:`~agentgym.wrappers.llm.ParseFailure`, the turn is invalid
    (``info["action_valid"] = False``) and keeps the current subgoal.

    Added to ``info`` on every reset and step:

    - ``subgoal``: the subgoal in force after this turn (None before any was stated);
    - ``subgoal_start``: whether this turn started a segment (reset: False); the estimator's
      ``segment_starts`` input is this flag of every turn;
    - ``subgoal_error``: why the plan blocks were malformed (only on such steps).

    With ``show_subgoal`` (the default) a text observation ends with
    ``"\nCurrent sub-goal: <subgoal>"`` while one is in force, as the authors' prompts show
    it, so the model can decide to keep it; the observation space grows by that line's bound.
    Subgoals come from the model, so they are kept inside the env's charset
    (:func:`~agentgym.core.describe_action`) and cut to :data:`MAX_SUBGOAL_CHARS`.
    """

    def __init__(self, env: gym.Env, *, show_subgoal: bool = True) -> None:
        super().__init__(env)
        self.show_subgoal = show_subgoal
        self.subgoal: str | None = None
        self._turns = 0
        space = env.observation_space
        if show_subgoal and isinstance(space, spaces.Text):
            self.observation_space = spaces.Text(
                max_length=space.max_length + len(_SHOWN) + MAX_SUBGOAL_CHARS + 3,
                min_length=space.min_length,
                charset=space.characters,
            )

    def _show(self, obs: Any) -> Any:
        if self.show_subgoal and self.subgoal is not None and isinstance(obs, str):
            return f"{obs}{_SHOWN}{self.subgoal}"
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.subgoal, self._turns = None, 0
        info = dict(info)
        info["subgoal"], info["subgoal_start"] = None, False
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        first = self._turns == 0
        self._turns += 1
        start = first
        error = None
        if isinstance(action, InvalidAction):
            env_action: Any = action
        else:
            reply = parse_subgoal(action)
            error = reply.error
            if error is not None:
                # imported here: agentgym.algorithms stays importable without the wrappers
                from agentgym.wrappers.llm import ParseFailure

                env_action = ParseFailure(
                    f"Invalid response: {error}. {SUBGOAL_INSTRUCTION}", describe_action(error, 200)
                )
            else:
                env_action = reply.text
                if reply.switch is None:
                    stated = reply.subgoal
                    changed = stated is not None and (
                        self.subgoal is None or stated.lower() != self.subgoal.lower()
                    )
                    start = start or changed
                else:
                    start = start or reply.switch
                if start and (reply.subgoal is not None or reply.switch):
                    self.subgoal = (
                        None
                        if reply.subgoal is None
                        else describe_action(reply.subgoal, limit=MAX_SUBGOAL_CHARS)
                    )
        obs, reward, terminated, truncated, info = self.env.step(env_action)
        obs = self._show(obs)
        info = dict(info)
        info["subgoal"], info["subgoal_start"] = self.subgoal, bool(start)
        if error is not None:
            info["subgoal_error"] = error
        return obs, reward, terminated, truncated, info


# ---------------------------------------------------------------------------------------------
# Hierarchical advantage estimation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HiPERConfig(AdvantageConfig):
    """HiPER's options; defaults are the authors' (``gamma``, ``lam`` and ``hae.lam_seg`` of
    their trainer config, ``invalid_action_penalty_coef`` of their scripts)."""

    gamma: float = 1.0
    """discount per turn, inside segments and across them (``gamma**d_k`` per segment)"""
    lam_turn: float = 1.0
    """GAE lambda of the executor's within-segment recursion"""
    lam_seg: float = 0.95
    """GAE lambda of the planner's recursion over segments"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("lam_turn", "lam_seg"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


def hierarchical_advantages(
    batch: AdvantageBatch,
    segment_starts: np.ndarray,
    values_low: np.ndarray,
    values_high: np.ndarray,
    *,
    gamma: float,
    lam_turn: float,
    lam_seg: float,
) -> tuple[np.ndarray, np.ndarray]:
    """HAE's executor and planner advantages (module docstring), float64 (N,) each.

    Args:
        batch: the rows (its ``rewards - penalty`` are the per-turn rewards ``r_t``).
        segment_starts: bool (N,): the turn starts a segment; a trajectory's first turn always
            does, whatever this says.
        values_low: float (N,): ``V_L(s_t)``, the executor's value of the turn's state (under
            its subgoal), from a critic or a baseline.
        values_high: float (N,): ``V_H(s_t)``, the planner's value; read at segment starts.
        gamma, lam_turn, lam_seg: discount and the two GAE lambdas.

    Returns:
        ``(a_low, a_high)`` in row order: ``a_low`` for every turn; ``a_high`` on the first turn
        of each segment, 0 elsewhere.

    Vectorised over trajectories; one pass per turn position (the longest trajectory's
    length), in (trajectory, position) layout.
    """
    n = batch.n
    if n == 0:
        return np.zeros(0), np.zeros(0)
    num, length = batch.num_trajs, int(batch.traj_length.max())
    at = (batch.traj_code, batch.position)

    def padded(values: np.ndarray, fill: Any = 0.0) -> np.ndarray:
        out = np.full((num, length + 1), fill, dtype=np.asarray(values).dtype)
        out[at] = values
        return out

    r = padded(batch.rewards - batch.penalty)
    exists = padded(np.ones(n, dtype=bool), False)
    start = padded(np.asarray(segment_starts, dtype=bool) | (batch.position == 0), False)
    v_low, v_high = padded(values_low), padded(values_high)
    a_low, a_high = np.zeros_like(r), np.zeros_like(r)
    seg_return, seg_turns = np.zeros_like(r), np.zeros((num, length + 1))
    boot, next_plan = np.zeros_like(r), np.zeros_like(r)
    for t in range(length - 1, -1, -1):
        following = exists[:, t + 1]
        same = following & ~start[:, t + 1]  # the next turn continues this segment
        # at a segment's last turn, the next planner's state value (0 at the episode's end)
        handoff = np.where(following, v_high[:, t + 1], 0.0)
        # executor: GAE within the segment, bootstrapped on V_H at its boundary
        v_next = np.where(same, v_low[:, t + 1], handoff)
        delta = r[:, t] + gamma * v_next - v_low[:, t]
        a_low[:, t] = delta + gamma * lam_turn * same * a_low[:, t + 1]
        # planner: the segment's discounted return, its length and what follows it
        seg_return[:, t] = r[:, t] + gamma * same * seg_return[:, t + 1]
        seg_turns[:, t] = 1.0 + same * seg_turns[:, t + 1]
        boot[:, t] = np.where(same, boot[:, t + 1], handoff)
        next_plan[:, t] = np.where(same, next_plan[:, t + 1], following * a_high[:, t + 1])
        discount = gamma ** seg_turns[:, t]
        plan = (
            seg_return[:, t]
            + discount * boot[:, t]
            - v_high[:, t]
            + discount * lam_seg * next_plan[:, t]
        )
        a_high[:, t] = np.where(start[:, t] & exists[:, t], plan, 0.0)
    return a_low[at], a_high[at]


def _group_state_values(batch: AdvantageBatch, returns: np.ndarray) -> np.ndarray:
    """float64 (N,): mean ``returns`` over each row's step group (same group and state_key)."""
    codes, num = batch.step_group_code, batch.num_step_groups
    count = batch.step_group_count()
    mean = np.bincount(codes, weights=returns, minlength=num) / np.maximum(count, 1)
    return mean[codes]


def _whiten(values: np.ndarray, rows: np.ndarray, epsilon: float) -> np.ndarray:
    """``(v - mean) / (std + epsilon)`` over ``rows`` (population std), 0 elsewhere."""
    out = np.zeros_like(values)
    if rows.any():
        picked = values[rows]
        out[rows] = (picked - picked.mean()) / (picked.std() + epsilon)
    return out


@register_advantage("hiper", options=HiPERConfig, inputs=("state_keys", "segment_starts"))
def hiper(batch: AdvantageBatch, config: HiPERConfig) -> AdvantageResult:
    """HiPER's hierarchical advantage estimation, critic-free (see the module docstring).

    ``state_keys`` give the critic-free values: ``V(s)`` = the mean discounted return (with the
    penalty in the rewards) of the group's turns acting from ``s``; ``segment_starts`` marks
    the planner turns. Returns ``advantages`` = ``step_advantage`` = the executor advantage
    ``A_L`` (every turn) and ``episode_advantage`` = the planner advantage ``A_H`` (planner
    turns, 0 elsewhere); ``returns`` are the raw discounted returns as for every estimator.
    """
    if batch.segment_starts is None or batch.step_group_code is None:
        raise ValueError("hiper needs segment_starts and state_keys, one per row")
    # Discounted returns on the penalised rewards: the HAE recursions with V = 0, lambda = 1.
    zeros = np.zeros(batch.n)
    g, _ = hierarchical_advantages(
        batch,
        np.zeros(batch.n, dtype=bool),
        zeros,
        zeros,
        gamma=config.gamma,
        lam_turn=1.0,
        lam_seg=1.0,
    )
    value = _group_state_values(batch, g)
    a_low, a_high = hierarchical_advantages(
        batch,
        batch.segment_starts,
        value,
        value,
        gamma=config.gamma,
        lam_turn=config.lam_turn,
        lam_seg=config.lam_seg,
    )
    if config.norm == "mean_std_norm":
        planner = batch.segment_starts | (batch.position == 0)
        a_low = _whiten(a_low, np.ones(batch.n, dtype=bool), config.epsilon)
        a_high = _whiten(a_high, planner, config.epsilon)
    return AdvantageResult(
        advantages=a_low.astype(np.float32),
        returns=batch.returns,
        episode_advantage=a_high,
        step_advantage=a_low,
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )


def plan_execute_token_advantages(
    result: AdvantageResult,
    action_mask: torch.Tensor,
    subgoal_mask: torch.Tensor,
) -> torch.Tensor:
    """The authors' token assignment: ``A_L`` on action tokens, ``A_H`` on subgoal tokens.

    Args:
        result: the ``"hiper"`` estimator's result for N rows.
        action_mask: (N, T) tensor, 1 on the tokens of the row's action (its response outside
            the plan blocks, or the whole response).
        subgoal_mask: (N, T) tensor, 1 on the tokens of the row's ``<subgoal>`` block; only
            planner turns (``episode_advantage != 0``) get ``A_H`` there.

    Returns:
        float32 (N, T): ``A_L[:, None] * action_mask + A_H[:, None] * subgoal_mask`` (on a
        token in both masks the two add up, as in the authors' sum of the level terms).
    """
    import torch

    if action_mask.shape != subgoal_mask.shape or action_mask.ndim != 2:
        raise ValueError(
            f"action_mask and subgoal_mask must both be (N, T); got {tuple(action_mask.shape)} "
            f"and {tuple(subgoal_mask.shape)}"
        )
    device = action_mask.device
    low = torch.as_tensor(result.step_advantage, dtype=torch.float32, device=device)
    high = torch.as_tensor(result.episode_advantage, dtype=torch.float32, device=device)
    if low.shape[0] != action_mask.shape[0]:
        raise ValueError(f"{low.shape[0]} rows of advantages for {action_mask.shape[0]} rows")
    return low[:, None] * action_mask.to(torch.float32) + high[:, None] * subgoal_mask.to(
        torch.float32
    )
