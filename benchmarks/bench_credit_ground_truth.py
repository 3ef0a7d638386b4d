"""Credit assignment against exact ground truth: every registered estimator's per-step
advantages on sampled groups, scored against ``A = Q(s, a) - V(s)`` computed exactly.

For each setup (an env small enough to enumerate, and a policy) the script builds the env's
real state graph under the policy (``agentgym.algorithms.ground_truth``: expanded with
snapshots, a node per ``(state_key, time)`` since the envs have a step cap) for a few tasks,
solves Q and V by dynamic programming with the estimators' discount ``gamma``, then, at group
sizes k = 2, 4, 8, 16 and an equal budget of ``--episodes`` sampled episodes per batch
(``episodes / k`` groups, group g on task ``g % tasks``), samples episodes from the same graph
and runs every estimator of ``available_advantages()`` on the same batch:

* the flat estimators (GiGPO, GRPO, RLOO, CW-GRPO, and any other that reads only state keys
  and judge contributions) on k full episodes per group from the task's reset state; every
  row is scored; CW-GRPO's contributions come from the family's rule judge (a round scores 1
  when it raised ``info["score"]``); ``gigpo_step`` is GiGPO's step term alone;
* HiPER (``hiper``, critic-free) on the same flat batches; the envs state no subgoals, so a
  rule stands in for the planner: a turn starts a segment when it is the first or the step
  before it raised ``info["score"]`` (a subtask done, a new subgoal). Its executor advantage
  (``advantages``) is scored on every row; ``hiper_plan`` scores the planner advantage on
  the planner turns only;
* the learned-credit estimators, SPA-RL and OPRL, on the same flat batch, their models trained
  first on an independent batch of the same size and shape from the same graphs (what a model
  trained on the previous iteration's rollouts knows when the policy has not moved): SPA's
  progress estimator on its loss L_PE (``--learn-steps`` Adam steps), OPRL's implicit PRM by
  trajectory DPO, with the candidates of each state and the policy's own probabilities as the
  reference. Both read ``(state_key, action)`` through hashed text features
  (:func:`agentgym.algorithms.spa.text_features`, the state's words, the action and one
  bucket for the exact pair);
* SLATE on its own rollout shape with the same episode budget: per group one episode picks a
  branch step uniformly, and k continuations play on from that state (the first is that
  episode's own suffix); only the k branch-step rows carry SLATE's estimate and are scored.

Scores per batch (``score_advantages``, over all the batch's scored rows, every group and task
pooled): Spearman rank correlation with the exact advantages (average ranks for ties), sign
agreement (rows whose exact advantage is not 0; an estimate of 0 disagrees), and the mean
absolute error over ``mean |A|`` (1 = no better than predicting 0), twice: as the estimator
scales its advantages (its own normalisation: reward units under ``mean_norm``, but GRPO's
episode advantage is an undiscounted return and GiGPO adds a step term, so magnitudes differ
from A's), and after multiplying them by ``mean |A| / mean |est|`` so that magnitudes agree and
only the shape is compared. Medians over ``--repeats`` independent batches. Estimators run
with their default options and the benchmark's ``gamma`` (``--norm`` for the normalisation).

Setups: Corridor (3 rooms, 3 doors, step cap 10, 4 layouts) and Sokoban (6x6 rooms, one box,
step cap 10, 4 rooms), each under the uniform policy over admissible actions and under a tiny
fixed "model": seeded random word vectors score an action by its vector's dot product with
the mean vector of the observation's words, plus 2 for each time the action's word occurs in
the observation (the copying a language model does); ``softmax`` of those scores at
temperature 1, read through ``model_policy`` as a real model's action log-probs would be.

    python benchmarks/bench_credit_ground_truth.py            # ~5 min; JSON, plot, README table
    python benchmarks/bench_credit_ground_truth.py report     # plot and README table from the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.algorithms import advantage_estimator, available_advantages, compute_advantage
from agentgym.algorithms.ground_truth import (
    StateGraph,
    exact_values,
    model_policy,
    score_advantages,
    uniform_policy,
)
from agentgym.algorithms.judges import ProgressJudge
from agentgym.algorithms.oprl import Candidates, ImplicitPRM
from agentgym.algorithms.spa import ProgressEstimator, text_features

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = RESULTS / "credit_ground_truth.json"
README = HERE / "README.md"
BEGIN, END = "<!-- credit-ground-truth:begin -->", "<!-- credit-ground-truth:end -->"
GROUP_SIZES = (2, 4, 8, 16)
METRICS = ("spearman", "sign_agreement", "mae_ratio", "mae_raw_ratio")
PLOTTED = METRICS[:3]


# ---------------------------------------------------------------------------------------------
# Setups: envs and policies
# ---------------------------------------------------------------------------------------------


class BagOfWordsModel:
    """A tiny fixed model: seeded random word vectors (dimension 8), no training.

    ``logprobs(observation, actions)``: for each action, the dot product of its word vector
    with the mean vector of the observation's words, plus ``copy`` for each occurrence of the
    action's word in the observation; ``model_policy`` turns these into a softmax.
    """

    def __init__(self, seed: int = 0, dim: int = 8, copy: float = 2.0) -> None:
        self.seed, self.dim, self.copy = seed, dim, copy

    def vector(self, word: str) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(word.encode())])
        return rng.normal(size=self.dim)

    def logprobs(self, observation: str, actions: Sequence[str]) -> list[float]:
        words = re.findall(r"[a-z]+", observation.lower())
        context = np.mean([self.vector(w) for w in words], axis=0) if words else np.zeros(self.dim)
        return [float(self.vector(a) @ context) + self.copy * words.count(a) for a in actions]


@dataclass
class Setup:
    name: str
    env_label: str
    make_env: Callable[[], Any]
    family: str
    tasks: list[dict[str, Any]]
    """reset kwargs (seed / options) of each task"""
    policy_label: str
    policy: Callable


def setups(args: argparse.Namespace) -> list[Setup]:
    from agentgym.envs.corridor import CorridorEnv
    from agentgym.envs.sokoban import SokobanEnv

    model = BagOfWordsModel(seed=args.seed)
    envs = [
        (
            "corridor",
            "Corridor, 3 rooms x 3 doors, cap 10",
            lambda: CorridorEnv(length=3, num_doors=3, max_episode_steps=10),
            [{"options": {"task": i}} for i in range(args.tasks)],
        ),
        (
            "sokoban",
            "Sokoban 6x6, 1 box, cap 10",
            lambda: SokobanEnv(dim_room=(6, 6), num_boxes=1, max_episode_steps=10),
            [{"seed": i} for i in range(args.tasks)],
        ),
    ]
    policies = [
        ("uniform", "uniform over admissible actions", uniform_policy),
        ("model", "tiny fixed bag-of-words model", model_policy(model.logprobs)),
    ]
    return [
        Setup(f"{fam}/{pname}", elabel, make, fam, tasks, plabel, policy)
        for fam, elabel, make, tasks in envs
        for pname, plabel, policy in policies
    ]


# ---------------------------------------------------------------------------------------------
# Sampling rows and scoring estimators
# ---------------------------------------------------------------------------------------------


@dataclass
class _Step:
    info: dict[str, Any]
    observation: str = ""
    action: str = ""
    state_key: Any = None


@dataclass
class _Traj:
    steps: list[_Step]
    start_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rows:
    """Flat rows of a batch, one per (trajectory, step), and each row's exact advantage."""

    group_ids: list[int] = field(default_factory=list)
    traj_ids: list[int] = field(default_factory=list)
    step_ids: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    state_keys: list[Any] = field(default_factory=list)
    branch_ids: list[int] = field(default_factory=list)
    exact: list[float] = field(default_factory=list)
    trajs: list[_Traj] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    """the (state, action) text of each row, for the learned estimators' features"""
    candidates: list[tuple[list[str], list[float]]] = field(default_factory=list)
    """each row's state's (state, action) texts and the policy's probabilities"""

    def add(self, group: int, episode, graph, values, branch: int | None = None) -> None:
        traj = len(self.trajs)
        steps = []
        for t, (node, i) in enumerate(episode):
            n = graph.nodes[node]
            tr = n.transitions[i]
            self.group_ids.append(group)
            self.traj_ids.append(traj)
            self.step_ids.append(t)
            self.rewards.append(tr.reward)
            self.invalid.append(not tr.valid)
            self.state_keys.append(n.state.state_key)
            self.branch_ids.append(branch if (branch is not None and t == 0) else -1)
            self.exact.append(values.advantage(node, i))
            key = n.state.state_key
            self.texts.append(step_text(key, tr.action))
            self.candidates.append(
                ([step_text(key, c.action) for c in n.transitions], [c.prob for c in n.transitions])
            )
            steps.append(_Step(info=dict(tr.info)))
        start = graph.nodes[episode[0][0]].state.info
        self.trajs.append(_Traj(steps, start_info=dict(start)))


