"""LLM-facing wrappers: action parsing (verl-agent rules), prompt rendering, the wrapper stack."""

from __future__ import annotations

import pickle
import re
import time
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.core import TEXT_CHARSET, InvalidAction, TextEnv, describe_action
from agentgym.wrappers.llm import (
    FORMATS,
    MAX_HISTORY_ACTION_CHARS,
    PROMPT_TEMPLATES,
    ParseActions,
    PromptRenderer,
    PromptTemplate,
    make_llm_env,
    parse_action,
    render_prompt,
)


class CounterEnv(TextEnv):
    """A real (tiny) TextEnv: a counter moved by ``inc`` / ``dec``; reaching ``target`` wins."""

    family = "counter"

    def __init__(self, target: int = 100, max_episode_steps: int | None = 50):
        super().__init__(max_episode_steps=max_episode_steps)
        self.target = target
        self.n = 0

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.n = int(options.get("task", 0))
        return self._text(), self._info(True)

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action not in ("inc", "dec"):
            return f"Unknown action {describe_action(action)}.", 0.0, False, self._info(False)
        self.n += 1 if action == "inc" else -1
        won = self.n == self.target
        return self._text(), float(won), won, self._info(True)

    def state_key(self) -> int:
        return self.n

    def _text(self) -> str:
        return f"The counter shows {self.n}."

    def _info(self, valid: bool) -> dict[str, Any]:
        won = self.n == self.target
        return {
            "state_key": self.n,
            "task_id": f"counter-{self.target}",
            "admissible_actions": ["inc", "dec"],
            "action_valid": valid,
            "won": won,
            "score": float(won),
            "goal": f"make the counter show {self.target}",
        }


def ta(action: str, think: str = "ok") -> str:
    return f"<think>{think}</think>\n<action>{action}</action>"


# ---------------------------------------------------------------------------------------------
# parse_action: fixed cases
# ---------------------------------------------------------------------------------------------

THINK_ACTION_CASES = [
    # (text, expected action or None when invalid, expected think, error fragment)
    ("<think>open it</think><action>open drawer 1</action>", "open drawer 1", "open it", None),
    ("  <think> a </think>\n\n<action>\n  Go  To\tDesk 1 \n</action>  ", "go to desk 1", "a", None),
    ("<THINK>x</THINK><Action>UP</Action>", "up", "x", None),
    ("<think>x</think><action>up</action> trailing words", "up", "x", None),
    ("<think>x</think><think>y</think><action>up</action>", "up", "x", None),
    ("I will go up.", None, None, "no <action>"),
    ("<think>x</think>up", None, "x", "no <action>"),
    ("<action>up</action>", None, None, "<think>"),
    ("<think>x<action>up</action>", None, None, "<think>"),
    ("<action>up</action><think>x</think>", None, "x", "before <action>"),
    ("<think>x</think><action>up</action><action>down</action>", None, "x", "exactly one"),
    ("<think>x</think><action>up<action>down</action>", None, "x", "exactly one"),
    ("<think>x</think><action>up", None, "x", "never closed"),
    ("<think>x</think>up</action>", None, "x", "no opening"),
    ("<think>x</think></action>up<action>", None, "x", "comes before"),
    ("<think>x</think><action>   </action>", None, "x", "empty"),
    ("<think>x</think><action><think>y</think>up</action>", None, "x", "inside"),
    ("<think>\u5411\u4e0a</think><action>up</action>", None, "\u5411\u4e0a", "CJK"),
    ("<think>x</think><action>up</action>", "up", "x", None),
]


@pytest.mark.parametrize("text,action,think,error", THINK_ACTION_CASES)
def test_think_action_cases(text, action, think, error):
    p = parse_action(text)
    assert p.valid is (error is None)
    if error is None:
        assert p.action == action and p.error is None
    else:
        assert error in p.error
    assert p.think == think


