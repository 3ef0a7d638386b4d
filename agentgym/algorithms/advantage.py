"""Critic-free advantage estimators for multi-turn agent RL: GRPO, GiGPO, RLOO, SLATE, CW-GRPO,
SLEA-RL.

GRPO and GiGPO are described below; RLOO (leave-one-out baselines), SLATE (arXiv 2602.23440:
advantages within branch groups of sibling samples of one state, from a stepwise or tree
rollout's ``branch_ids``) and CW-GRPO (arXiv 2604.14267: a judge's per-round
``contributions`` share a successful trajectory's GRPO credit among its rounds before the
answer round) are documented on their functions, :func:`rloo`, :func:`slate` and
:func:`cw_grpo`; so is SLEA-RL (arXiv 2603.18079, :func:`slea_rl`), whose advantage is GiGPO's
with its authors' defaults.

GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) gives every step of a multi-turn
episode two relative advantages, both computed from a group of rollouts of the same task:

* an **episode advantage** (paper Eq. 3): the trajectory's outcome compared with the other
  trajectories of its group, as in GRPO;
* a **step advantage** (Eqs. 5-7): the step's discounted return compared with the other steps of
  the group that acted from the *same anchor state* (equal ``state_key``), whatever their time
  index. These "step groups" are what make the credit assignment step-level.

They are combined as ``A = A_episode + omega * A_step`` (Eq. 8). The definitions follow the paper
and its reference implementation (verl-agent, ``gigpo/core_gigpo.py``) exactly; where verl-agent
fixes a convention the paper leaves open, this module does the same and says so:

* the episode score of a step row is the trajectory's *undiscounted* total reward
  ``R(tau) = sum_t r_t`` (verl-agent's ``EpisodeRewardManager``);
* ``norm="mean_norm"`` subtracts the group mean; ``"mean_std_norm"`` also divides by the group's
  sample standard deviation (Bessel-corrected, as ``torch.std``) plus ``epsilon = 1e-6``;
* episode statistics are taken over one value per trajectory (``episode_stats_over=
  "trajectories"``, the paper's Eq. 3) or over all step rows of the group (``"steps"``,
  verl-agent's default ``compute_mean_std_cross_steps=True``: long trajectories weigh more);
* an episode group holding a single value (one trajectory, or one row with ``"steps"``) is
  normalised with mean 0 and std 1, so its advantage is the score itself (verl's GRPO convention);
* a step group of one row gets step advantage exactly 0 (there is no peer to compare with);
* the invalid-action penalty (verl-agent's ``apply_invalid_action_penalty``) is subtracted from
  the penalised row's episode score and from its discounted return, *after* discounting: it is
  charged to that step only and never propagated to earlier steps;
* with ``"trajectories"``, a trajectory's value in the group statistics is the score of its first
  step row, which is what verl-agent counts when rows arrive in rollout order (trajectory-major);
  here it does not depend on row order.

Everything is vectorised numpy over flat rows, one row per (trajectory, step), rows in any order,
with no Python loop over rows: ids become small integer codes (an offset when their range is
compact, ``np.unique`` otherwise), arbitrary hashable state keys are coded by one C-level dict
pass (:func:`encode_state_keys`), rows are placed in (trajectory, step) order by a counting sort,
group statistics are segment reductions (``np.bincount``), and discounted returns are one reversed
cumulative sum (with an exact log-depth scan when that would lose precision).

Estimators are registered by name (``@register_advantage("gigpo", options=GiGPOConfig,
inputs=("state_keys",))``), each with its own options dataclass and the per-row inputs it reads
beyond the common rows, and chosen by :func:`compute_advantage`, which accepts for an estimator
exactly the options and inputs it declares (:func:`advantage_estimator` says which);
:func:`token_advantages` broadcasts row advantages to response tokens.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "EPISODE_STATS",
    "EPSILON",
    "NORMS",
    "ROW_INPUTS",
    "SIZE_BUCKETS",
    "AdvantageBatch",
    "AdvantageConfig",
    "AdvantageResult",
    "CWGRPOConfig",
    "EpisodeGroupConfig",
    "Estimator",
    "GiGPOConfig",
    "SLEARLConfig",
    "advantage_estimator",
    "available_advantages",
    "compute_advantage",
    "encode_state_keys",
    "episode_advantage",
    "register_advantage",
    "step_advantage",
    "step_group_stats",
    "token_advantages",
    "unregister_advantage",
]

EPSILON = 1e-6
"""added to the standard deviation in ``mean_std_norm`` (verl-agent's ``epsilon``)"""

Norm = Literal["mean_norm", "mean_std_norm"]
EpisodeStatsOver = Literal["trajectories", "steps"]
NORMS: tuple[str, ...] = ("mean_norm", "mean_std_norm")
"""the values of ``norm``"""
EPISODE_STATS: tuple[str, ...] = ("trajectories", "steps")
"""the values of ``episode_stats_over``"""
ROW_INPUTS: tuple[str, ...] = (
    "state_keys",
    "branch_ids",
    "contributions",
    "segment_starts",
    "process_rewards",
)
"""per-row inputs beyond the common rows that an estimator may declare (see
:func:`compute_advantage`); ``state_keys`` is accepted by every estimator (step-group stats)"""

SIZE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-5", 2, 5),
    ("6-10", 6, 10),
    ("11-20", 11, 20),
    ("21+", 21, None),
)
"""step-group size buckets of ``AdvantageResult.stats`` as (label, min size, max size or None).

"1" are steps with no peer (their step advantage is 0); "2-5" and "6-10" cover the usual range
for groups of 8 rollouts (some or all of them meet in a state); "11-20" and "21+" are states
revisited within trajectories (loops, repeated invalid actions), which grow with episode length.
"""
_STAT_KEYS = (
    "num_step_groups",
    "mean_step_group_size",
    "max_step_group_size",
    "singleton_share",
    "singleton_row_share",
    *(f"size_share/{label}" for label, _, _ in SIZE_BUCKETS),
)

# Compact integer ids (range within this factor of the row count) are coded by an offset and
# used directly as bincount bins; anything sparser is coded with np.unique (a sort).
_COMPACT_RANGE = 4

