"""A family owns everything about itself: its folder declares its prompt, rule judge, trainer
defaults and data variable (``FAMILY = FamilySpec(...)``), and shared code looks them up by name.

The toy family below is written as a user would write a fifth family: one folder (created in a
temp dir, imported from there) plus one registration line, and nothing else edited; it then gets
its prompt from ``make_llm_env``, its judge from ``rule_judge`` and its trainer preset from
``Config.for_env``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym import family as families
from agentgym import testing
from agentgym.algorithms.judges import (
    CW_GRPO_TEMPLATES,
    DEFAULT_JUDGE_TEMPLATE,
    RULE_JUDGES,
    Judge,
    ProgressJudge,
    build_judge,
    llm_judge_templates,
    rule_judge,
)
from agentgym.envs import ENTRIES, EnvEntry
from agentgym.family import FamilySpec, JudgeSpec, family_spec
from agentgym.testing import FamilyContractError, check_family
from agentgym.wrappers.llm import FAMILY_TEMPLATES, PROMPT_TEMPLATES, make_llm_env

ROOT = Path(__file__).resolve().parents[1]
TOY_ID = "ToyGym/Counter-v0"

# The whole family: an env that counts to a target, and what shared code asks of it.
TOY_PACKAGE = '''
"""Counter: say "inc" until the count reaches the target."""

from agentgym.core import TextEnv
from agentgym.family import FamilySpec, JudgeSpec, PromptTemplate


class CounterEnv(TextEnv):
    family = "counter"
    reset_option_keys = frozenset({"task", "split"})  # what _reset_task reads
    SPLITS = {"train": (5, 4, 3), "test": (6, 7)}  # targets; a seed draws one of its split
    TASKS = {f"count-to-{t}": t for targets in SPLITS.values() for t in targets}

    def __init__(self, max_episode_steps: int | None = None, **kw):
        super().__init__(max_episode_steps=max_episode_steps, **kw)
        self.target, self.count = 3, 0

    def _info(self, valid: bool = True) -> dict:
        return {
            "state_key": (self.target, self.count), "task_id": f"count-to-{self.target}",
            "admissible_actions": ["inc", "wait"], "action_valid": valid,
            "won": self.count >= self.target, "score": self.count / self.target,
        }

    def _reset_task(self, options):
        if "task" in options:  # a KeyError or ValueError here becomes a ResetOptionError
            self.target = self.TASKS[options["task"]]
        else:
            targets = self.SPLITS[options.get("split", "train")]
            self.target = targets[int(self.np_random.integers(len(targets)))]
        self.count = 0
        return f"count is 0 of {self.target}", self._info()

    def _step_action(self, action):
        if action not in ("inc", "wait"):
            return "say inc or wait", 0.0, False, self._info(valid=False)
        self.count += action == "inc"
        won = self.count >= self.target
        return f"count is {self.count} of {self.target}", float(won), won, self._info()

    def state_key(self):
        return (self.target, self.count)

    # snapshot(): what a step changes, and what two envs must share to swap it
    def _snapshot_identity(self):
        return "counter-v0"

    def _snapshot_state(self):
        return (self.target, self.count)

    def _restore_state(self, state):
        self.target, self.count = state


class HalfJudgeFactory:
    """A family's own judge, named by a "module:callable" string."""

    def __new__(cls, value: float = 0.5):
        from agentgym.algorithms.judges import Judge
        import numpy as np

        class Half(Judge):
            def score(self, trajectories):
                return [np.full(len(t.steps), value) for t in trajectories]

        return Half()