def test_think_action_options():
    # Chat templates that open <think> in the prompt: the output holds only </think>.
    text = "the box is left of me</think><action>left</action>"
    assert not parse_action(text).valid
    p = parse_action(text, implicit_think_open=True)
    assert p.valid and p.action == "left" and p.think == "the box is left of me"
    assert parse_action("<action>up</action>", require_think=False).action == "up"
    assert parse_action(ta("Click[B07]"), lowercase=False).action == "Click[B07]"
    assert parse_action(ta("up", think="\u5411\u4e0a"), reject_cjk=False).valid
    # Japanese kana and Korean are not the ideographs verl-agent rejects.
    assert parse_action(ta("up", think="\u3072\u3089\u304c\u306a")).valid


def test_admissible_matching():
    pool = ["go to desk 1", "Open Drawer 1", "look"]
    p = parse_action(ta("OPEN   drawer 1"), admissible=pool)
    assert p.valid and p.action == "Open Drawer 1"  # the env's own spelling
    p = parse_action(ta("fly away"), admissible=pool)
    assert not p.valid and "admissible" in p.error and p.action == "fly away"
    assert not parse_action(ta("look"), admissible=[]).valid


SEARCH_CASES = [
    ("<think>need facts</think><search> capital of  France </search>", "search[capital of France]"),
    ("<answer>Paris</answer>", "answer[Paris]"),
    ("<think>x</think>\n<ANSWER> Jean [II] </ANSWER>", "answer[Jean [II]]"),
    ("<search>a</search><answer>b</answer>", None),
    ("<search>a</search> then <search>b</search>", None),
    ("<answer>a</answer><answer>b</answer>", None),
    ("<search>unclosed", None),
    ("<search> </search>", None),
    ("The answer is Paris.", None),
    ("<think>x</think><action>up</action>", None),
]


@pytest.mark.parametrize("text,action", SEARCH_CASES)
def test_search_answer_cases(text, action):
    p = parse_action(text, "search_answer")
    assert p.valid is (action is not None)
    if action is not None:
        assert p.action == action
    else:
        assert p.error


def test_search_answer_can_require_think():
    assert not parse_action("<answer>x</answer>", "search_answer", require_think=True).valid
    assert parse_action("<think>y</think><answer>x</answer>", "search_answer", require_think=True)


def test_plain_and_non_text():
    assert parse_action("  Go  North \n", "plain").action == "Go North"
    assert not parse_action(" \n\t", "plain").valid
    for fmt in FORMATS:
        for bad in (None, 3, 2.5, ["up"], {"a": 1}, object()):
            p = parse_action(bad, fmt)
            assert not p.valid and p.action is None and p.error
    assert parse_action(ta("up").encode(), "think_action").action == "up"
    assert parse_action(b"\xff\xfe<think>x</think><action>up</action>").action == "up"
    with pytest.raises(ValueError, match="unknown action format"):
        parse_action("x", "json")


@pytest.mark.parametrize(
    "text",
    [
        "<action>" * 12_500,  # 100 KB of openers: a lazy .*? regex would scan quadratically
        "<think>" * 10_000 + "</action>" * 2_000,
        "<" + " " * 100_000 + "action>",
        "<think>" + "x" * 100_000 + "</think><action>" + "y" * 1_000 + "</action>",
        "<search>" * 6_000 + "</answer>" * 3_000,
    ],
)
def test_parse_is_linear_on_100kb(text):
    for fmt in FORMATS:
        start = time.perf_counter()
        p = parse_action(text, fmt)
        assert time.perf_counter() - start < 0.5
        assert p.valid is (p.error is None)


# ---------------------------------------------------------------------------------------------
# parse_action: fuzzing
# ---------------------------------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<action>",
        "</action>",
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        "<THINK>",
        "</Action>",
        "<action",
        "action>",
        "</",
        "<",
        ">",
        "up",
        "go to desk 1",
        " ",
        "\n",
        "[",
        "]",
        "\u5411",
        "\x00",
        "\U0001f600",
    ]
)
TAG_SOUP = st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=30).map("".join)
TAG_RE = re.compile(r"</?(think|action|search|answer)>", re.IGNORECASE)