# The reversed-cumsum discount rescales by gamma**-t. Its rounding error is about
# eps * amplification * trajectory length * batch size (relative to the largest reward); above
# this bound the exact log-depth scan runs instead.
_LOG_CUMSUM_ERROR_BOUND = math.log(1e-9)
_EPS64 = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class AdvantageConfig:
    """Options every estimator takes; defaults are the paper's. Each estimator's own options
    dataclass extends it (:class:`EpisodeGroupConfig`, :class:`GiGPOConfig`,
    :class:`CWGRPOConfig`); construction checks the values."""

    gamma: float = 0.95
    """discount for step returns, Eq. 5 (``R_t = r_t + gamma * R_{t+1}``)"""
    norm: Norm = "mean_norm"
    """``mean_norm`` subtracts the group mean; ``mean_std_norm`` also divides by std + epsilon"""
    invalid_penalty: float = 0.1
    """subtracted from an invalid step's episode score and discounted return"""
    epsilon: float = EPSILON
    """added to the standard deviation in ``mean_std_norm``"""

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


@dataclass(frozen=True)
class EpisodeGroupConfig(AdvantageConfig):
    """Options of the estimators built on the episode-level group advantage (Eq. 3): GRPO."""

    episode_stats_over: EpisodeStatsOver = "trajectories"
    """episode-group statistics over one value per trajectory, or over every step row"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.episode_stats_over not in EPISODE_STATS:
            raise ValueError(
                f"episode_stats_over must be one of {EPISODE_STATS}, "
                f"got {self.episode_stats_over!r}"
            )


@dataclass(frozen=True)
class GiGPOConfig(EpisodeGroupConfig):
    """GiGPO's options: the episode-group ones plus the step advantage's weight."""

    omega: float = 1.0
    """weight of the step advantage, Eq. 8"""


@dataclass(frozen=True)
class CWGRPOConfig(EpisodeGroupConfig):
    """CW-GRPO's options: the episode-group ones plus the sharpness of the round weights."""

    contribution_gamma: float = math.inf
    """CW-GRPO's gamma (> 0): ``inf`` weighs a trajectory's rounds in proportion to their judge
    contributions; a finite value takes a softmax of ``gamma * contribution`` (sharper as it
    grows)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.contribution_gamma > 0.0:  # NaN fails too
            raise ValueError(
                f"contribution_gamma must be > 0 (math.inf for weights proportional to the "
                f"contributions, a finite value for a softmax), got {self.contribution_gamma}"
            )


@dataclass(frozen=True)
class AdvantageResult:
    """Per-row outputs of an estimator. N = number of rows, in the caller's row order."""

    advantages: np.ndarray
    """float32 (N,): the advantage to train on (every response token of the row gets it)"""
    returns: np.ndarray
    """float64 (N,): discounted return of the row's step on raw env rewards, Eq. 5"""
    episode_advantage: np.ndarray
    """float64 (N,): episode-level group advantage, Eq. 3"""
    step_advantage: np.ndarray
    """float64 (N,): step-level (anchor-state) group advantage, Eq. 7; zeros for GRPO"""
    stats: dict[str, float]
    """step-group statistics of the batch, see :func:`step_group_stats` (``{}`` without keys)"""


