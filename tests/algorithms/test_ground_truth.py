"""Exact Q and V on hand-computable cases; the graph, sampling and the scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentgym.algorithms.ground_truth import (
    Node,
    PolicyState,
    StateGraph,
    Transition,
    exact_values,
    model_policy,
    score_advantages,
    softmax_policy,
    uniform_policy,
)
from agentgym.envs.corridor import CorridorEnv


def one_room(max_steps: int = 3) -> tuple[CorridorEnv, str, str]:
    """A 1-room corridor with 2 doors: (env, right door, wrong door) after reset(seed=0)."""
    env = CorridorEnv(length=1, num_doors=2, max_episode_steps=max_steps)
    env.reset(seed=0)
    right = env.doors[env.layout(env._layout_id)[0]]
    return env, right, next(d for d in env.doors if d != right)


def node_at(graph: StateGraph, dead_end: bool, t: int) -> Node:
    (node,) = [n for n in graph.nodes if n.state.state_key[3] == dead_end and n.state.time == t]
    return node


def q_of(values, node: Node, action: str) -> float:
    return float(values.q[node.index][[t.action for t in node.transitions].index(action)])


def test_one_room_uniform_by_hand():
    """Cap 3, gamma 0.9, uniform over 2 doors; the time step is part of the state.

    t=2 in the room: Q(right) = 10, Q(wrong) = 0 (the wrong door's step is the cap's last), V = 5.
    t=1 in the dead end: Q(back) = 0.9 * 5 = 4.5 = V.
    t=0 in the room: Q(right) = 10, Q(wrong) = 0.9 * 4.5 = 4.05, V = 7.025, A = +-2.975.
    """
    env, right, wrong = one_room()
    graph = StateGraph.build(env, uniform_policy, seed=0)
    assert (
        graph.timed and len(graph) == 3
    )  # room@0, dead end@1, room@2 (a dead end@3 is past the cap)
    values = exact_values(graph, gamma=0.9)
    room0, dead1, room2 = (
        node_at(graph, False, 0),
        node_at(graph, True, 1),
        node_at(graph, False, 2),
    )
    assert room0.index == graph.root
    assert q_of(values, room2, right) == pytest.approx(10.0)
    assert q_of(values, room2, wrong) == pytest.approx(0.0)
    assert values.v[room2.index] == pytest.approx(5.0)
    assert values.v[dead1.index] == pytest.approx(4.5)
    assert q_of(values, room0, wrong) == pytest.approx(4.05)
    assert values.v[room0.index] == pytest.approx(7.025)
    i_right = [t.action for t in room0.transitions].index(right)
    assert values.advantage(room0.index, i_right) == pytest.approx(2.975)
    assert values.advantage(room0.index, 1 - i_right) == pytest.approx(-2.975)
    assert values.advantage(dead1.index, 0) == 0.0  # one action: no advantage
    # The same room with fewer steps left is worth less: why time is part of the state.
    assert values.v[room2.index] < values.v[room0.index]


def test_softmax_policy_by_hand():
    """pi(right) = 0.8 from logits log 4 and 0, gamma 1, cap 3:
    V2 = 8; V1 = 8; Q0(wrong) = 8, V0 = 0.8 * 10 + 0.2 * 8 = 9.6."""
    env, right, _ = one_room()
    policy = softmax_policy(lambda s, a: math.log(4.0) if a == right else 0.0)
    values = exact_values(StateGraph.build(env, policy, seed=0), gamma=1.0)
    assert values.v[0] == pytest.approx(9.6)


def test_model_policy_reads_observation_and_caches():
    env, right, _ = one_room()
    calls = []

    def logprobs(obs: str, actions):
        calls.append(obs)
        return [0.0 if f"the {a} door" in obs else -math.inf for a in actions]

    graph = StateGraph.build(env, model_policy(logprobs), seed=0)
    # the model reads the hint: all its mass on the right door, so the dead end is never reached
    assert len(graph) == 1 and [t.action for t in graph.nodes[0].transitions] == [right]
    assert len(calls) == 1  # read once per distinct text
    assert exact_values(graph, 0.9).v[0] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="one value < inf per action"):
        StateGraph.build(env, model_policy(lambda o, a: [math.nan] * len(a)), seed=0)


def test_untimed_graph_solves_the_linear_system():
    """Without a cap the room and its dead end form a cycle: V_room = 0.5 * 10 + 0.5 * g V_dead,
    V_dead = g V_room, so V_room = 5 / (1 - 0.5 g^2)."""
    g = 0.9
    room = PolicyState("room", 0, "room", ("right", "wrong"))
    dead = PolicyState("dead", 0, "dead", ("back",))
    nodes = [
        Node(0, room, [Transition("right", 0.5, 10.0, True, False, True, -1),
                       Transition("wrong", 0.5, 0.0, False, False, True, 1)]),
        Node(1, dead, [Transition("back", 1.0, 0.0, False, False, True, 0)]),
    ]  # fmt: skip
    values = exact_values(StateGraph(nodes, timed=False, start_info={}), gamma=g)
    assert values.v[0] == pytest.approx(5 / (1 - 0.5 * g * g))
    assert values.v[1] == pytest.approx(g * values.v[0])
    with pytest.raises(ValueError, match="loop forever"):
        loop = [Node(0, dead, [Transition("back", 1.0, 0.0, False, False, True, 0)])]
        exact_values(StateGraph(loop, timed=False, start_info={}), gamma=1.0)


def test_values_match_monte_carlo_on_a_corridor():
    """Exact V at the root equals the mean discounted return of sampled episodes."""
    env = CorridorEnv(length=2, num_doors=3)
    graph = StateGraph.build(env, uniform_policy, seed=3)
    values = exact_values(graph, gamma=0.95)
    rng = np.random.default_rng(0)
    returns = []
    for _ in range(4000):
        ep = graph.sample(rng)
        rewards = [graph.nodes[n].transitions[i].reward for n, i in ep]
        returns.append(sum(r * 0.95**k for k, r in enumerate(rewards)))
        assert graph.nodes[ep[-1][0]].transitions[ep[-1][1]].done
    assert np.mean(returns) == pytest.approx(values.v[0], abs=4 * np.std(returns) / np.sqrt(4000))


def test_policy_must_be_a_distribution():
    env, _, _ = one_room()
    with pytest.raises(ValueError, match="summing to 1"):
        StateGraph.build(env, lambda s: {a: 0.7 for a in s.admissible_actions}, seed=0)
    with pytest.raises(ValueError, match="too large"):
        StateGraph.build(CorridorEnv(length=3), uniform_policy, seed=0, max_nodes=3)


def test_scores():
    exact = np.array([2.0, -1.0, 0.0, 0.5])
    s = score_advantages(2 * exact, exact)
    assert s["spearman"] == pytest.approx(1.0) and s["sign_agreement"] == 1.0
    assert s["scale"] == pytest.approx(0.5) and s["mae_scaled"] == pytest.approx(0.0)
    assert s["mae_raw"] == pytest.approx(np.mean(np.abs(exact)))
    # the zero-advantage row has no sign; an estimate of 0 where A != 0 disagrees
    s = score_advantages(np.array([1.0, 1.0, 0.0, 2.0]), exact)
    assert s["sign_agreement"] == pytest.approx(2 / 3)
    # ranks (2.5, 2.5, 1, 4) and (4, 1, 2, 3), centred: (0, 0, -1.5, 1.5), (1.5, -1.5, -0.5, 0.5)
    assert s["spearman"] == pytest.approx(1.5 / math.sqrt(4.5 * 5.0))
    assert score_advantages(np.array([0.0, 1.0, 0.0, 0.0]), exact)["sign_agreement"] == 0.0
    # The scale matches mean magnitudes: mean |A| = 0.875, mean |est| = 1.0.
    assert s["scale"] == pytest.approx(0.875)
    # |0.875 - 2| + |0.875 + 1| + 0 + |1.75 - 0.5| = 4.25 over 4 rows
    assert s["mae_scaled"] == pytest.approx(1.0625)
    zero = score_advantages(np.zeros(4), exact)
    assert zero["scale"] == 0.0 and zero["mae_scaled"] == pytest.approx(zero["mean_abs_exact"])
    assert math.isnan(score_advantages(np.ones(4), exact)["spearman"])


def test_benchmark_scores_every_estimator(tmp_path):
    """The ground-truth benchmark runs as a user would (a tiny budget) and scores every
    registered estimator at every group size, with scores in their ranges."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from agentgym.algorithms import available_advantages

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gt.json"
    # 20 Adam steps for SPA's and OPRL's models (the default 200 is most of the run's time)
    args = ["--episodes", "32", "--repeats", "1", "--tasks", "1", "--learn-steps", "20",
            "--out", str(out)]  # fmt: skip
    script = root / "benchmarks" / "bench_credit_ground_truth.py"
    # this checkout's package, whichever one is installed
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run([sys.executable, str(script), *args], check=True, cwd=root, env=env)
    data = json.loads(out.read_text())
    assert (tmp_path / "gt.png").is_file()
    assert set(data["setups"]) == {"corridor/uniform", "corridor/model", "sokoban/uniform",
                                   "sokoban/model"}  # fmt: skip
    for setup in data["setups"].values():
        assert set(available_advantages()) <= set(setup["estimators"])
        for by_k in setup["estimators"].values():
            assert set(by_k) == {"2", "4", "8", "16"}
            for cell in by_k.values():
                assert cell["rows"] > 0
                assert math.isnan(cell["spearman"]) or -1.0 <= cell["spearman"] <= 1.0
                assert math.isnan(cell["sign_agreement"]) or 0.0 <= cell["sign_agreement"] <= 1.0