def check_consistent(p, fmt: str, text: str) -> None:
    assert isinstance(p.valid, bool)
    assert p.valid is (p.error is None)
    assert p.error is None or (isinstance(p.error, str) and p.error)
    assert p.think is None or isinstance(p.think, str)
    if p.valid:
        assert isinstance(p.action, str) and p.action
        assert p.action == " ".join(p.action.split())  # stripped, whitespace collapsed
    if fmt == "think_action" and p.valid:
        low = text.lower()
        assert low.count("<action>") == 1 and low.count("</action>") == 1
        assert p.action == p.action.lower() and not TAG_RE.search(p.action)
        assert p.action in " ".join(low.split())
        # Re-emitting what was parsed parses to the same action.
        assert parse_action(ta(p.action, p.think or "t")).action == p.action
    if fmt == "search_answer" and p.valid:
        assert re.fullmatch(r"(search|answer)\[.+\]", p.action, re.DOTALL)
        low = text.lower()
        assert (low.count("<search>") == 0) != (low.count("<answer>") == 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=200), TAG_SOUP), fmt=st.sampled_from(FORMATS))
def test_parse_never_raises_and_is_consistent(text, fmt):
    check_consistent(parse_action(text, fmt), fmt, text)


@settings(max_examples=150, deadline=None)
@given(
    think=st.text(max_size=40).filter(lambda s: not TAG_RE.search(s) and "<" not in s),
    action=st.text(st.characters(codec="ascii"), min_size=1, max_size=40).filter(
        lambda s: s.strip() and "<" not in s
    ),
    pad=st.sampled_from(["", " ", "\n", "\n\n  "]),
)
def test_well_formed_think_action_always_parses(think, action, pad):
    p = parse_action(f"{pad}<think>{think}</think>{pad}<action>{action}</action>{pad}")
    if re.search("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]", think):
        assert not p.valid and "CJK" in p.error
    else:
        assert p.valid and p.action == " ".join(action.split()).lower()
        assert p.think == think.strip()


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(max_size=100), st.none(), st.integers(), TAG_SOUP))
def test_parse_any_python_object(data):
    for fmt in FORMATS:
        p = parse_action(data, fmt)
        assert p.valid is (p.error is None)


# ---------------------------------------------------------------------------------------------
# ParseActions
# ---------------------------------------------------------------------------------------------


def test_parse_actions_steps_the_parsed_action():
    env = ParseActions(CounterEnv())
    obs, info = env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(ta("INC", think="go up"))
    assert info["action_valid"] and info["state_key"] == 1
    assert info["parsed_action"] == "inc" and info["think"] == "go up"
    assert "parse_error" not in info and obs == "The counter shows 1."


@pytest.mark.parametrize(
    "text",
    ["inc", "<action>inc</action>", ta("inc") + "<action>dec</action>", None, 7, "", "\x00" * 10],
)
def test_malformed_text_is_an_invalid_step_that_counts(text):
    env = ParseActions(CounterEnv())
    env.reset(seed=0)
    env.step(ta("inc"))
    obs, reward, term, trunc, info = env.step(text)
    assert info["action_valid"] is False
    assert info["parsed_action"] is None and info["parse_error"]
    assert info["state_key"] == 1  # the world did not move
    assert env.unwrapped.elapsed_steps == 2  # but the agent lost a turn
    assert reward == 0.0 and not term and not trunc
    assert "Invalid response" in obs and "<action>" in obs  # it tells the model what to do


def test_invalid_steps_run_into_the_step_cap():
    env = ParseActions(CounterEnv(max_episode_steps=3))
    env.reset(seed=0)
    flags = [env.step("no tags here")[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_check_admissible_uses_the_envs_list():
    env = ParseActions(CounterEnv(), check_admissible=True)
    env.reset(seed=0)
    *_, info = env.step(ta("jump"))
    assert not info["action_valid"] and "admissible" in info["parse_error"]
    *_, info = env.step(ta("dec"))
    assert info["action_valid"] and info["state_key"] == -1


def test_invalid_action_passes_through():
    env = ParseActions(CounterEnv())
    env.reset(seed=0)
    obs, *_, info = env.step(InvalidAction("model timed out"))
    assert obs == "model timed out" and not info["action_valid"]
    assert info["parse_error"] == "model timed out"


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(TAG_SOUP, st.text(max_size=50)), min_size=1, max_size=6))
def test_parse_actions_never_raises(texts):
    env = make_llm_env(CounterEnv(max_episode_steps=4))
    prompt, info = env.reset(seed=0)
    done = False
    for steps, text in enumerate(texts, start=1):
        before = info["state_key"]
        prompt, reward, term, trunc, info = env.step(text)
        assert isinstance(prompt, str) and isinstance(info["action_valid"], bool)
        if not info["action_valid"]:
            assert info["state_key"] == before  # invalid never moves the world
        if not done:
            assert env.unwrapped.elapsed_steps == steps  # every response costs a step
        done = done or term or trunc