class AdvantageBatch:
    """Validated flat rows and their groupings, built once and shared by the estimators.

    N rows, G group codes, T trajectory codes (a trajectory is a (group_id, traj_id) pair).
    Codes are small non-negative ints usable as ``np.bincount`` bins; some codes may be unused.

    Attributes:
        n: number of rows N.
        rewards: float64 (N,). invalid: bool (N,). penalty: float64 (N,), the row's
            invalid-action penalty.
        group_code: int64 (N,) in [0, G). num_groups: G.
        traj_code: int64 (N,) in [0, T). num_trajs: T.
        traj_group: int64 (T,), group code of each trajectory code (0 where unused).
        traj_length: int64 (T,), rows of each trajectory code (0 where unused).
        traj_start: int64 (T,), slot of each trajectory's first step.
        row_length: int64 (N,), length of the row's trajectory.
        slot: int64 (N,), the row's index in (trajectory, step) order (a permutation).
        position: int64 (N,), the row's index within its trajectory (0 = first step).
        returns: float64 (N,), discounted returns (Eq. 5).
        episode_return: float64 (T,), undiscounted total reward of each trajectory.
        step_group_code: int64 (N,) or None without state keys; num_step_groups: S.
    """

    def __init__(
        self,
        *,
        group_ids: Any,
        traj_ids: Any,
        step_ids: Any,
        rewards: Any,
        state_keys: Sequence[Hashable] | np.ndarray | None,
        invalid: Any,
        config: AdvantageConfig,
        branch_ids: Any = None,
        contributions: Any = None,
        segment_starts: Any = None,
        process_rewards: Any = None,
    ) -> None:
        group_ids = _int_rows("group_ids", group_ids)
        n = self.n = group_ids.shape[0]
        traj_ids = _int_rows("traj_ids", traj_ids, n)
        step_ids = _int_rows("step_ids", step_ids, n)
        self.rewards = _rows("rewards", rewards, n, np.float64)
        self.invalid = _rows("invalid", invalid, n, np.bool_)
        self.penalty = config.invalid_penalty * self.invalid
        # SLATE's branch groups (-1: the row is not a branch-step sample) and CW-GRPO's judge
        # contributions; both optional, validated here so every estimator sees checked rows.
        self.branch_ids: np.ndarray | None = None
        if branch_ids is not None:
            self.branch_ids = _int_rows("branch_ids", branch_ids, n)
            if self.branch_ids.size and int(self.branch_ids.min()) < -1:
                raise ValueError("branch_ids must be >= 0, or -1 for rows outside any branch group")
        self.contributions: np.ndarray | None = None
        if contributions is not None:
            self.contributions = _rows("contributions", contributions, n, np.float64)
            if not ((self.contributions >= 0.0) & (self.contributions <= 1.0)).all():
                raise ValueError("contributions must be judge scores in [0, 1]")
        # HiPER's planner turns: True where a turn starts a new subgoal segment.
        self.segment_starts: np.ndarray | None = None
        if segment_starts is not None:
            self.segment_starts = _rows("segment_starts", segment_starts, n, np.bool_)
        # A learned model's per-step rewards (SPA's progress, OPRL's implicit step reward).
        self.process_rewards: np.ndarray | None = None
        if process_rewards is not None:
            self.process_rewards = _rows("process_rewards", process_rewards, n, np.float64)
            if not np.isfinite(self.process_rewards).all():
                raise ValueError("process_rewards must be finite")
        self.group_code, self.num_groups = _int_codes(group_ids)
        state_code = None
        if state_keys is not None:
            state_code, num_states, row_codes = _state_codes(state_keys, n)

        # Trajectory codes: traj ids are unique across a batch from GroupVectorEnv, so the id is
        # the code; should an id recur in two groups, (group, id) pairs are coded instead.
        tcode, num = _int_codes(traj_ids)
        traj_group = np.zeros(num, dtype=np.int64)
        traj_group[tcode] = self.group_code
        length = np.bincount(tcode, minlength=num)
        row_length = length[tcode]
        # All the layout checks in one pass: each trajectory lies in one group; step ids are
        # 0..L-1 (unsigned view: a negative id becomes huge and fails too); each state belongs to
        # one group, so a state code alone names its step group (Eq. 6), the usual case since
        # groups are different tasks.
        ok = traj_group[tcode] == self.group_code
        ok &= step_ids.view(np.uint64) < row_length.view(np.uint64)
        if state_code is not None:
            if row_codes:  # the code is a row holding the key: that row's group is the owner
                owner_of_row = self.group_code[state_code]
            else:
                owner = np.zeros(num_states, dtype=np.int64)
                owner[state_code] = self.group_code
                owner_of_row = owner[state_code]
            ok &= owner_of_row == self.group_code
        fast = bool(ok.all())
        if not fast and not (traj_group[tcode] == self.group_code).all():
            tcode, num = _int_codes(self.group_code * num + tcode)
            traj_group = np.zeros(num, dtype=np.int64)
            traj_group[tcode] = self.group_code
            length = np.bincount(tcode, minlength=num)
            row_length = length[tcode]
        self.traj_code, self.num_trajs, self.traj_group = tcode, num, traj_group
        self.traj_length, self.row_length = length, row_length
        self.num_used_trajs = num if n == 0 else int(np.count_nonzero(length))
        self.traj_start = np.cumsum(length) - length

        # Counting sort into (trajectory, step) order: with step ids 0..L-1 the row's slot is
        # its trajectory's start + step id, no sort needed; otherwise steps are ranked. The slots
        # are a permutation unless a (trajectory, step) repeats; the discount checks that.
        self._ids = (group_ids, traj_ids, step_ids)
        if fast:
            self.slot, self.position = self.traj_start[tcode] + step_ids, step_ids
        else:
            self._rank_steps()

        self.episode_return = np.bincount(tcode, weights=self.rewards, minlength=num)
        if not np.isfinite(self.episode_return).all():  # a NaN or inf reward in the trajectory
            bad = int(np.flatnonzero(~np.isfinite(self.rewards))[0])
            raise ValueError(
                f"rewards must be finite; row {bad} is {self.rewards[bad]} "
                "(one NaN would corrupt its whole group's statistics)"
            )
        self.returns = self._discounted_returns(config.gamma)

        self.step_group_code: np.ndarray | None = None
        self.num_step_groups = 0
        self._step_group_count: np.ndarray | None = None
        if state_code is not None:
            if fast:
                self.step_group_code, self.num_step_groups = state_code, num_states
            else:  # states shared across groups (or a slow-path batch): code the pairs
                self.step_group_code, self.num_step_groups = _int_codes(
                    self.group_code * num_states + state_code
                )

    def _rank_steps(self) -> None:
        """Slots and positions by sorting (trajectory, step); step ids may have gaps."""
        n = self.n
        group_ids, traj_ids, steps = self._ids
        order = np.lexsort((steps, self.traj_code))
        sorted_traj, sorted_step = self.traj_code[order], steps[order]
        dup = (sorted_traj[1:] == sorted_traj[:-1]) & (sorted_step[1:] == sorted_step[:-1])
        if dup.any():
            row = int(order[1:][dup][0])
            raise ValueError(
                f"two rows share group_id={group_ids[row]}, traj_id={traj_ids[row]}, "
                f"step_id={steps[row]}; each (trajectory, step) must appear once"
            )
        self.slot = np.empty(n, dtype=np.int64)
        self.slot[order] = np.arange(n)
        self.position = self.slot - self.traj_start[self.traj_code]

    def _discounted_returns(self, gamma: float) -> np.ndarray:
        """Eq. 5, ``R_t = r_t + gamma * R_{t+1}``, float64 (N,) in row order.

        Fast path: ``R_t = gamma**-t * sum_{k >= t} gamma**k r_k``, a reversed cumulative sum over
        rows in (trajectory, step) order minus the same sum where the trajectory ends. Its
        rounding error grows with ``gamma**-(L-1)``, L and the batch size; when that bound
        exceeds 1e-9 (relative to the largest reward), an exact log-depth scan (Hillis-Steele on
        the linear recurrence, every term scaled by gamma**d <= 1) runs instead.
        """
        n = self.n
        if n == 0:
            return np.zeros(0)
        max_len = int(self.traj_length.max())
        # log of the error bound, amplification gamma**-(max_len - 1) included (no overflow).
        if gamma > 0.0 and (
            -(max_len - 1) * math.log(gamma) + math.log(max_len * n * _EPS64)
            < _LOG_CUMSUM_ERROR_BOUND
        ):
            powers = gamma ** np.arange(max_len, dtype=np.float64)
            row_power = powers[self.position]
            # NaN marks slots no row fills; it reaches suffix[0] through the cumsum, so one
            # scalar test proves the slots are a permutation (rewards are finite by now).
            scaled = np.full(n + 1, np.nan)
            scaled[n] = 0.0
            scaled[self.slot] = self.rewards * row_power
            suffix = np.cumsum(scaled[::-1])[::-1]  # suffix[i] = sum of scaled[i:]
            if np.isnan(suffix[0]):
                self._rank_steps()  # raises: a (trajectory, step) pair repeats
            after_end = suffix[self.traj_start + self.traj_length]  # (T,)
            return (suffix[self.slot] - after_end[self.traj_code]) / row_power
        # Exact scan in (trajectory, step) order: after the round with shift d, acc[i] sums
        # gamma**j r_{i+j} for j < 2d within the trajectory (gamma 0: the rewards themselves).
        acc = np.full(n, np.nan)
        acc[self.slot] = self.rewards
        if np.isnan(acc).any():
            self._rank_steps()  # raises: a (trajectory, step) pair repeats
        remaining = np.empty(n, dtype=np.int64)  # later steps in the same trajectory
        remaining[self.slot] = self.row_length - 1 - self.position
        d = 1
        while d < max_len and gamma > 0.0:
            acc[:-d] += (gamma**d * acc[d:]) * (remaining[:-d] >= d)
            d *= 2
        return acc[self.slot]

    def step_group_count(self) -> np.ndarray | None:
        """int64 (S,): rows of each step group code, 0 for unused codes (None without keys)."""
        if self.step_group_code is None:
            return None
        if self._step_group_count is None:
            self._step_group_count = np.bincount(
                self.step_group_code, minlength=self.num_step_groups
            )
        return self._step_group_count


