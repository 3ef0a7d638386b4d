"""Advantage variance of branching (SLATE) vs full-trajectory groups on the corridor, measured.

SLATE (truncated step-level sampling) draws the k samples of a group from one shared prefix, so
they differ only at the step being judged; a full-trajectory group (GRPO) draws k whole
episodes, and every step's advantage carries the noise of every other step. Under a dense
per-step reward the paper proves the variance of the advantage estimate drops by up to a
factor of T for T-step trajectories. This benchmark measures that factor instead of quoting it.

Setup (no model: a fixed stochastic policy): ``AgentGym/Corridor-v0`` (``--length`` rooms,
``--doors`` doors), one layout; in a room the policy takes the right door with probability
``--p-right`` (else a wrong one), in a dead end it says ``back`` with probability 0.9 (else an
invalid word). The dense reward of a step is the rule judge's score
(:class:`agentgym.algorithms.judges.ProgressJudge`: 1 when the step advanced a room). Per group
of ``k`` samples and over ``--groups`` seeds:

* ``full``: k episodes from the reset state; the advantage of step t of episode i is
  ``sum_s r_s(i) - mean_j sum_s r_s(j)`` (GRPO under the dense reward);
* ``truncated``: one episode picks a branch step t uniformly; the env is restored k times from
  its snapshot at t (``env.unwrapped.snapshot()/restore()``), each takes one action; the
  advantage is ``r_t(i) - mean_j r_t(j)`` (SLATE);
* ``tree``: as ``truncated``, but each continuation plays on to the end and the advantage
  compares the continuations' returns from t (``compute_advantage("slate")``, what the
  trainer's ``--rollout tree`` trains on when no dense judge is at hand).

The variance of an estimate is pooled within-cell variance, the cells being the state the
estimate is for (the quantity the paper's proof bounds: over the step's action and everything
else), and also (state, action) (the noise in the credit one given action gets: with a
deterministic step reward, truncated sampling leaves only the siblings' baseline noise). The
prediction is the paper's bound T (the mean episode length) and the factor its proof gives under
independent steps, ``sum_t Var(r_t) / Var(r at the branch step)`` from measured per-step
variances. Writes ``benchmarks/results/credit_variance.json``; medians over ``--repeats``
independent repeats.

Learning curves (``curves``): GiGPO, SPA-RL, OPRL, SLEA-RL (its advantage, with its experience
library putting retrieved experiences into the prompts), SLATE (``--rollout stepwise``, the paper's
truncated step-level sampling with the rule judge's dense reward), CW-GRPO (the rule judge), GRPO
and HiPER (subgoal replies, planner and executor advantages per token; its mean segments per
episode are reported) train the same tiny random Qwen2 with the same script
(``trainers.gigpo.train``) and the same seeds, as ``bench_gigpo_vs_grpo.py`` does; only the
estimator differs (and SLATE's rollout shape, and HiPER's second token per turn). Every
iteration generates one action per env per round, so the samples are equal per
round; the mean actions per iteration are reported (``slate_tree`` and ``rloo`` can be added
with ``--methods``). SPA-RL and OPRL train their learned step-reward models beside the policy
(:class:`agentgym.algorithms.learned_credit.LearnedCredit`). Writes ``credit_curves.json`` and
``credit_curves.png`` (median held-out success, min-max band).

    python benchmarks/bench_credit_assignment.py variance          # ~15 s
    python benchmarks/bench_credit_assignment.py curves --jobs 2   # ~30 min on 2 cores
    python benchmarks/bench_credit_assignment.py curves --jobs 2 --methods slea_rl --add
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import agentgym  # noqa: F401 - registers the env ids
from agentgym.algorithms.advantage import compute_advantage
from agentgym.io import atomic_path, atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results"
TASK = 7


class Policy:
    """The fixed stochastic corridor policy (reads the right door from the env's layout)."""

    def __init__(self, env: gym.Env, p_right: float) -> None:
        self.inner = env.unwrapped
        self.right = self.inner.layout(TASK)
        self.p_right = p_right

    def __call__(self, info: dict, rng: np.random.Generator) -> str:
        doors = self.inner.doors
        if info["state_key"][3]:  # dead end
            return "back" if rng.random() < 0.9 else "jump"
        room = info["state_key"][2]
        if rng.random() < self.p_right:
            return doors[self.right[room]]
        wrong = [d for i, d in enumerate(doors) if i != self.right[room]]
        return wrong[int(rng.integers(len(wrong)))]


def episode(env, policy, rng, info, max_steps: int = 100) -> list[tuple]:
    """Play from the env's current state: [(state_key, action, dense reward, env reward)]."""
    out, score = [], info["score"]
    for _ in range(max_steps):
        action = policy(info, rng)
        key = info["state_key"]
        _, reward, terminated, truncated, info = env.step(action)
        out.append((key, action, float(info["score"] > score), float(reward)))
        score = max(score, info["score"])
        if terminated or truncated:
            break
    return out


def pooled_variance(cells: dict) -> float:
    """Mean within-(state, action) variance, weighted by the cell's degrees of freedom."""
    num = den = 0.0
    for values in cells.values():
        if len(values) > 1:
            num += np.var(values, ddof=1) * (len(values) - 1)
            den += len(values) - 1
    return num / den if den else float("nan")


def measure_variance(args: argparse.Namespace, seed: int) -> dict:
    env = gym.make("AgentGym/Corridor-v0", length=args.length, num_doors=args.doors)
    policy = Policy(env, args.p_right)
    rng = np.random.default_rng(seed)
    cells: dict[str, dict] = {m: defaultdict(list) for m in ("full", "truncated", "tree")}
    # The same estimates keyed by state only: the variance the paper's proof bounds (over the
    # step's action and everything else), beside the noise a given action's credit carries.
    by_state: dict[str, dict] = {m: defaultdict(list) for m in cells}
    per_step_rewards: dict[tuple, list[float]] = defaultdict(list)
    lengths, steps_used = [], {m: 0 for m in cells}
    full_paths, branch_states = [], []
    for _ in tqdm(range(args.groups), desc=f"variance seed {seed}", leave=False):
        # Full-trajectory group.
        group = []
        for _ in range(args.k):
            _, info = env.reset(options={"task": TASK})
            group.append(episode(env, policy, rng, info))
        totals = np.array([sum(r for _, _, r, _ in ep) for ep in group])
        adv = totals - totals.mean()
        for ep, a in zip(group, adv, strict=True):
            lengths.append(len(ep))
            full_paths.append([key for key, _, _, _ in ep])
            steps_used["full"] += len(ep)
            for key, action, r, _ in ep:
                cells["full"][(key, action)].append(a)
                by_state["full"][key].append(a)
                per_step_rewards[key].append(r)
        # Branch group: a prefix, then k siblings from its snapshot.
        _, info = env.reset(options={"task": TASK})
        terminated = truncated = False
        prefix_len = int(rng.integers(max(1, int(np.mean(lengths[-args.k :])))))
        for _ in range(prefix_len):
            _, _, terminated, truncated, info = env.step(policy(info, rng))
            if terminated or truncated:
                break
        if info["won"] or terminated or truncated:
            continue
        snap, branch_info = env.unwrapped.snapshot(), info
        branch_states.append(info["state_key"])
        one_step, tree = [], []
        for _ in range(args.k):
            env.unwrapped.restore(snap)
            tree.append(episode(env, policy, rng, branch_info))
            one_step.append(tree[-1][0])
        steps_used["truncated"] += args.k
        steps_used["tree"] += sum(len(ep) for ep in tree)
        r_t = np.array([r for _, _, r, _ in one_step])
        for (key, action, _, _), a in zip(one_step, r_t - r_t.mean(), strict=True):
            cells["truncated"][(key, action)].append(a)
            by_state["truncated"][key].append(a)
        # The tree estimator on the same continuations: dense rewards, gamma 1, branch rows.
        rows = [(i, t, r) for i, ep in enumerate(tree) for t, (_, _, r, _) in enumerate(ep)]
        result = compute_advantage(
            "slate",
            group_ids=[0] * len(rows),
            traj_ids=[i for i, _, _ in rows],
            step_ids=[t for _, t, _ in rows],
            rewards=[r for _, _, r in rows],
            state_keys=None,
            invalid=[False] * len(rows),
            gamma=1.0,
            branch_ids=[0 if t == 0 else -1 for _, t, _ in rows],
        )
        first = [j for j, (_, t, _) in enumerate(rows) if t == 0]
        for (key, action, _, _), j in zip(one_step, first, strict=True):
            cells["tree"][(key, action)].append(float(result.advantages[j]))
            by_state["tree"][key].append(float(result.advantages[j]))
    var = {m: pooled_variance(c) for m, c in by_state.items()}
    var_given_action = {m: pooled_variance(c) for m, c in cells.items()}
    # The proof's factor under independent steps: the full return's variance is the sum of
    # the per-step variances; the truncated one is one step's (averaged over visited states).
    state_var = {key: float(np.var(v, ddof=1)) for key, v in per_step_rewards.items() if len(v) > 1}
    mean_len = float(np.mean(lengths))
    sum_var_full = np.mean([sum(state_var.get(key, 0.0) for key in path) for path in full_paths])
    var_branch = np.mean([state_var.get(key, 0.0) for key in branch_states])
    return {
        "seed": seed,
        "variance": var,
        "ratio_full_over_truncated": var["full"] / var["truncated"],
        "ratio_full_over_tree": var["full"] / var["tree"],
        "variance_given_action": var_given_action,
        "ratio_given_action_full_over_truncated": var_given_action["full"]
        / var_given_action["truncated"],
        "ratio_given_action_full_over_tree": var_given_action["full"] / var_given_action["tree"],
        "mean_episode_length": mean_len,
        "predicted_bound_T": mean_len,
        "predicted_independent_steps": float(sum_var_full / var_branch),
        "env_steps": steps_used,
    }


def run_variance(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    runs = [measure_variance(args, seed) for seed in range(args.repeats)]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    summary = {
        "median_variance": {
            m: statistics.median(r["variance"][m] for r in runs) for m in runs[0]["variance"]
        },
        "median_ratio_full_over_truncated": med("ratio_full_over_truncated"),
        "median_ratio_full_over_tree": med("ratio_full_over_tree"),
        "median_ratio_given_action_full_over_truncated": med(
            "ratio_given_action_full_over_truncated"
        ),
        "median_ratio_given_action_full_over_tree": med("ratio_given_action_full_over_tree"),
        "median_episode_length_T": med("mean_episode_length"),
        "median_predicted_independent_steps": med("predicted_independent_steps"),
    }
    print(json.dumps(summary, indent=1))
    return {
        "benchmark": "per-step advantage variance: branching vs full-trajectory groups, "
        "AgentGym/Corridor-v0, fixed stochastic policy, dense rule-judge reward",
        "args": vars(args),
        "summary": summary,
        "runs": runs,
        "total_seconds": time.perf_counter() - t0,
        "machine": {
            "python": platform.python_version(),
            "note": "timings depend on the machine and its load",
        },
    }


COLORS = {
    "gigpo": (31, 119, 180),
    "grpo": (214, 39, 40),
    "slate": (44, 160, 44),
    "slate_tree": (23, 190, 207),
    "cw_grpo": (148, 103, 189),
    "rloo": (255, 127, 14),
    "spa": (140, 86, 75),
    "oprl": (227, 119, 194),
    "hiper": (80, 160, 60),
    "slea_rl": (188, 189, 34),
}


#: method name -> trainer options. SLATE as its paper runs it (stepwise truncated sampling,
#: Eq. 5's std normalisation); ``slate_tree`` is the Monte Carlo tree variant; CW-GRPO and
#: SLATE score rounds with the corridor's rule judge (a room passed). SPA-RL and OPRL train
#: their learned step-reward models beside the policy (``LearnedCredit``, hashed text features).
#: HiPER with its authors' per-level whitening; its replies may start with a plan
#: (``<switch>SWITCH</switch>`` is one word of the tiny vocabulary), so it generates up to 2
#: tokens per turn where the others generate 1 (a reply that plans and acts needs both; see ``trainers/gigpo/subgoals.py``).
METHODS = {
    "gigpo": lambda a: {"advantage": "gigpo"},
    "grpo": lambda a: {"advantage": "grpo"},
    "rloo": lambda a: {"advantage": "rloo"},
    "cw_grpo": lambda a: {"advantage": "cw_grpo", "judge": "rule"},
    "slate": lambda a: {"advantage": "slate", "rollout": "stepwise", "norm": "mean_std_norm"},
    "spa": lambda a: {"advantage": "spa"},
    "oprl": lambda a: {"advantage": "oprl"},
    "slea_rl": lambda a: {"advantage": "slea_rl"},  # with its experience library in the prompts
    "hiper": lambda a: {"advantage": "hiper", "norm": "mean_std_norm", "max_new_tokens": 2},
    "slate_tree": lambda a: {
        "advantage": "slate",
        "rollout": "tree",
        "branch_points": a.branch_points,
        "continuations": a.continuations,
    },
}


def train_run(method: str, seed: int, args: argparse.Namespace, out: str) -> dict:
    """One learning-curve run of ``method`` (a key of :data:`METHODS`); a HiPER run also
    reports its rollouts' mean segments per episode, per iteration (more than 1: the model
    does plan, so the planner and executor levels differ)."""
    from bench_gigpo_vs_grpo import run

    result = run(method, seed, args, Path(out), **METHODS[method](args))
    metrics = Path(out) / f"{method}-{seed}" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    segments = [r[SEGMENTS] for r in records if SEGMENTS in r]
    if segments:
        result["segments_per_episode"] = segments
    return result


#: the trainer's metric of HiPER's segments per episode (``trainers/gigpo/train.py``)
SEGMENTS = "advantage/segments_per_episode"


def plot_curves(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for m, s in summary["methods"].items():
        c = tuple(v / 255 for v in COLORS.get(m, (0, 0, 0)))
        label = m.upper().replace("_", "-")
        if "mean_actions_per_iteration" in s:
            label += f" ({s['mean_actions_per_iteration']:.0f} actions/it)"
        ax.plot(s["iterations"], s["median"], label=label, color=c)
        ax.fill_between(s["iterations"], s["min"], s["max"], color=c, alpha=0.15)
    ax.set_xlabel("iteration (one action per env per round; actions per iteration in legend)")
    ax.set_ylabel("held-out success rate")
    ax.set_ylim(0, 1)
    ax.set_title("Corridor, same envs per iteration: median and min-max over seeds", fontsize=10)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")


def added_to(args: argparse.Namespace) -> dict:
    """The committed ``credit_curves.json`` that ``--add`` adds runs to; its seeds, iterations
    and evaluation interval must be this call's, so that every curve is at equal samples."""
    path = RESULTS / "credit_curves.json"
    if not path.is_file():
        raise SystemExit(f"--add: {path} does not exist; run the curves without --add first")
    previous = json.loads(path.read_text())
    for name in ("seeds", "iterations", "eval_every"):
        if previous["args"][name] != getattr(args, name):
            raise SystemExit(
                f"--add: {path} was measured with {name} {previous['args'][name]}, not "
                f"{getattr(args, name)}; pass the same, or rerun every method"
            )
    return previous


def run_curves(args: argparse.Namespace) -> dict:
    import tempfile

    from bench_gigpo_vs_grpo import Config, curve_summary, run_all  # puts the clone on sys.path

    if args.iterations is None:
        args.iterations = Config.for_env("AgentGym/Corridor-v0").iterations
    previous = added_to(args) if args.add else None
    t0 = time.perf_counter()
    jobs = [(m, seed) for seed in args.seeds for m in args.methods]
    with tempfile.TemporaryDirectory() as tmp:
        runs = run_all(train_run, jobs, args.jobs, args, tmp)
    methods = list(args.methods)
    if previous is not None:  # the other methods' runs stay as they were measured
        kept = [m for m in previous["summary"]["methods"] if m not in methods]
        runs = [r for r in previous["runs"] if r["method"] in kept] + runs
        methods = kept + methods
        args.methods = methods
    summary: dict = {"methods": {}}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        summary["methods"][method] = {
            **curve_summary(mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "mean_actions_per_iteration": float(
                np.mean([a for r in mine for a in r["actions_per_iteration"]])
            ),
        }
        segments = [s for r in mine for s in r.get("segments_per_episode", [])]
        if segments:
            summary["methods"][method]["mean_segments_per_episode"] = float(np.mean(segments))
    if "grpo" in summary["methods"]:
        base = summary["methods"]["grpo"]
        for s in summary["methods"].values():
            s["auc_ratio_over_grpo"] = (
                s["auc_median"] / base["auc_median"] if base["auc_median"] else None
            )
    png = RESULTS / "credit_curves.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot_curves(summary, png)
    summary["plot"] = png.name
    for m, s in summary["methods"].items():
        print(f"{m}: final median {s['final_median']:.3f} {s['final_per_seed']}, "
              f"AUC median {s['auc_median']:.3f}")  # fmt: skip
    return {
        "benchmark": "credit assignment estimators (GiGPO, SPA-RL, OPRL, SLATE, CW-GRPO, GRPO, "
        "HiPER) at equal samples, "
        "AgentGym/Corridor-v0, tiny random Qwen2 on CPU",
        "metric": "held-out (split 'test') greedy success rate per evaluation point",
        "args": {k: v for k, v in vars(args).items() if k != "what"},
        "summary": summary,
        "runs": runs,
        "total_seconds": time.perf_counter() - t0 + (previous or {}).get("total_seconds", 0.0),
        "machine": {
            "python": platform.python_version(),
            "note": "timings depend on the machine and its load",
        },
    }


def write(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    atomic_write_json(path, result, indent=1, default=str)  # a kill never leaves half a JSON
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    v = sub.add_parser("variance", help="advantage variance, branching vs full groups")
    v.add_argument("--length", type=int, default=4)
    v.add_argument("--doors", type=int, default=3)
    v.add_argument("--p-right", type=float, default=0.6)
    v.add_argument("--k", type=int, default=8, help="samples per group")
    v.add_argument("--groups", type=int, default=1500, help="groups per repeat")
    v.add_argument("--repeats", type=int, default=5)
    c = sub.add_parser("curves", help="learning curves of the estimators at equal samples")
    c.add_argument(
        "--methods",
        nargs="+",
        choices=sorted(METHODS),
        default=["gigpo", "spa", "oprl", "slea_rl", "slate", "cw_grpo", "grpo", "hiper"],
    )
    c.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    c.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="default: the trainer's corridor preset's (60: its held-out layouts need about 50)",
    )
    c.add_argument("--eval-every", type=int, default=5)
    c.add_argument("--branch-points", type=int, default=2, help="slate_tree's rollout")
    c.add_argument("--continuations", type=int, default=2, help="slate_tree's rollout")
    c.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    c.add_argument(
        "--add",
        action="store_true",
        help="run only --methods and add them to the existing credit_curves.json (same seeds, "
        "iterations and evaluation interval), keeping the other methods' runs",
    )
    args = parser.parse_args(argv)
    if args.what == "variance":
        print(f"wrote {write('credit_variance.json', run_variance(args))}")
    else:
        print(f"wrote {write('credit_curves.json', run_curves(args))}")


if __name__ == "__main__":
    main()