# Anything a model can emit: every code point (control characters, lone surrogates, emoji),
# tag soup, and very long strings, alone or wrapped in a well-formed action block.
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
RAW_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=80),
    TAG_SOUP,
    st.tuples(
        st.sampled_from(["x", "\x00", "\ud800", "\u00e9", "\U0001f642"]), st.integers(1, 3)
    ).map(lambda t: t[0] * (t[1] * 400_000)),
)
MODEL_TEXT = st.one_of(
    RAW_TEXT,
    RAW_TEXT.map(lambda a: f"<think>t</think><action>{a}</action>"),
    RAW_TEXT.map(lambda a: f"<think>t</think><search>{a}</search>"),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(MODEL_TEXT, min_size=1, max_size=4),
    stack=st.sampled_from(["llm_env", "parser_above", "no_parser", "plain", "search"]),
    history_length=st.integers(0, 3),
)
def test_prompts_stay_in_the_observation_space_whatever_the_model_writes(
    texts, stack, history_length
):
    base = CounterEnv(max_episode_steps=None)
    if stack == "llm_env":
        env = make_llm_env(base, history_length=history_length)
    elif stack == "parser_above":
        env = ParseActions(PromptRenderer(base, history_length, "generic"))
    elif stack == "no_parser":
        env = PromptRenderer(base, history_length, "generic")
    elif stack == "plain":
        env = make_llm_env(base, fmt="plain", history_length=history_length)
    else:
        env = make_llm_env(base, history_length=history_length, template="search")
    renderer = env if isinstance(env, PromptRenderer) else env.env
    prompt, info = env.reset(seed=0)
    assert env.observation_space.contains(prompt)
    for text in texts:
        prompt, *_, info = env.step(text)
        assert env.observation_space.contains(prompt), "prompt left the observation space"
        # The model's text adds at most MAX_HISTORY_ACTION_CHARS per history entry (+ "...").
        for _, action in renderer.history:
            assert len(action) <= MAX_HISTORY_ACTION_CHARS + 3
            assert set(action) <= TEXT_CHARSET
        baseline = render_prompt(
            renderer._task,
            info["raw_observation"],
            [(o, "") for o, _ in renderer.history],
            info.get("admissible_actions"),
            renderer._steps,
            history_length,
            renderer.template,
            fmt=renderer.fmt,
        )
        assert len(prompt) <= len(baseline) + history_length * (MAX_HISTORY_ACTION_CHARS + 3)


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def test_render_prompt_first_and_later_steps():
    first = render_prompt("heat a mug", "You are in a kitchen.", [], ["look", "help"], 0, 2)
    assert "Prior to this step" not in first
    assert "Your task is: heat a mug" in first and "You are in a kitchen." in first
    assert "'look'" in first and "'help'" not in first  # verl-agent drops 'help'
    assert "<think> </think>" in first and "<action> </action>" in first
    history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
    later = render_prompt(None, "o4", history, None, 3, 2, "alfworld")
    assert "already taken 3 step(s)" in later and "most recent 2 observations" in later
    assert "[Observation 2: 'o2', Action 2: 'a2']\n[Observation 3: 'o3', Action 3: 'a3']" in later
    assert "'a1'" not in later and "step 4 and your current observation is: o4" in later
    assert "Your task is" not in later and "admissible actions" not in later