EstimatorFn = Callable[[AdvantageBatch, Any], AdvantageResult]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its function, its options dataclass and the inputs it reads."""

    name: str
    fn: EstimatorFn
    """``fn(batch: AdvantageBatch, options) -> AdvantageResult``"""
    options: type[AdvantageConfig]
    """the dataclass of its options (an :class:`AdvantageConfig` subclass, or that class)"""
    inputs: tuple[str, ...]
    """per-row inputs (from :data:`ROW_INPUTS`) it needs beyond the common rows"""

    def option_names(self) -> tuple[str, ...]:
        """The keyword options :func:`compute_advantage` accepts for this estimator."""
        return tuple(f.name for f in fields(self.options))

    def make_options(self, **options: Any) -> AdvantageConfig:
        """This estimator's options from keywords, checked; an unknown name raises ValueError
        naming the options it takes."""
        unknown = sorted(set(options) - set(self.option_names()))
        if unknown:
            raise ValueError(
                f"advantage estimator {self.name!r} takes no option "
                f"{', '.join(map(repr, unknown))}; its options are: "
                f"{', '.join(self.option_names())}"
            )
        return self.options(**options)


_ESTIMATORS: dict[str, Estimator] = {}


def register_advantage(
    name: str,
    *,
    options: type[AdvantageConfig] = AdvantageConfig,
    inputs: Sequence[str] = (),
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register an estimator ``fn(batch: AdvantageBatch, options) -> AdvantageResult`` by name.

    ``options``: the frozen dataclass of its options (:class:`AdvantageConfig` or a subclass);
    ``compute_advantage(name, ...)`` accepts exactly its fields as keywords and passes ``fn`` an
    instance. ``inputs``: the per-row inputs of :data:`ROW_INPUTS` that ``fn`` reads (from the
    batch: ``batch.state_keys`` codes, ``batch.branch_ids``, ``batch.contributions``), which
    :func:`compute_advantage` then requires; a caller (a trainer) builds just those. The rows
    are validated and the :class:`AdvantageBatch` (codes, ordering, discounted returns) built
    once, before ``fn`` runs.
    """
    unknown = sorted(set(inputs) - set(ROW_INPUTS))
    if unknown:
        raise ValueError(f"unknown estimator inputs {unknown}; choose from {ROW_INPUTS}")
    if not (isinstance(options, type) and issubclass(options, AdvantageConfig)):
        raise TypeError("options must be AdvantageConfig or a dataclass subclass of it")

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        if name in _ESTIMATORS and _ESTIMATORS[name].fn is not fn:
            raise ValueError(f"an advantage estimator is already registered as {name!r}")
        _ESTIMATORS[name] = Estimator(name, fn, options, tuple(inputs))
        return fn

    return decorator


def unregister_advantage(name: str) -> None:
    """Remove the estimator registered as ``name`` (a no-op if there is none)."""
    _ESTIMATORS.pop(name, None)


def available_advantages() -> list[str]:
    """Names accepted by :func:`compute_advantage`."""
    return sorted(_ESTIMATORS)


def advantage_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``: its options (:meth:`Estimator.option_names`) and
    inputs. Raises ValueError naming the registered estimators if there is none."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {', '.join(available_advantages())}"
        ) from None


def compute_advantage(
    name: str,
    *,
    group_ids: Any,
    traj_ids: Any,
    step_ids: Any,
    rewards: Any,
    invalid: Any,
    state_keys: Sequence[Hashable] | np.ndarray | None = None,
    **options_and_inputs: Any,
) -> AdvantageResult:
    """Advantages for a batch of flat rows, one row per (trajectory, step), rows in any order.

    Args:
        name: registered estimator: ``"gigpo"``, ``"grpo"``, ``"rloo"``, ``"slate"``,
            ``"cw_grpo"``, ``"slea_rl"``, ``"spa"`` or ``"oprl"`` (see
            :func:`available_advantages`).
        group_ids: int (N,): the group of the row; all trajectories of a group start from the
            same task and state.
        traj_ids: int (N,): the trajectory of the row (unique within its group at least).
        step_ids: int (N,): the step's index in its trajectory; only their order matters.
        rewards: float (N,): the env reward of the step.
        invalid: bool (N,): the action was invalid (``not Step.action_valid``).
        state_keys: (N,) hashables (list/tuple, or a numpy array; int codes from
            :func:`encode_state_keys` are fastest): the anchor state the action was taken from
            (``Step.state_key``). An input of GiGPO; the others only report step-group stats
            from it.
        **options_and_inputs: the estimator's options (the fields of its options dataclass)
            and the other per-row inputs it declares:

            * every estimator: ``gamma`` (discount of step returns, Eq. 5), ``norm``
              (``"mean_norm"`` or ``"mean_std_norm"``, at every level), ``invalid_penalty``
              (subtracted from an invalid step's scores, see the module docstring),
              ``epsilon`` (added to the std in ``mean_std_norm``);
            * ``gigpo``, ``grpo``, ``cw_grpo``: ``episode_stats_over``, ``"trajectories"``
              (paper) or ``"steps"`` (verl-agent default; ``slea_rl`` always uses it);
            * ``gigpo``, ``slea_rl``: ``omega``, the weight of the step advantage (Eq. 8);
              ``slea_rl`` also needs ``state_keys`` (its observation clusters);
            * ``slate``: input ``branch_ids``, int (N,): the branch group of a row taken at a
              branch point (the k sibling continuations of one prefix share it, and act from
              the same snapshot), -1 for rows that are not branch-step samples;
            * ``spa``, ``oprl``: input ``process_rewards``, float (N,): a learned model's
              reward of each step (:mod:`agentgym.algorithms.spa`, :mod:`~.oprl`);
            * ``cw_grpo``: input ``contributions``, float (N,) in [0, 1]: the judge's
              contribution score of each round (see :mod:`agentgym.algorithms.judges`); option
              ``contribution_gamma``, the paper's gamma, > 0: ``math.inf`` (the default, as in
              the authors' runs) weighs the rounds in proportion to their contributions; a
              finite value weighs them by ``softmax(gamma * contributions)``.

    Returns:
        :class:`AdvantageResult`; ``advantages`` float32 (N,) in the caller's row order.

    Raises:
        ValueError: unknown name, an option or input the estimator does not take (the message
            lists those it does), a missing input, a bad option value, arrays of different
            lengths, non-finite rewards, or a (trajectory, step) pair given twice.

    One group of two trajectories: the first won in two steps, the second failed in one.
    GRPO gives every row its trajectory's episode advantage; GiGPO adds the step advantage
    among rows acting from the same state (both first steps left ``"start"``):

    >>> rows = dict(group_ids=[0, 0, 0], traj_ids=[0, 0, 1], step_ids=[0, 1, 0],
    ...             rewards=[0.0, 1.0, 0.0], invalid=[False, False, False], norm="mean_norm")
    >>> compute_advantage("grpo", **rows).advantages
    array([ 0.5,  0.5, -0.5], dtype=float32)
    >>> result = compute_advantage("gigpo", state_keys=["start", "mid", "start"], gamma=1.0,
    ...                            omega=1.0, **rows)
    >>> result.episode_advantage, result.step_advantage
    (array([ 0.5,  0.5, -0.5]), array([ 0.5,  0. , -0.5]))
    >>> result.advantages, result.stats["num_step_groups"]
    (array([ 1. ,  0.5, -1. ], dtype=float32), 2.0)
    >>> compute_advantage("grpo", branch_ids=[0, 0, 0], **rows)
    Traceback (most recent call last):
    ValueError: advantage estimator 'grpo' does not read branch_ids; its per-row inputs beyond the common rows: none
    """
    estimator = advantage_estimator(name)
    inputs = {k: options_and_inputs.pop(k) for k in ROW_INPUTS[1:] if k in options_and_inputs}
    stray = sorted(set(inputs) - set(estimator.inputs))
    if stray:
        takes = ", ".join(estimator.inputs) or "none"
        raise ValueError(
            f"advantage estimator {name!r} does not read {', '.join(stray)}; "
            f"its per-row inputs beyond the common rows: {takes}"
        )
    for needed in estimator.inputs:
        given = state_keys if needed == "state_keys" else inputs.get(needed)
        if given is None:
            raise ValueError(
                f"advantage estimator {name!r} needs {needed}: "
                + _INPUT_HINTS.get(needed, "one value per row")
            )
    options = estimator.make_options(**options_and_inputs)
    batch = AdvantageBatch(
        group_ids=group_ids,
        traj_ids=traj_ids,
        step_ids=step_ids,
        rewards=rewards,
        state_keys=state_keys,
        invalid=invalid,
        config=options,
        branch_ids=inputs.get("branch_ids"),
        contributions=inputs.get("contributions"),
        segment_starts=inputs.get("segment_starts"),
        process_rewards=inputs.get("process_rewards"),
    )
    return estimator.fn(batch, options)