FAMILY = FamilySpec(
    prompt=PromptTemplate(
        first="COUNTER RULES. {observation}\\n{admissible_line}{instruction}",
        later="COUNTER RULES, step {current_step}. {observation}\\n{admissible_line}{instruction}",
        default_fmt="plain",
    ),
    rule_judge=JudgeSpec("progress", {"key": "score"}),
    trainer_defaults={"lr": 0.25, "train_split": "train", "history_length": 0},
    data_env_var="COUNTER_DATA",
    llm_judge=("Did {action} after {observation} count up? Answer yes or no.\\nAnswer:",),
)
'''


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The counter family in a temp folder, registered with one line; unregistered after."""
    (tmp_path / "counterfam").mkdir()
    (tmp_path / "counterfam" / "__init__.py").write_text(textwrap.dedent(TOY_PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = list(ENTRIES)
    try:
        # the registration line
        agentgym.register(EnvEntry(TOY_ID, "counterfam:CounterEnv", "counter", max_episode_steps=7))
        yield importlib.import_module("counterfam")
    finally:
        ENTRIES[:] = entries
        gym.registry.pop(TOY_ID, None)
        families._MODULES.pop("counter", None)
        families._SPECS.pop("counter", None)
        sys.modules.pop("counterfam", None)


@dataclasses.dataclass
class _Step:
    observation: str
    action: str
    state_key: object
    info: dict


@dataclasses.dataclass
class _Trajectory:
    steps: list[_Step]
    start_info: dict


def _play(env: gym.Env, actions: list[str]) -> _Trajectory:
    obs, info = env.reset(seed=0)
    start, steps = info, []
    for action in actions:
        key = info["state_key"]
        nxt, _, _, _, info = env.step(action)
        steps.append(_Step(obs, action, key, info))
        obs = nxt
    return _Trajectory(steps, start)


def test_a_toy_family_is_one_folder_and_one_line(toy_family):
    # the prompt: make_llm_env renders the family's own template, with its own format
    env = make_llm_env(TOY_ID)
    prompt, info = env.reset(seed=0)
    assert prompt.startswith("COUNTER RULES. count is 0 of 3")
    assert "'inc'" in prompt and "Reply with the action text only." in prompt
    prompt, _, _, _, info = env.step("inc")  # plain format: the text is the action
    assert info["action_valid"] and "count is 1 of 3" in prompt
    assert PROMPT_TEMPLATES["counter"] is toy_family.FAMILY.prompt
    assert FAMILY_TEMPLATES["counter"] == "counter"

    # the judge: rule_judge builds what the family declared, and it scores the toy's rounds
    judge = rule_judge("counter")
    assert isinstance(judge, ProgressJudge) and judge.keys == ("score",)
    traj = _play(gym.make(TOY_ID), ["inc", "wait", "bogus", "inc", "inc"])
    np.testing.assert_array_equal(judge([traj])[0], [1.0, 0.0, 0.0, 1.0, 1.0])
    assert "counter" in RULE_JUDGES

    # the trainer preset: the family's defaults, then the caller's overrides
    from trainers.gigpo.config import PRESETS, Config

    config = Config.for_env(TOY_ID, history_length=1)
    assert (config.lr, config.train_split, config.history_length) == (0.25, "train", 1)
    assert PRESETS[TOY_ID] == {
        "lr": 0.25,
        "train_split": "train",
        "history_length": 0,
        "max_episode_steps": 7,
    }
    assert gym.make(TOY_ID).spec.max_episode_steps == 7  # the one cap, the registry's

    # the data variable
    assert family_spec("counter").data_env_var == "COUNTER_DATA"

    # the LLM judge's prompts, and the scored policy (the toy lists its actions)
    assert llm_judge_templates("counter") == toy_family.FAMILY.llm_judge
    Config.for_env(TOY_ID, policy="scored").check_policy()  # it lists its actions


def test_what_a_family_declares_steers_the_trainer(toy_family, monkeypatch):
    # the trainer reads the spec, never a family's name: a free-text toy is refused by the
    # scored policy, and an LLM judge prompts it as its spec says
    from trainers.gigpo.config import Config, ConfigError

    spec = dataclasses.replace(toy_family.FAMILY, lists_actions=False, llm_judge="search_rounds")
    monkeypatch.setattr(toy_family, "FAMILY", spec)
    families._SPECS.pop("counter", None)
    with pytest.raises(ConfigError, match="'counter' family .ToyGym/Counter-v0. lists none"):
        Config.for_env(TOY_ID, policy="scored").check_policy()
    assert llm_judge_templates("counter") == CW_GRPO_TEMPLATES
    monkeypatch.setattr(toy_family, "FAMILY", dataclasses.replace(spec, llm_judge="nope"))
    families._SPECS.pop("counter", None)
    with pytest.raises(ValueError, match="unknown prompt set 'nope'"):
        llm_judge_templates("counter")
    with pytest.raises(TypeError, match="llm_judge must be"):
        FamilySpec(llm_judge=())


def test_free_text_families_list_no_actions():
    # FAMILY.lists_actions says what the envs do: listed actions on reset, or None throughout
    seen = set()
    for e in ENTRIES:
        if not e.available() or e.real_data or e.family in seen:
            continue
        seen.add(e.family)  # one id per family
        _, info = gym.make(e.id).reset(seed=0)
        listed = family_spec(e.family).lists_actions
        assert (info["admissible_actions"] is not None) == listed, e.id
    assert llm_judge_templates("searchqa") == CW_GRPO_TEMPLATES
    assert llm_judge_templates("webshop") == (DEFAULT_JUDGE_TEMPLATE,)


def test_the_toy_family_passes_the_family_contract(toy_family):
    check_family(TOY_ID)  # the one line a new family's test needs


def test_a_plain_format_family_passes_the_prompt_checks(toy_family):
    # "no tags at all" is a valid plain action (the env refuses it, but it parses): the check
    # sends text that cannot parse in the family's own format
    assert make_llm_env(TOY_ID).fmt == "plain"
    testing.check_prompt(TOY_ID)
    assert testing.unparseable_text("plain").strip() == ""


def test_the_family_contract_names_the_rule_a_family_breaks(toy_family, monkeypatch):
    env_class = toy_family.CounterEnv
    reset_task = env_class._reset_task
    # a family that ignores the task it is given
    monkeypatch.setattr(env_class, "_reset_task", lambda self, o: reset_task(self, {}))
    with pytest.raises(FamilyContractError, match="did not replay the task|were accepted"):
        testing.check_reset_options(TOY_ID, foreign=False)
    monkeypatch.setattr(env_class, "_reset_task", reset_task)
    # a family whose unusable action still changes the state
    step = env_class._step_action

    def leaky_step(self, action):
        obs, reward, terminated, info = step(self, action)
        if not info["action_valid"]:
            self.count += 1
            info = self._info(valid=False)
        return obs, reward, terminated, info

    monkeypatch.setattr(env_class, "_step_action", leaky_step)
    with pytest.raises(FamilyContractError, match="changed the state"):
        testing.check_invalid_actions(TOY_ID)


def test_unregistered_families_fall_back_to_generic_defaults():
    # (also: the toy family, registered by the tests above, is gone)
    assert "counter" not in RULE_JUDGES and "counter" not in PROMPT_TEMPLATES
    assert family_spec("counter") is None
    with pytest.raises(ValueError, match="no rule judge for the 'counter' family"):
        rule_judge("counter")


def test_a_family_judge_named_by_module_and_callable(toy_family):
    judge = build_judge(JudgeSpec("counterfam:HalfJudgeFactory", {"value": 0.25}))
    traj = _play(gym.make(TOY_ID), ["inc", "inc"])
    np.testing.assert_array_equal(judge([traj])[0], [0.25, 0.25])
    with pytest.raises(ValueError, match="unknown judge kind 'nope'"):
        build_judge(JudgeSpec("nope"))
    with pytest.raises(TypeError, match="not a Judge"):
        build_judge(JudgeSpec("builtins:dict"))


def test_every_registered_family_declares_its_spec():
    for e in ENTRIES:
        spec = family_spec(e.family)
        assert isinstance(spec, FamilySpec), e.family
        module, cls = e.entry_point.split(":")
        assert getattr(importlib.import_module(module), cls).family == e.family, e.id
        if e.real_data:
            assert spec.data_env_var, f"{e.id} plays real data: its family must name the variable"


def test_the_old_tables_still_answer():
    assert {"generic", "alfworld", "sokoban", "webshop", "search", "searchqa"} <= set(
        PROMPT_TEMPLATES
    )
    assert PROMPT_TEMPLATES["search"] is PROMPT_TEMPLATES["searchqa"]
    assert PROMPT_TEMPLATES["search"].default_fmt == "search_answer"
    assert FAMILY_TEMPLATES["sokoban"] == "sokoban" and "corridor" not in FAMILY_TEMPLATES
    assert set(RULE_JUDGES) == {"corridor", "sokoban", "alfworld", "searchqa"}
    assert all(isinstance(make(), Judge) for make in RULE_JUDGES.values())
    alfworld = rule_judge("alfworld")
    assert alfworld.keys == ("goal_progress", "goal_facts_met") and alfworld.since == "previous"
    with pytest.raises(ValueError, match="use an LLM judge"):
        rule_judge("webshop")
    # what callers add is kept, and removable
    PROMPT_TEMPLATES["mine"] = PROMPT_TEMPLATES["generic"]
    try:
        assert "mine" in PROMPT_TEMPLATES
    finally:
        del PROMPT_TEMPLATES["mine"]
    assert "mine" not in PROMPT_TEMPLATES


def test_a_family_without_a_spec_is_said_once(tmp_path, monkeypatch):
    (tmp_path / "barefam.py").write_text("class Bare:\n    family = 'bare'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(families._MODULES, "bare", "barefam")
    try:
        with pytest.warns(UserWarning, match="'bare' family's package .* declares no FAMILY"):
            assert family_spec("bare") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert family_spec("bare") is None and "bare" not in PROMPT_TEMPLATES
    finally:
        families._SPECS.pop("bare", None)
        sys.modules.pop("barefam", None)


def test_trainer_presets_take_the_step_cap_from_the_registry():
    from trainers.gigpo.config import PRESETS, Config

    with pytest.raises(ValueError, match="step cap is the registry entry's"):
        FamilySpec(trainer_defaults={"max_episode_steps": 3})
    for e in ENTRIES:
        assert "max_episode_steps" not in family_spec(e.family).trainer_defaults
        assert (
            PRESETS[e.id].get("max_episode_steps")
            == e.max_episode_steps
            == gym.spec(e.id).max_episode_steps
        )
        assert Config.for_env(e.id).max_episode_steps == e.max_episode_steps
    # a preset is a fresh copy: one config's env_kwargs never leak into the next
    Config.for_env("AgentGym/Corridor-v0").env_kwargs["length"] = 9
    assert Config.for_env("AgentGym/Corridor-v0").env_kwargs["length"] == 3
    assert "AgentGym/Sokoban-8x8-2box-v0" in PRESETS and "Nope/Nope-v0" not in PRESETS
    assert Config.for_env("Nope/Nope-v0").max_episode_steps is None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize(
    "folder, forbidden",
    [
        ("agentgym/envs", ("agentgym.wrappers", "agentgym.algorithms", "agentgym.integrations")),
        ("agentgym/algorithms", ("agentgym.envs",)),
    ],
)
def test_family_specs_keep_the_dependency_rules(folder, forbidden):
    # envs declare prompts and judges as plain data (agentgym.family), so neither side imports
    # the other; agentgym.family and agentgym.answers import no agentgym package at all
    files = list((ROOT / folder).rglob("*.py")) + [
        ROOT / "agentgym" / "family.py",
        ROOT / "agentgym" / "answers.py",
    ]
    bad = [
        f"{p.relative_to(ROOT)} imports {m}"
        for p in files
        for m in _imports(p)
        if m.startswith(forbidden)
        or (
            p.name in ("family.py", "answers.py")
            and p.parent.name == "agentgym"
            and m.startswith("agentgym")
        )
    ]
    assert not bad