def test_family_templates():
    sok = render_prompt(None, "#P#", [], None, 0, 2, "sokoban")
    assert '["up", "down", "left", "right"]' in sok and "Box on Target" in sok
    shop = render_prompt(
        "buy a red shirt", "WebShop", [], ["search[<q>]", "click[b1]"], 0, 2, "webshop"
    )
    assert "'search[<q>]',\n'click[b1]'," in shop and "Your task is to: buy a red shirt" in shop
    qa0 = render_prompt(None, "Who wrote Hamlet?", [], None, 0, 3, "search")
    assert "Your question: Who wrote Hamlet?" in qa0 and "<search> your query </search>" in qa0
    qa = render_prompt(
        "Who wrote Hamlet?",
        "r2",
        [("Who wrote Hamlet?", "search[hamlet]"), ("r1", "search[x]")],
        None,
        2,
        3,
        "search",
    )
    assert "<search> hamlet </search>\n<information> r1 </information>" in qa
    assert "<search> x </search>\n<information> r2 </information>" in qa
    assert set(PROMPT_TEMPLATES) >= {"generic", "alfworld", "sokoban", "webshop", "search"}
    with pytest.raises(ValueError, match="unknown prompt template"):
        render_prompt(None, "o", [], None, 0, 2, "nethack")
    custom = PromptTemplate(first="{observation}|{instruction}", later="{history}|{observation}")
    assert render_prompt(None, "o", [], None, 0, 2, custom, fmt="plain").startswith("o|Now")


def test_history_window_after_k_plus_2_steps():
    k = 3
    env = PromptRenderer(ParseActions(CounterEnv()), history_length=k)
    prompt, info = env.reset(seed=0)
    assert "make the counter show 100" in prompt and "Prior to this step" not in prompt
    texts = [ta("inc"), ta("inc"), "garbage", ta("DEC"), ta("inc")]  # k + 2 steps
    for text in texts:
        prompt, *_, info = env.step(text)
    # Counter: 0 -inc-> 1 -inc-> 2 -garbage-> 2 -dec-> 1 -inc-> 2; keep the last k pairs.
    assert env.history[0] == ("The counter shows 2.", env.history[0][1])
    assert env.history[0][1].startswith("(invalid: ")
    # The observation after the invalid step is the env's message telling the model what to do.
    assert env.history[1][0].startswith("Invalid response: no <action>")
    assert env.history[1][1] == "dec"
    assert env.history[2] == ("The counter shows 1.", "inc")
    assert "already taken 5 step(s)" in prompt and f"most recent {k} observations" in prompt
    assert "[Observation 3: 'The counter shows 2.', Action 3: '(invalid: " in prompt
    assert "Action 4: 'dec']" in prompt
    assert "[Observation 5: 'The counter shows 1.', Action 5: 'inc']" in prompt
    assert "Observation 2:" not in prompt and "step 6 and" in prompt
    assert "['inc'\n 'dec']" in prompt  # the admissible actions
    assert info["raw_observation"] == "The counter shows 2."
    # A reset starts a fresh history.
    prompt, _ = env.reset(seed=1)
    assert env.history == [] and "Prior to this step" not in prompt


def test_both_wrapper_orders_record_what_the_env_received():
    texts = [ta("inc"), "<action>dec", ta("Dec"), ta("inc"), "<think>x</think>"]
    a = PromptRenderer(ParseActions(CounterEnv()), history_length=2)
    b = ParseActions(PromptRenderer(CounterEnv(), history_length=2))
    pa, _ = a.reset(seed=0)
    pb, _ = b.reset(seed=0)
    assert pa == pb
    for text in texts:
        ra, rb = a.step(text), b.step(text)
        assert ra[0] == rb[0] and ra[1:4] == rb[1:4]
        assert ra[4]["parsed_action"] == rb[4]["parsed_action"]
    assert [act for _, act in a.history] == [act for _, act in b.env.history]
    assert "<think>" not in "".join(act for _, act in a.history)  # never the raw model text


def test_without_a_parser_history_holds_the_action_given():
    env = PromptRenderer(CounterEnv(), history_length=1, template="generic")
    env.reset(seed=0)
    prompt, *_ = env.step("inc")
    assert env.history == [("The counter shows 0.", "inc")]
    assert "Action 1: 'inc'" in prompt