# What each input is, for the error that says an estimator needs it.
_INPUT_HINTS = {
    "state_keys": "one anchor state per row (Step.state_key)",
    "branch_ids": "the branch group of every branch-step row, -1 elsewhere "
    "(the trainer's --rollout tree or stepwise provides them)",
    "contributions": "a judge score in [0, 1] per row (see agentgym.algorithms.judges)",
    "segment_starts": "True where a turn starts a new subgoal segment "
    "(info['subgoal_start'] from agentgym.algorithms.hiper.SubgoalActions)",
    "process_rewards": "a learned model's reward per row (agentgym.algorithms.spa / .oprl)",
}


# ---------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------


def episode_advantage(batch: AdvantageBatch, config: EpisodeGroupConfig) -> np.ndarray:
    """Episode-level group advantage (Eq. 3), float64 (N,).

    A row's score is its trajectory's total reward less the row's invalid-action penalty,
    normalised by the mean (and std) of its group, taken over trajectories or over step rows.
    """
    num, traj_group, length = batch.num_groups, batch.traj_group, batch.traj_length
    ret = batch.episode_return  # (T,)
    if config.episode_stats_over == "steps":
        # Sums over rows through per-trajectory sums: each row scores ret[traj] - penalty.
        count = np.bincount(traj_group, weights=length, minlength=num)
        total = np.bincount(traj_group, weights=length * ret, minlength=num)
        total -= np.bincount(batch.group_code, weights=batch.penalty, minlength=num)
    else:
        # One value per trajectory: the score of its first step row, its total reward less the
        # penalty of its first step. Unused trajectory codes (sparse traj ids) weigh 0.
        penalty_in_order = np.empty(batch.n + 1)
        penalty_in_order[batch.slot] = batch.penalty
        penalty_in_order[batch.n] = 0.0  # the start of unused codes past the last trajectory
        values = ret - penalty_in_order[batch.traj_start]
        if batch.num_trajs == batch.num_used_trajs:
            used = None
            count = np.bincount(traj_group, minlength=num)
            total = np.bincount(traj_group, weights=values, minlength=num)
        else:
            used = length > 0
            count = np.bincount(traj_group, weights=used, minlength=num)
            total = np.bincount(traj_group, weights=values * used, minlength=num)
    mean = total / np.maximum(count, 1)
    # A group with a single value has no baseline: verl normalises it with mean 0 and std 1.
    single = count == 1
    mean[single] = 0.0
    centred = (ret - mean[traj_group])[batch.traj_code] - batch.penalty
    if config.norm == "mean_norm":
        return centred
    if config.episode_stats_over == "steps":
        sq = np.bincount(batch.group_code, weights=centred * centred, minlength=num)
    else:
        dev = values - mean[traj_group]
        sq = np.bincount(
            traj_group, weights=dev * dev if used is None else dev * dev * used, minlength=num
        )
    std = np.sqrt(sq / np.maximum(count - 1, 1))
    std[single] = 1.0
    return centred / (std + config.epsilon)[batch.group_code]


def step_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> np.ndarray:
    """Step-level anchor-state group advantage (Eqs. 5-7), float64 (N,).

    A row's value is its discounted return less its invalid-action penalty, normalised within its
    step group (same group, equal ``state_key``). A step group of one row gets exactly 0: its
    mean is its own value (a bincount of one weight is exact), and 0 / (0 + epsilon) is 0.
    """
    if batch.step_group_code is None:
        raise ValueError("the step advantage needs state_keys (one anchor state per row)")
    codes, num = batch.step_group_code, batch.num_step_groups
    value = batch.returns - batch.penalty
    count = batch.step_group_count()
    mean = np.bincount(codes, weights=value, minlength=num) / np.maximum(count, 1)
    centred = value - mean[codes]
    if config.norm == "mean_norm":
        return centred
    std = _std(codes, value, mean, count)
    return centred / (std[codes] + config.epsilon)


@register_advantage("gigpo", options=GiGPOConfig, inputs=("state_keys",))
def gigpo(batch: AdvantageBatch, config: GiGPOConfig) -> AdvantageResult:
    """GiGPO: ``A = A_episode + omega * A_step`` (Eq. 8)."""
    a_episode = episode_advantage(batch, config)
    a_step = step_advantage(batch, config)
    combined = np.empty(batch.n, dtype=np.float32)
    np.add(a_episode, a_step if config.omega == 1.0 else config.omega * a_step, out=combined)
    return AdvantageResult(
        advantages=combined,
        returns=batch.returns,
        episode_advantage=a_episode,
        step_advantage=a_step,
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )


def _episode_only(batch: AdvantageBatch, a_episode: np.ndarray) -> AdvantageResult:
    """The result of an estimator with no step term: each row's advantage is ``a_episode``."""
    return AdvantageResult(
        advantages=a_episode.astype(np.float32),
        returns=batch.returns,
        episode_advantage=a_episode,
        step_advantage=np.zeros(batch.n),
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )


@register_advantage("grpo", options=EpisodeGroupConfig)
def grpo(batch: AdvantageBatch, config: EpisodeGroupConfig) -> AdvantageResult:
    """GRPO for multi-turn agents as verl-agent runs it: every step row of a trajectory gets the
    trajectory's episode advantage (undiscounted outcome, group-normalised); no step term.

    verl-agent's GRPO divides by the std by default (``norm_adv_by_std_in_grpo=True``): pass
    ``norm="mean_std_norm"`` for that; ``"mean_norm"`` is Dr. GRPO's variant.
    """
    a_episode = episode_advantage(batch, config)
    return _episode_only(batch, a_episode)


@dataclass(frozen=True)
class SLEARLConfig(AdvantageConfig):
    """SLEA-RL's options: GiGPO's step weight; its episode statistics are fixed (see
    :func:`slea_rl`), so a caller's ``episode_stats_over`` cannot turn it back into GiGPO."""

    omega: float = 1.0
    """weight of the step advantage (the authors' ``step_advantage_w``), GiGPO Eq. 8"""

    @property
    def episode_stats_over(self) -> EpisodeStatsOver:
        """Always ``"steps"``: the authors' code leaves verl-agent's
        ``compute_mean_std_cross_steps`` at its default, ``True``."""
        return "steps"


@register_advantage("slea_rl", options=SLEARLConfig, inputs=("state_keys",))
def slea_rl(batch: AdvantageBatch, config: SLEARLConfig) -> AdvantageResult:
    """SLEA-RL's step-level credit assignment (Wang and Jiang, arXiv 2603.18079).

    SLEA-RL has three parts: (i) step-level observation clustering, (ii) a self-evolving
    experience library (successful strategies and failure patterns, score-based admission,
    rate-limited extraction) from which experiences are retrieved at every step by the current
    observation's cluster and put into the prompt, and (iii) policy optimisation with
    step-level credit assignment. Only (iii) is an advantage; (i) and (ii) change what the
    policy reads, not how its actions are credited. The advantage the authors ship
    (``compute_forge_advantage`` in their verl-agent fork, ``adv_estimator: forge``) is
    GiGPO's, computed on the same clusters the retrieval is keyed by:

    * episode advantage, GiGPO Eq. 3: ``A_E = R(tau) - mean`` over the group's step rows
      (their code calls verl-agent's ``episode_norm_reward`` with
      ``compute_mean_std_cross_steps`` at its default, ``True``: ``episode_stats_over`` is
      fixed to ``"steps"`` here, and not an option, the one difference from :func:`gigpo`);
    * step advantage, GiGPO Eqs. 5-7: discounted returns ``R_t = r_t + gamma R_{t+1}``
      (their ``compute_step_discounted_returns``) compared within an observation cluster of
      the group; their default clustering is exact (``enable_similarity=False``), and here a
      cluster is an exact ``state_key``, which names the state whatever its text;
    * ``A = A_E + omega A_S``, GiGPO Eq. 8 (their ``step_advantage_w``, default 1.0), with
      ``norm`` their ``mode`` (default ``"mean_norm"``) and gamma 0.95.

    Their optional ``compute_experience_weighted_advantage`` (every advantage times
    ``1 + 0.1 min(1, library size / 100)``) is not called by their trainer and is not applied
    here. The experience library and its retrieval live on the rollout side
    (:mod:`agentgym.algorithms.slea_library`), keyed by the same ``state_key``.
    """
    return gigpo(batch, config)


@register_advantage("rloo", options=AdvantageConfig)
def rloo(batch: AdvantageBatch, config: AdvantageConfig) -> AdvantageResult:
    """RLOO (REINFORCE leave-one-out: Kool et al. 2019; Ahmadian et al. 2024).

    With K trajectories in a group, trajectory i's baseline is the mean outcome of the *other*
    K - 1: ``A_i = R_i - 1/(K-1) sum_{j != i} R_j = K/(K-1) (R_i - mean_j R_j)``, unbiased
    because the baseline does not depend on trajectory i. Every step row of the trajectory
    gets ``A_i`` less its own invalid-action penalty (the same per-row charge as GRPO).
    ``norm="mean_std_norm"`` divides by the group's sample std of ``R`` + epsilon. A group of
    one trajectory has no other trajectory: its baseline is 0 (the advantage is ``R_i``).
    It takes no ``episode_stats_over`` (the baseline is over trajectories by definition).
    """
    num, traj_group, ret = batch.num_groups, batch.traj_group, batch.episode_return
    used = batch.traj_length > 0
    count = np.bincount(traj_group, weights=used, minlength=num)
    total = np.bincount(traj_group, weights=ret * used, minlength=num)
    k = count[traj_group]  # (T,) trajectories in each trajectory's group
    # Leave-one-out mean: (sum - own) / (K - 1); with K == 1 the baseline is 0.
    baseline = np.where(k > 1, (total[traj_group] - ret) / np.maximum(k - 1, 1), 0.0)
    centred = ret - baseline
    if config.norm == "mean_std_norm":
        mean = total / np.maximum(count, 1)
        dev = (ret - mean[traj_group]) * used
        std = np.sqrt(
            np.bincount(traj_group, weights=dev * dev, minlength=num) / np.maximum(count - 1, 1)
        )
        std[count <= 1] = 1.0
        centred = centred / (std[traj_group] + config.epsilon)
    a_episode = centred[batch.traj_code] - batch.penalty
    return _episode_only(batch, a_episode)


@register_advantage("slate", options=AdvantageConfig, inputs=("branch_ids",))
def slate(batch: AdvantageBatch, config: AdvantageConfig) -> AdvantageResult:
    """SLATE's truncated step-level sampling (arXiv 2602.23440): advantages within branch groups.

    A branch group is k samples that share a prefix and differ from the branch step on: their
    branch-step rows act from one state (one snapshot). Each sample is scored by its row's
    discounted return (Eq. 5 here, less the row's invalid-action penalty) and compared with its
    siblings only: ``A_j = G_j - mean_{i in branch} G_i``, divided by the siblings' sample std
    + epsilon with ``mean_std_norm`` (the paper's Eq. 5: ``(r_j - mean) / (std + eps)``).
    Everything before the branch step is shared and cancels out of the comparison: this is
    what removes the variance of the other T - 1 steps. Two rollouts produce these rows:

    * the paper's (``trainers.gigpo.rollout.collect_stepwise``, Algorithm 1): every step of one
      episode per group is a branch point, each candidate is one step and its own one-row
      trajectory, so ``G_j`` is its dense reward ``r_j`` (env reward + a judge's score);
    * a Monte Carlo variant for envs without a dense judge (``collect_tree``): each sibling
      plays on to the episode's end and ``G_j`` is its return from the branch step.

    Rows that are not branch-step samples (``branch_ids == -1``: steps after the branch step in
    the Monte Carlo variant) get advantage 0, and so does a branch group of one. The root group
    (k rollouts from the reset state) is the branch group at step 0 when the caller marks it so.
    """
    if batch.branch_ids is None:
        raise ValueError(
            "slate needs branch_ids: the branch group of every branch-step row, -1 elsewhere "
            "(the trainer's --rollout tree provides them)"
        )
    value = batch.returns - batch.penalty
    member = batch.branch_ids >= 0
    codes, num = _int_codes(batch.branch_ids[member])
    a_step = np.zeros(batch.n)
    if num:
        vals = value[member]
        count = np.bincount(codes, minlength=num)
        mean = np.bincount(codes, weights=vals, minlength=num) / np.maximum(count, 1)
        centred = vals - mean[codes]
        if config.norm == "mean_std_norm":
            centred = centred / (_std(codes, vals, mean, count)[codes] + config.epsilon)
        # A group of one has mean equal to its value (exact), so its advantage is already 0.
        a_step[member] = centred
    return AdvantageResult(
        advantages=a_step.astype(np.float32),
        returns=batch.returns,
        episode_advantage=np.zeros(batch.n),
        step_advantage=a_step,
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )


@register_advantage("cw_grpo", options=CWGRPOConfig, inputs=("contributions",))
def cw_grpo(batch: AdvantageBatch, config: CWGRPOConfig) -> AdvantageResult:
    """CW-GRPO: Contribution-Weighted GRPO (arXiv 2604.14267), a judge's per-round scores share
    each successful trajectory's GRPO credit among its rounds before the answer round.

    Conventions follow the authors' implementation (``compute_cw_grpo_advantage`` in their verl
    fork). Trajectory i has T_i rounds; its last round (the answer) keeps GRPO's advantage and
    only the R_i = T_i - 1 rounds before it are reweighted:

    * ``A_i``: GRPO's episode advantage of the trajectory's outcome (Eq. 3, without penalties);
    * ``c_{i,t}`` in [0, 1]: the judge's contribution of round t (the paper's retrieval utility
      times reasoning correctness; our judges return that product as one score);
    * weights over the non-last rounds t < T_i - 1:
      ``contribution_gamma = inf``: ``w_{i,t} = c_{i,t} / max(sum_s c_{i,s}, 1e-6)``;
      finite gamma: ``w_{i,t} = softmax_t(gamma * c_{i,t})``;
    * ``A_i < 0``: ``w_{i,t} = 1 / R_i`` whatever the judge says (a failure's blame is not
      redistributed);
    * ``A_{i,t} = R_i w_{i,t} A_i - p_{i,t}`` for t < T_i - 1 and ``A_{i,T_i-1} = A_i - p``.

    The weights sum to 1, so the non-last rounds share ``R_i A_i`` (mean weight 1): credit is
    conserved, except that with ``gamma = inf`` a successful trajectory whose non-last rounds
    all score 0 gives those rounds advantage 0 (the authors' behaviour: no round earned it).
    A trajectory of one round is plain GRPO. The invalid-action penalty ``p`` of a row is
    charged to that round only, unscaled (weighting never amplifies or hides it). The authors'
    code also sums the answer round's judge score into the ``gamma = inf`` normaliser (their
    judge rarely credits an answer round with a retrieval); here it sums the reweighted rounds
    only, as the equations write it, so a judge that scores the answer round does not shrink
    the others' credit. Their script treats gamma >= 10 as infinity; here any finite gamma is
    a softmax. Row ``contributions`` are required.
    """
    if batch.contributions is None:
        raise ValueError(
            "cw_grpo needs contributions: a judge score in [0, 1] per row "
            "(see agentgym.algorithms.judges)"
        )
    # A_i: GRPO's episode advantage of the trajectory's outcome, before any per-row penalty
    # (a shallow copy with zero penalties shares every array but that one).
    clean = copy.copy(batch)
    clean.penalty = np.zeros(batch.n)
    a_traj = episode_advantage(clean, config)
    c = batch.contributions
    tcode, num = batch.traj_code, batch.num_trajs
    rounds_before = batch.row_length - 1  # R_i per row
    reweighted = batch.position < rounds_before  # every round but the answer round
    if math.isinf(config.contribution_gamma):
        total = np.bincount(tcode, weights=c * reweighted, minlength=num)
        share = c / np.maximum(total, 1e-6)[tcode]
    else:
        # Softmax over the non-last rounds, shifted by each trajectory's largest score so that
        # exp never overflows: a segment max over the rows in (trajectory, step) order.
        in_order = np.full(batch.n, -np.inf)
        in_order[batch.slot] = np.where(reweighted, c, -np.inf)
        peak = np.zeros(num)
        used = batch.traj_length > 0
        if batch.n:
            peak[used] = np.maximum.reduceat(in_order, batch.traj_start[used])
        peak[~np.isfinite(peak)] = 0.0  # one-round trajectories: nothing to reweigh
        exp = np.where(reweighted, np.exp(config.contribution_gamma * (c - peak[tcode])), 0.0)
        share = exp / np.maximum(np.bincount(tcode, weights=exp, minlength=num), 1e-300)[tcode]
    # Failures spread their (negative) credit evenly: share 1 / R_i, weight 1.
    weight = np.where(a_traj < 0.0, 1.0, rounds_before * share)
    weight[~reweighted] = 1.0
    a_episode = weight * a_traj - batch.penalty
    return _episode_only(batch, a_episode)