def step_text(state_key: Any, action: str) -> str:
    """The text the learned estimators featurise: the state's words, the action, and one token
    for the exact (state, action) pair (so that the hashed features can tell every pair apart)."""
    pair = zlib.crc32(repr((state_key, action)).encode())
    return f"{state_key} act {action} pair{pair}"


def flat_batch(graphs, values, k: int, episodes: int, rng) -> Rows:
    rows = Rows()
    for g in range(episodes // k):
        task = g % len(graphs)
        for _ in range(k):
            rows.add(g, graphs[task].sample(rng), graphs[task], values[task])
    return rows


def slate_batch(graphs, values, k: int, episodes: int, rng) -> Rows:
    rows = Rows()
    for g in range(episodes // k):
        task = g % len(graphs)
        graph = graphs[task]
        first = graph.sample(rng)
        b = int(rng.integers(len(first)))
        rows.add(g, first[b:], graph, values[task], branch=g)
        for _ in range(k - 1):
            rows.add(g, graph.sample(rng, start=first[b][0]), graph, values[task], branch=g)
    return rows


def run_estimator(
    name: str, rows: Rows, args: argparse.Namespace, judge, learned: dict | None = None
) -> tuple[Any, Any]:
    """(result, mask of scored rows) for one estimator on a batch; ``learned[name](rows)``
    gives the process rewards of an estimator that reads them."""
    est = advantage_estimator(name)
    extra: dict[str, Any] = {}
    if "contributions" in est.inputs:
        extra["contributions"] = np.concatenate(judge(rows.trajs))
    if "branch_ids" in est.inputs:
        extra["branch_ids"] = np.array(rows.branch_ids)
    if "segment_starts" in est.inputs:
        extra["segment_starts"] = rule_segment_starts(rows.trajs)
    if "process_rewards" in est.inputs:
        extra["process_rewards"] = learned[name](rows)
    options = {"gamma": args.gamma, "norm": args.norm}
    result = compute_advantage(
        name,
        group_ids=np.array(rows.group_ids),
        traj_ids=np.array(rows.traj_ids),
        step_ids=np.array(rows.step_ids),
        rewards=np.array(rows.rewards),
        invalid=np.array(rows.invalid),
        state_keys=rows.state_keys,
        **options,
        **extra,
    )
    mask = np.array(rows.branch_ids) >= 0 if "branch_ids" in est.inputs else None
    return result, mask


def rule_segment_starts(trajs: Sequence[_Traj]) -> np.ndarray:
    """bool (rows,): the rule planner's segment starts, trajectory by trajectory in row order:
    the first turn, and every turn after one that raised ``info["score"]``."""
    starts = []
    for traj in trajs:
        before = float(traj.start_info.get("score", 0.0))
        raised = False
        for t, step in enumerate(traj.steps):
            starts.append(t == 0 or raised)
            after = float(step.info.get("score", 0.0))
            raised, before = after > before, after
    return np.array(starts, dtype=bool)


FED = ("state_keys", "branch_ids", "contributions", "segment_starts")
"""the per-row inputs the benchmark builds from the graph (segment starts by the rule planner)"""
LEARNED = ("process_rewards",)
"""the per-row inputs it gets from a learned model (SPA's and OPRL's, see :func:`learn`)"""
FEATURE_DIM = 256


def features(rows: Rows) -> np.ndarray:
    return text_features(rows.texts, FEATURE_DIM)


def candidates(rows: Rows) -> Candidates:
    """Each row's candidate actions, padded, with the policy's log-probs as the reference."""
    width = max(len(texts) for texts, _ in rows.candidates)
    n = len(rows.candidates)
    feats = np.zeros((n, width, FEATURE_DIM), dtype=np.float32)
    ref = np.zeros((n, width))
    mask = np.zeros((n, width), dtype=bool)
    for i, (texts, probs) in enumerate(rows.candidates):
        feats[i, : len(texts)] = text_features(texts, FEATURE_DIM)
        ref[i, : len(probs)] = np.log(probs)
        mask[i, : len(texts)] = True
    return Candidates(feats, ref, mask)


def learn(train: Rows, args: argparse.Namespace, seed: int) -> dict[str, Callable[[Rows], Any]]:
    """SPA's progress estimator and OPRL's implicit PRM trained on ``train``: for each
    estimator name, a function of a batch giving its ``process_rewards``."""
    ids = {
        "group_ids": np.array(train.group_ids),
        "traj_ids": np.array(train.traj_ids),
        "rewards": np.array(train.rewards),
    }
    x = features(train)
    progress = ProgressEstimator(FEATURE_DIM, seed=seed)
    progress.update(x, **ids, steps=args.learn_steps)
    prm = ImplicitPRM(FEATURE_DIM, seed=seed)
    prm.update(x, candidates(train), **ids, steps=args.learn_steps)
    return {
        "spa": lambda rows: progress.predict(features(rows)),
        "oprl": lambda rows: prm.step_rewards(features(rows), candidates(rows)),
    }


def estimator_lines() -> list[str]:
    """Every registered estimator the benchmark can feed, plus GiGPO's step term alone and
    HiPER's planner term on planner turns."""
    names = [
        n for n in available_advantages() if set(advantage_estimator(n).inputs) <= {*FED, *LEARNED}
    ]
    if "gigpo" in names:
        names.insert(names.index("gigpo") + 1, "gigpo_step")
    if "hiper" in names:
        names.insert(names.index("hiper") + 1, "hiper_plan")
    return names


PARTS = {"gigpo_step": ("gigpo", "step_advantage"), "hiper_plan": ("hiper", "episode_advantage")}
"""lines that score one term of an estimator: line -> (estimator, result field)"""


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    lines = estimator_lines()
    for setup in setups(args):
        t0 = time.perf_counter()
        graphs = [StateGraph.build(setup.make_env(), setup.policy, **task) for task in setup.tasks]
        values = [exact_values(g, args.gamma) for g in graphs]
        judge = ProgressJudge("score")
        scores: dict[str, dict[str, dict[str, list[float]]]] = {
            line: {str(k): {m: [] for m in (*METRICS, "rows")} for k in GROUP_SIZES}
            for line in lines
        }
        for repeat in range(args.repeats):
            for k in GROUP_SIZES:
                rng = np.random.default_rng([args.seed, repeat, k])
                flat = flat_batch(graphs, values, k, args.episodes, rng)
                tree = slate_batch(graphs, values, k, args.episodes, rng)
                learned = {}
                if {"spa", "oprl"} & set(lines):
                    train_rng = np.random.default_rng([args.seed, repeat, k, 1])
                    train = flat_batch(graphs, values, k, args.episodes, train_rng)
                    learned = learn(train, args, seed=args.seed + repeat)
                for line in lines:
                    name, part = PARTS.get(line, (line, "advantages"))
                    rows = tree if "branch_ids" in advantage_estimator(name).inputs else flat
                    result, mask = run_estimator(name, rows, args, judge, learned)
                    est = getattr(result, part)
                    if line == "hiper_plan":  # planner turns only
                        mask = rule_segment_starts(rows.trajs)
                    exact = np.array(rows.exact)
                    if mask is not None:
                        est, exact = est[mask], exact[mask]
                    s = score_advantages(est, exact)
                    cell = scores[line][str(k)]
                    cell["spearman"].append(s["spearman"])
                    cell["sign_agreement"].append(s["sign_agreement"])
                    # NaN where every scored row has A = 0 (e.g. SLATE branching in dead ends)
                    base = s["mean_abs_exact"] if s["mean_abs_exact"] > 0 else math.nan
                    cell["mae_ratio"].append(s["mae_scaled"] / base)
                    cell["mae_raw_ratio"].append(s["mae_raw"] / base)
                    cell["rows"].append(s["rows"])
        summary = {
            line: {
                k: {
                    **{m: _median(v) for m, v in cell.items()},
                    "per_repeat": {m: cell[m] for m in METRICS},
                }
                for k, cell in by_k.items()
            }
            for line, by_k in scores.items()
        }
        results[setup.name] = {
            "env": setup.env_label,
            "policy": setup.policy_label,
            "tasks": setup.tasks,
            "states_per_task": [len(g) for g in graphs],
            "exact_v_at_reset": [float(v.v[0]) for v in values],
            "mean_abs_exact_advantage_at_reset": [
                float(np.abs(v.q[0] - v.v[0]) @ g.nodes[0].probs)
                for g, v in zip(graphs, values, strict=True)
            ],
            "seconds": time.perf_counter() - t0,
            "estimators": summary,
        }
        print(f"{setup.name}: {[len(g) for g in graphs]} states, {time.perf_counter() - t0:.1f}s")
    return results


def _median(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.median(vals)) if vals else math.nan


# ---------------------------------------------------------------------------------------------
# Report: plot and README table from the JSON
# ---------------------------------------------------------------------------------------------


LABELS = {
    "gigpo": "GiGPO",
    "gigpo_step": "GiGPO step term alone",
    "grpo": "GRPO",
    "rloo": "RLOO",
    "slate": "SLATE (branch rows)",
    "cw_grpo": "CW-GRPO (rule judge)",
    "slea_rl": "SLEA-RL",
    "hiper": "HiPER executor (rule segments)",
    "hiper_plan": "HiPER planner (planner turns)",
    "spa": "SPA-RL (learned progress)",
    "oprl": "OPRL (learned implicit PRM)",
}


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups_ = data["setups"]
    titles = {
        "spearman": "Spearman with exact A",
        "sign_agreement": "sign agreement",
        "mae_ratio": "MAE / mean |A|, magnitudes matched",
    }
    fig, axes = plt.subplots(len(setups_), 3, figsize=(13, 3.0 * len(setups_)), squeeze=False)
    for r, (name, setup) in enumerate(setups_.items()):
        for c, metric in enumerate(PLOTTED):
            ax = axes[r][c]
            for line, by_k in setup["estimators"].items():
                ys = [by_k[str(k)][metric] for k in GROUP_SIZES]
                ax.plot(GROUP_SIZES, ys, marker="o", label=LABELS.get(line, line))
            ax.set_xscale("log", base=2)
            ax.set_xticks(GROUP_SIZES, [str(k) for k in GROUP_SIZES])
            ax.set_title(f"{name}: {titles[metric]}", fontsize=9)
            ax.grid(alpha=0.3)
            if r == len(setups_) - 1:
                ax.set_xlabel(f"group size k ({data['config']['episodes']} episodes per batch)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(data: dict[str, Any]) -> str:
    cfg = data["config"]
    out = [
        BEGIN,
        "",
        f"Generated by `python benchmarks/bench_credit_ground_truth.py report` from "
        f"`results/credit_ground_truth.json` (gamma {cfg['gamma']}, `{cfg['norm']}`, "
        f"{cfg['episodes']} episodes per batch, medians of {cfg['repeats']} batches). Each cell "
        "is k = 2 / 4 / 8 / 16.",
        "",
    ]
    for name, setup in data["setups"].items():
        states = ", ".join(map(str, setup["states_per_task"]))
        out += [
            f"**{name}**: {setup['env']}, {setup['policy']}; states per task (state, time): "
            f"{states}",
            "",
            "| estimator | Spearman with exact A | sign agreement | MAE / mean abs A, "
            "magnitudes matched | MAE / mean abs A, as estimated | rows scored (k = 2) |",
            "|---|---|---|---|---|---:|",
        ]
        for line, by_k in setup["estimators"].items():
            cells = [" / ".join(f"{by_k[str(k)][m]:.2f}" for k in GROUP_SIZES) for m in METRICS]
            rows = int(by_k["2"]["rows"])
            out.append(f"| {LABELS.get(line, line)} | {' | '.join(cells)} | {rows} |")
        out.append("")
    out.append(END)
    return "\n".join(out)


def report(path: Path = OUT) -> None:
    """The plot beside the JSON; the README's table when the JSON is the published one (any
    other ``--out`` prints the table instead)."""
    data = json.loads(path.read_text())
    png = path.with_suffix(".png")
    plot(data, png)
    print(f"wrote {png}")
    text = README.read_text()
    if path.resolve() != OUT.resolve():
        print(table(data))
    elif BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + table(data) + rest.split(END, 1)[1]
        README.write_text(text)
        print(f"updated {README}")
    else:
        print(table(data))
        print(f"(no {BEGIN} marker in {README}: table printed only)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "report"])
    parser.add_argument("--episodes", type=int, default=512, help="episodes per batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=4, help="tasks (layouts, rooms) per env")
    parser.add_argument("--gamma", type=float, default=0.95)
    parser.add_argument("--norm", default="mean_norm", choices=["mean_norm", "mean_std_norm"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--learn-steps", type=int, default=200, help="Adam steps of SPA's and OPRL's models"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.command == "report":
        report(args.out)
        return
    t0, c0 = time.perf_counter(), time.process_time()
    results = measure(args)
    data = {
        "benchmark": "credit_ground_truth",
        "command": "python benchmarks/bench_credit_ground_truth.py "
        + " ".join(sys.argv[1:]).strip(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "group_sizes": list(GROUP_SIZES),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "wall_seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "setups": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    report(args.out)


if __name__ == "__main__":
    main()