def test_history_length_zero_always_uses_first_template():
    env = make_llm_env(CounterEnv(), history_length=0)
    env.reset(seed=0)
    prompt, *_ = env.step(ta("inc"))
    assert "Prior to this step" not in prompt and "The counter shows 1." in prompt


def test_make_llm_env_picks_family_template_and_format():
    class SokobanLike(CounterEnv):
        family = "sokoban"

    class QALike(CounterEnv):
        family = "searchqa"

        def _step_action(self, action):
            # The QA convention: "search[query]" / "answer[text]".
            return super()._step_action("inc" if action.startswith("search[") else "dec")

    prompt, _ = make_llm_env(SokobanLike()).reset(seed=0)
    assert "Sokoban environment" in prompt and "<action> </action>" in prompt
    qa = make_llm_env(QALike())
    prompt, _ = qa.reset(seed=0)
    assert "<answer> </answer>" in prompt
    *_, info = qa.step("<think>x</think><search>who</search>")
    assert info["parsed_action"] == "search[who]" and info["state_key"] == 1
    *_, info = qa.step("<action>inc</action>")
    assert not info["action_valid"] and info["state_key"] == 1
    plain = make_llm_env(CounterEnv(), fmt="plain", template="generic")
    prompt, _ = plain.reset(seed=0)
    assert "action text only" in prompt
    assert plain.step(" inc ")[4]["state_key"] == 1


@pytest.mark.filterwarnings("ignore:.*is different from the unwrapped version")
def test_wrapped_env_passes_check_env_and_pickles():
    from gymnasium.utils.env_checker import check_env

    env = make_llm_env(CounterEnv())
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    env.step(ta("inc"))
    clone = pickle.loads(pickle.dumps(env))
    assert clone.step(ta("inc"))[0] == env.step(ta("inc"))[0]
    assert isinstance(clone, gym.Wrapper)


def test_stack_inside_group_vector_env():
    group = pytest.importorskip("agentgym.vector")
    spec = gym.envs.registration.EnvSpec("AgentGymTest/Counter-v0", entry_point=CounterEnv)
    venv = group.GroupVectorEnv(
        spec, num_groups=2, group_size=2, wrappers=[(make_llm_env, {"history_length": 2})]
    )
    obs, infos = venv.reset(seed=0)
    assert all("make the counter show 100" in o for o in obs)
    texts = [ta("inc"), "junk", ta("dec"), "<think>x</think><action>inc"]
    obs, rewards, term, trunc, infos = venv.step(texts)
    assert [i["action_valid"] for i in infos] == [True, False, True, False]
    assert [i["state_key"] for i in infos] == [1, 0, -1, 0]
    steps = [t.steps[0] for t in venv.trajectories()]
    assert [s.action for s in steps] == texts  # the raw model text is what a trainer trains on
    assert [s.action_valid for s in steps] == [True, False, True, False]
    assert all(s.observation.startswith("You are an expert agent") for s in steps)
    venv.close()


def test_a_structured_goal_reaches_the_prompt_as_its_instruction_only():
    # WebShop's info["goal"] holds the target product (asin, name, price): the prompt's task is
    # the field the family names (FAMILY.prompt.task_key), never the whole goal
    env = make_llm_env("AgentGym/WebShop-Synthetic-v0")
    prompt, info = env.reset(seed=0)
    goal = env.unwrapped._last_info["goal"]
    assert f"Your task is to: {goal['instruction_text']}\n" in prompt
    assert goal["asin"] not in prompt and goal["name"] not in prompt
    # another template (the trainer's compact ones) still reads the family's field
    other = make_llm_env("AgentGym/WebShop-Synthetic-v0", template="generic").reset(seed=0)[0]
    assert goal["instruction_text"] in other and goal["asin"] not in other
    # a caller's task_key still wins; dotted keys walk into dicts
    env = make_llm_env("AgentGym/WebShop-Synthetic-v0", task_key="goal.query")
    assert f"Your task is to: {goal['query']}\n" in env.reset(seed=0)[0]