# ---------------------------------------------------------------------------------------------
# Statistics, key encoding and the token-level helper
# ---------------------------------------------------------------------------------------------


def step_group_stats(count: np.ndarray | None, rows: int | None = None) -> dict[str, float]:
    """Step-group statistics of a batch, as the paper plots them (flat keys, JSON-ready).

    Args:
        count: int (S,): the number of rows of each step group (zeros are ignored), or None
            (returns ``{}``).
        rows: ``count.sum()`` when the caller knows it.

    Returns:
        ``num_step_groups``; ``mean_step_group_size``; ``max_step_group_size``;
        ``singleton_share`` (share of step groups of size 1); ``singleton_row_share`` (share of
        rows whose step advantage is 0 because they have no peer); and for every bucket of
        :data:`SIZE_BUCKETS`, ``size_share/<label>``: the share of step groups in that bucket.
    """
    if count is None:
        return {}
    # Histogram of group sizes (index = size), then per-bucket sums from its cumulative sum.
    hist = np.bincount(count)
    cum = np.cumsum(hist).tolist()
    largest = len(hist) - 1
    num = cum[-1] - cum[0] if cum else 0  # hist[0] counts unused codes
    if num == 0:
        return dict.fromkeys(_STAT_KEYS, 0.0)
    rows = int(count.sum()) if rows is None else rows
    singles = cum[1] - cum[0]
    stats = {
        "num_step_groups": float(num),
        "mean_step_group_size": rows / num,
        "max_step_group_size": float(largest),
        "singleton_share": singles / num,
        "singleton_row_share": singles / rows,
    }
    for label, lo, hi in SIZE_BUCKETS:
        top = largest if hi is None else min(hi, largest)
        in_bucket = cum[top] - cum[lo - 1] if top >= lo else 0
        stats[f"size_share/{label}"] = in_bucket / num
    return stats


def encode_state_keys(state_keys: Sequence[Hashable]) -> np.ndarray:
    """Integer codes for N hashable state keys: int64 (N,), equal iff the keys are equal.

    One C-level dict pass (``dict.setdefault`` mapped over the keys); a key's code is the index of
    its first occurrence. Rollout code that builds training rows can call this once per batch and
    pass the codes as ``state_keys`` (it is also what :func:`compute_advantage` does with a list).
    """
    n = len(state_keys)
    first_row: dict[Hashable, int] = {}
    try:
        return np.fromiter(map(first_row.setdefault, state_keys, range(n)), np.int64, count=n)
    except TypeError as err:
        raise TypeError(
            "state_keys must be hashable (bytes, str, int or tuples of them); convert lists or "
            f"arrays with tuple(...) first ({err})"
        ) from err


def token_advantages(advantages: Any, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast each row's advantage to every response token of the row.

    Args:
        advantages: (N,) numpy array or tensor, e.g. ``AdvantageResult.advantages``.
        response_mask: (N, T) tensor, 1 on the row's response tokens, 0 on padding.

    Returns:
        float32 (N, T) on ``response_mask``'s device: ``advantages[:, None] * response_mask``.
    """
    import torch

    adv = torch.as_tensor(advantages, dtype=torch.float32, device=response_mask.device)
    if adv.ndim != 1 or response_mask.ndim != 2 or adv.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"advantages must be (N,) and response_mask (N, T); got {tuple(adv.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    return adv.unsqueeze(1) * response_mask.to(torch.float32)


# ---------------------------------------------------------------------------------------------
# Array helpers
# ---------------------------------------------------------------------------------------------


def _rows(name: str, values: Any, n: int, dtype: type) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) like group_ids, got {arr.shape}")
    return arr


def _int_rows(name: str, values: Any, n: int | None = None) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        want = "(N,)" if n is None else f"({n},) like group_ids"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    if arr.size and arr.dtype.kind not in "iub":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _int_codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes for int64 (N,) values: (codes in [0, num), num); equal codes iff equal values.

    Compact ranges are shifted to start at 0 (codes of absent values stay unused); sparse ones
    are densified with np.unique.
    """
    n = values.shape[0]
    if n == 0:
        return values, 0
    bound = _COMPACT_RANGE * n + 64
    # One reduction for the common case, ids in [0, bound): a negative id viewed as unsigned
    # is huge and falls through to the general case.
    hi = int(values.view(np.uint64).max())
    if hi < bound:
        return values, hi + 1
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < bound:
        return values - lo, hi - lo + 1
    uniques, codes = np.unique(values, return_inverse=True)
    return codes.reshape(-1).astype(np.int64, copy=False), int(uniques.shape[0])


def _state_codes(keys: Sequence[Hashable] | np.ndarray, n: int) -> tuple[np.ndarray, int, bool]:
    """(codes in [0, num), num, whether each code is the index of a row holding that key)."""
    if isinstance(keys, np.ndarray) and keys.dtype.kind != "O":
        if keys.shape != (n,):
            raise ValueError(f"state_keys must have shape ({n},) like group_ids, got {keys.shape}")
        if keys.dtype.kind in "iub":
            return (*_int_codes(keys.astype(np.int64, copy=False)), False)
        uniques, codes = np.unique(keys, return_inverse=True)
        return codes.reshape(-1).astype(np.int64, copy=False), int(uniques.shape[0]), False
    if len(keys) != n:
        raise ValueError(f"state_keys must have {n} entries like group_ids, got {len(keys)}")
    return encode_state_keys(keys), n, True


def _std(codes: np.ndarray, values: np.ndarray, mean: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per-segment sample std (n - 1, as torch.std), two-pass for accuracy; 0 for size <= 1."""
    dev = values - mean[codes]
    sq = np.bincount(codes, weights=dev * dev, minlength=mean.shape[0])
    return np.sqrt(sq / np.maximum(count - 1, 1))
