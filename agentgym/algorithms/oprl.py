"""OPRL: Online Process Reward Learning (Liu et al., arXiv 2509.19199, first titled "Agentic
Reinforcement Learning with Implicit Step Rewards", iStar), as a registered estimator
(``"oprl"``) and its learned part, the implicit process reward model.

An implicit PRM ``pi_phi`` (a policy over actions, initialised as the reference) is trained
alternately with the agent's policy. Its step reward is the log-ratio to the reference policy
``pi_ref`` (the paper's implicit step reward; the authors run with ``ref_path=null``, so the
reference is the rollout policy ``pi_theta_old`` through its ``old_log_probs``)::

    r_phi(s_t, a_t) = beta * log( pi_phi(a_t | s_t) / pi_ref(a_t | s_t) )

and it is trained by a trajectory-level DPO objective on the group's outcome preferences:
for trajectories ``tau+`` and ``tau-`` of one group (same task, same start) with
``R(tau+) > R(tau-)``::

    L(phi) = - mean over pairs of log sigmoid( sum_t r_phi(tau+_t) - sum_t r_phi(tau-_t) )

The policy is then updated on two group-relative advantages combined (the paper's
GRPO-style formulation)::

    A_E(tau_i)  = (R_i - mean_j R_j) [/ (std_j R_j + eps)]       over the group's trajectories
    A_S(a_t^i)  = (r_phi(a_t^i) - mean r_phi) [/ (std r_phi + eps)] over all the group's steps
    A(a_t^i)    = A_E(tau_i) + omega * A_S(a_t^i)

Public code: the authors released it in ``Tongyi-ConvAI/Tongyi-Character``
(``CharacterRL-iStar/istar/``: ``core_istar.py`` for the advantages, ``dp_rm.py`` and
``rm_utils.py`` for the PRM and its loss), on verl-agent. Where it and the paper differ, or the
paper leaves a choice open, this module says what it does:

* **Trajectory score.** The paper sums the step rewards of a trajectory; the authors'
  ``compute_eto_loss_rm`` averages them. :class:`ImplicitPRM` sums by default and takes
  ``reduce="mean"`` for theirs.
* **Pairs.** Every (winner, loser) pair of a group with ``R_winner > R_loser`` (the authors'
  code pairs every success ``R > 0`` with every failure ``R <= 0``, which is this on 0/1
  outcomes); a group without two distinct outcomes gives no pair.
* **Step statistics.** ``A_S`` is normalised over every step row of the group, as the paper
  writes it; the authors' ``step_grpo_reward`` counts only the first row of each trajectory in
  the mean (a side effect of reusing the episode code's de-duplication).
* **Estimators.** The authors' WebShop/Sokoban scripts run the RLOO flavour
  (``adv_estimator=istar_rloo``) with ``step_advantage_w=1``; this module registers the GRPO
  flavour the paper writes out, with ``omega=1`` and ``norm`` as everywhere (``mean_norm``
  by default, as in their ``istar_grpo``).
* **The PRM.** The paper's PRM is a copy of the policy LLM. :class:`ImplicitPRM` is a small
  torch model for CPU: ``pi_phi(a | s) proportional to pi_ref(a | s) exp(f_phi(s, a))`` over
  the state's candidate actions, with ``f_phi`` an MLP over (state, action) features whose
  last layer starts at 0, so ``pi_phi = pi_ref`` and every step reward is 0 before training
  (as with the paper's PRM initialised from the policy). Given each row's candidates and
  their reference log-probs (renormalised over the candidates), ``log pi_phi/pi_ref =
  f_phi(s, a) - log sum_a' pi_ref(a'|s) exp f_phi(s, a')`` exactly; without candidates
  (free-text actions) the log-partition is dropped and the reward is ``beta f_phi(s, a)``.
* ``beta = 0.05`` (their ``beta_train``); the PRM is updated after the step rewards of a batch
  are computed (their ``reward_model.model.update=after``).

How a trainer calls it, once per iteration::

    r = prm.step_rewards(feats, candidates)                      # beta log-ratio, (N,)
    adv = compute_advantage("oprl", group_ids=..., traj_ids=..., step_ids=..., rewards=...,
                            invalid=..., process_rewards=r)
    ... policy update on adv.advantages ...
    prm.update(feats, candidates, group_ids=..., traj_ids=..., rewards=...)   # DPO step
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from agentgym.algorithms.advantage import (
    AdvantageBatch,
    AdvantageResult,
    EpisodeGroupConfig,
    _std,
    episode_advantage,
    register_advantage,
    step_group_stats,
)
from agentgym.algorithms.spa import trajectory_codes

if TYPE_CHECKING:
    import torch

__all__ = ["Candidates", "ImplicitPRM", "OPRLConfig", "oprl", "preference_pairs"]


@dataclass(frozen=True)
class Candidates:
    """The actions a row's state allowed, for the PRM's normalisation over them.

    N rows, at most K candidates each, D features.
    """

    features: np.ndarray
    """float (N, K, D): features of (state, candidate action), padded"""
    ref_logprobs: np.ndarray
    """float (N, K): ``log pi_ref(a' | s)`` of each candidate (padding: any value)"""
    mask: np.ndarray
    """bool (N, K): True on real candidates; the row's own action must be one of them"""


def preference_pairs(group_ids: Any, traj_ids: Any, rewards: Any) -> np.ndarray:
    """Every (winner, loser) pair of trajectory codes of one group with ``R_w > R_l``.

    Returns int64 (P, 2), codes as :func:`~agentgym.algorithms.spa.trajectory_codes` gives
    them; ``R`` is a trajectory's total reward.
    """
    codes, traj_group = trajectory_codes(group_ids, traj_ids)
    outcome = np.bincount(
        codes, weights=np.asarray(rewards, np.float64), minlength=traj_group.shape[0]
    )
    same = traj_group[:, None] == traj_group[None, :]
    better = outcome[:, None] > outcome[None, :]
    return np.argwhere(same & better).astype(np.int64)


class ImplicitPRM:
    """OPRL's implicit PRM over step features, trained by trajectory DPO (see the module
    docstring for the parametrisation and the paper's equations).

    Args:
        feature_dim: D, the width of (state, action) features.
        beta: the implicit reward's scale (the authors' ``beta_train``, 0.05).
        hidden: width of ``f_phi``'s hidden layer.
        lr: Adam's learning rate.
        reduce: how a trajectory's step rewards make its DPO score: ``"sum"`` (the paper) or
            ``"mean"`` (the authors' ``compute_eto_loss_rm``).
        seed: seeds the initial weights.
        device: torch device.
    """

    def __init__(
        self,
        feature_dim: int,
        *,
        beta: float = 0.05,
        hidden: int = 64,
        lr: float = 1e-2,
        reduce: Literal["sum", "mean"] = "sum",
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        import torch

        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.feature_dim, self.beta, self.reduce = feature_dim, beta, reduce
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        first, last = torch.nn.Linear(feature_dim, hidden), torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            bound = feature_dim**-0.5
            first.weight.uniform_(-bound, bound, generator=gen)
            first.bias.zero_()
            # f_phi = 0 at the start: pi_phi is the reference, every step reward is 0.
            last.weight.zero_()
            last.bias.zero_()
        self.net = torch.nn.Sequential(first, torch.nn.Tanh(), last).to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)

    def _f(self, features: Any) -> torch.Tensor:
        import torch

        x = torch.as_tensor(np.asarray(features, dtype=np.float32), device=self.device)
        if x.shape[-1] != self.feature_dim:
            raise ValueError(f"features must end in {self.feature_dim}, got {tuple(x.shape)}")
        return self.net(x).squeeze(-1)

    def log_ratio(self, features: Any, candidates: Candidates | None = None) -> torch.Tensor:
        """``log pi_phi(a_t | s_t) - log pi_ref(a_t | s_t)`` of every row, (N,), differentiable.

        ``features``: float (N, D) of each row's (state, action taken).
        """
        import torch

        f = self._f(features)
        if f.ndim != 1:
            raise ValueError(f"features must be (N, {self.feature_dim})")
        if candidates is None:
            return f
        mask = torch.as_tensor(np.asarray(candidates.mask, dtype=bool), device=self.device)
        ref = torch.as_tensor(np.asarray(candidates.ref_logprobs, np.float32), device=self.device)
        if mask.shape != ref.shape or mask.shape[0] != f.shape[0]:
            raise ValueError(
                f"candidates must be (N={f.shape[0]}, K): mask {tuple(mask.shape)}, "
                f"ref_logprobs {tuple(ref.shape)}"
            )
        if not bool(mask.any(dim=1).all()):
            raise ValueError("every row needs at least one candidate (its own action)")
        f_cand = self._f(candidates.features)  # (N, K)
        # log sum_a' pi_ref(a'|s) exp f(s, a') over the candidates (padding excluded), with the
        # reference renormalised over them: the two sums are the same tensor op when f = 0, so
        # an untrained PRM gives exactly 0, not the reference's rounding (its probabilities
        # rarely sum to 1 in float32).
        log_z = torch.logsumexp(torch.where(mask, ref + f_cand, -torch.inf), dim=1)
        log_z = log_z - torch.logsumexp(torch.where(mask, ref, -torch.inf), dim=1)
        return f - log_z

    def step_rewards(self, features: Any, candidates: Candidates | None = None) -> np.ndarray:
        """``beta log(pi_phi / pi_ref)`` of every row, float64 (N,): what
        ``compute_advantage("oprl")`` reads as ``process_rewards``."""
        import torch

        with torch.no_grad():
            return (self.beta * self.log_ratio(features, candidates)).double().cpu().numpy()

    def loss(
        self,
        features: Any,
        candidates: Candidates | None = None,
        *,
        group_ids: Any,
        traj_ids: Any,
        rewards: Any,
    ) -> torch.Tensor | None:
        """The trajectory DPO loss over the batch's preference pairs; None without a pair.

        ``rewards``: float (N,) env rewards; a trajectory's outcome is their sum.
        """
        import torch

        pairs = preference_pairs(group_ids, traj_ids, rewards)
        if pairs.shape[0] == 0:
            return None
        codes, traj_group = trajectory_codes(group_ids, traj_ids)
        num = traj_group.shape[0]
        r = self.beta * self.log_ratio(features, candidates)
        index = torch.as_tensor(codes, device=self.device)
        score = torch.zeros(num, dtype=r.dtype, device=self.device).index_add(0, index, r)
        if self.reduce == "mean":
            length = torch.as_tensor(np.bincount(codes, minlength=num), device=self.device)
            score = score / length.clamp(min=1).to(r.dtype)
        win = torch.as_tensor(pairs[:, 0], device=self.device)
        lose = torch.as_tensor(pairs[:, 1], device=self.device)
        return -torch.nn.functional.logsigmoid(score[win] - score[lose]).mean()

    def update(
        self,
        features: Any,
        candidates: Candidates | None = None,
        *,
        group_ids: Any,
        traj_ids: Any,
        rewards: Any,
        steps: int = 1,
    ) -> dict[str, float]:
        """``steps`` Adam steps on the trajectory DPO loss over these rows (full batch).

        Returns ``oprl/dpo_loss_before``, ``oprl/dpo_loss`` (after the last step) and
        ``oprl/pairs``; a batch without a preference pair (every trajectory of every group
        scored the same) changes nothing and reports a loss of 0.
        """
        import torch

        kwargs = {"group_ids": group_ids, "traj_ids": traj_ids, "rewards": rewards}
        pairs = float(preference_pairs(**kwargs).shape[0])
        self.net.train()
        before = None
        for _ in range(steps):
            loss = self.loss(features, candidates, **kwargs)
            if loss is None:
                return {"oprl/dpo_loss_before": 0.0, "oprl/dpo_loss": 0.0, "oprl/pairs": 0.0}
            if before is None:
                before = float(loss.detach())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        with torch.no_grad():
            after = self.loss(features, candidates, **kwargs)
        return {
            "oprl/dpo_loss_before": before or 0.0,
            "oprl/dpo_loss": float(after) if after is not None else 0.0,
            "oprl/pairs": pairs,
        }

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer state, for a trainer's checkpoint."""
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


@dataclass(frozen=True)
class OPRLConfig(EpisodeGroupConfig):
    """OPRL's options: the episode-group ones plus the step advantage's weight."""

    omega: float = 1.0
    """weight of the step advantage in ``A = A_E + omega A_S`` (the authors'
    ``step_advantage_w``)"""


def implicit_step_advantage(batch: AdvantageBatch, config: OPRLConfig) -> np.ndarray:
    """``A_S``, float64 (N,): each row's implicit step reward less the mean over all the step
    rows of its group (divided by their std + epsilon with ``mean_std_norm``)."""
    if batch.process_rewards is None:
        raise ValueError(
            "oprl needs process_rewards: the implicit PRM's beta log-ratio per row "
            "(ImplicitPRM.step_rewards)"
        )
    r, codes, num = batch.process_rewards, batch.group_code, batch.num_groups
    count = np.bincount(codes, minlength=num)
    mean = np.bincount(codes, weights=r, minlength=num) / np.maximum(count, 1)
    centred = r - mean[codes]
    if config.norm == "mean_norm":
        return centred
    return centred / (_std(codes, r, mean, count)[codes] + config.epsilon)


@register_advantage("oprl", options=OPRLConfig, inputs=("process_rewards",))
def oprl(batch: AdvantageBatch, config: OPRLConfig) -> AdvantageResult:
    """OPRL / iStar (arXiv 2509.19199): ``A = A_E + omega A_S``.

    ``A_E`` is the episode advantage of the trajectory's outcome within its group (GRPO,
    GiGPO's Eq. 3, with the usual invalid-action penalty and ``episode_stats_over``); ``A_S``
    the implicit step reward (``process_rewards``) normalised over the group's step rows.
    """
    a_episode = episode_advantage(batch, config)
    a_step = implicit_step_advantage(batch, config)
    combined = a_episode + config.omega * a_step
    return AdvantageResult(
        advantages=combined.astype(np.float32),
        returns=batch.returns,
        episode_advantage=a_episode,
        step_advantage=a_step,
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )
