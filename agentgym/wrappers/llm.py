"""LLM-facing wrappers: parse model text into env actions, render env observations as prompts.

Two wrappers and the pure functions behind them:

- :func:`parse_action` / :class:`ParseActions` turn model output such as
  ``"<think>the drawer is closed</think><action>open drawer 1</action>"`` into the action the
  env receives (``"open drawer 1"``). Text that does not follow the format never raises: the
  env is stepped with :class:`agentgym.core.InvalidAction`, which costs a step and reports
  ``info["action_valid"] = False``, and the reason is in ``info["parse_error"]``.
- :func:`render_prompt` / :class:`PromptRenderer` turn the env observation into a
  verl-agent-style prompt: the task, the last ``k`` (observation, action) pairs, the current
  observation, the admissible actions and the output-format instruction.

Compose them as ``PromptRenderer(ParseActions(env))`` (or call :func:`make_llm_env`), so the
history shows the action the env actually received, not the raw model text. The other order,
``ParseActions(PromptRenderer(env))``, records the same history (see :class:`PromptRenderer`).

The validity rules follow verl-agent's action projections (``agent_system/environments/
env_package/*/projection.py``), made stricter only where verl-agent's ``str.find`` accepted
text its own prompts forbid:

==================  ==========================================================================
``think_action``    exactly one complete ``<action>...</action>`` block (no second ``<action>``
                    or ``</action>`` tag anywhere, no tag inside it); a complete
                    ``<think>...</think>`` block that closes before ``<action>`` (required by
                    default, as verl-agent's ALFWorld / WebShop / Sokoban projections require
                    both think tags); no CJK characters (verl-agent rejects them for ALFWorld and
                    WebShop); the action is stripped, whitespace-collapsed and lowercased
                    (verl-agent lowercases the whole response); tags match case-insensitively.
``search_answer``   exactly one of ``<search>query</search>`` or ``<answer>text</answer>``, never
                    both and never two of one kind (verl-agent's search projection rules); a
                    ``<think>`` block is optional (verl-agent's search projection does not check
                    it); case is kept. The action is ``"search[query]"`` or ``"answer[text]"``:
                    the keyword, ``[``, the stripped content, ``]`` (content is everything between
                    the first ``[`` and the last ``]``, so it may itself hold brackets).
``plain``           the whole text, stripped and whitespace-collapsed, is the action (for
                    scripted policies and humans); empty text is invalid.
==================  ==========================================================================

Every rule with a verl-agent default can be changed per call (``require_think``,
``reject_cjk``, ``lowercase``, ``implicit_think_open``).

Parsing is linear in the input length: one precompiled regex finds the format's tags (fixed
literals, no nested quantifiers), and everything else is slicing, so a 100 KB response of
unbalanced tags costs microseconds per KB, not a catastrophic backtrack.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, SupportsFloat, get_args

import gymnasium as gym
from gymnasium import spaces

from agentgym.core import MAX_OBS_CHARS, TEXT_CHARSET, InvalidAction, coerce_action, describe_action
from agentgym.family import (
    HISTORY_INTRO,
    ActionFormat,
    FamilySpec,
    FamilyTable,
    PromptTemplate,
    family_spec,
)

__all__ = [
    "DEFAULT_TASK_KEYS",
    "ActionFormat",
    "FORMATS",
    "FORMAT_INSTRUCTIONS",
    "MAX_HISTORY_ACTION_CHARS",
    "PROMPT_TEMPLATES",
    "FAMILY_TEMPLATES",
    "GENERIC_TEMPLATE",
    "ParsedAction",
    "ParseFailure",
    "PromptTemplate",
    "parse_action",
    "render_prompt",
    "ParseActions",
    "PromptRenderer",
    "make_llm_env",
    "template_for_family",
]

# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

#: Longest action a prompt's history shows, before the ``"..."`` that marks a cut (see
#: :class:`PromptRenderer`): a model's text reaches later prompts bounded by this, whatever
#: it wrote.
MAX_HISTORY_ACTION_CHARS = 256

#: Output formats :func:`parse_action` understands.
FORMATS: tuple[str, ...] = get_args(ActionFormat)

# One scanner per format, over the tags that format cares about. Literal alternatives only, so
# matching is linear; other tags (``<information>``, ``<tool_call>``...) are plain text to us.
_TAGS_RE: dict[str, re.Pattern[str]] = {
    "think_action": re.compile(r"<(/?)(think|action)>", re.IGNORECASE),
    "search_answer": re.compile(r"<(/?)(think|search|answer)>", re.IGNORECASE),
}
# CJK Unified Ideographs (the range verl-agent rejects), extension A and compatibility ideographs.
_CJK_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# Per-format defaults of the optional rules (see the module docstring for why).
_DEFAULTS: dict[str, dict[str, bool]] = {
    "think_action": {"require_think": True, "reject_cjk": True, "lowercase": True},
    "search_answer": {"require_think": False, "reject_cjk": False, "lowercase": False},
    "plain": {"require_think": False, "reject_cjk": False, "lowercase": False},
}

#: What to tell the model after an invalid response, per format (the env shows it as the
#: observation of the invalid step).
_FORMAT_HINTS: dict[str, str] = {
    "think_action": "Reason inside <think> </think>, then give exactly one action inside "
    "<action> </action>.",
    "search_answer": "Reason inside <think> </think>, then give exactly one of "
    "<search> query </search> or <answer> answer </answer>.",
    "plain": "Reply with the action text only.",
}


class ParseFailure(InvalidAction):
    """The :class:`~agentgym.core.InvalidAction` :class:`ParseActions` steps the env with.

    ``message`` (the observation the env returns) tells the model what was wrong and what to
    do; ``error`` is the bare reason, which :class:`PromptRenderer` shows in the history.
    """

    __slots__ = ("error",)

    def __init__(self, message: str, error: str):
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class ParsedAction:
    """The result of :func:`parse_action`.

    Invariants (the tests check them on arbitrary input): ``valid`` is True exactly when
    ``error`` is None; a valid result has a non-empty ``action``. An invalid result may still
    carry the ``action`` and ``think`` it could extract (e.g. a well-formed action with the think
    block missing), for logging; wrappers never send an invalid result's action to the env.
    """

    action: str | None
    """the env action: stripped, whitespace-collapsed, lowercased where the format says so"""
    think: str | None
    """the stripped content of the first complete ``<think>`` block, if any"""
    valid: bool
    """whether the text follows the format (and, when ``admissible`` was given, names one)"""
    error: str | None
    """why the text is invalid, in words a model can act on; None when valid"""


def _clean(text: str, lowercase: bool) -> str:
    text = " ".join(text.split())
    return text.lower() if lowercase else text


def _tags(text: str, fmt: str) -> list[tuple[str, bool, int, int]]:
    """(name, closing, start, end) of every tag of ``fmt`` in ``text``, in order."""
    return [
        (m.group(2).lower(), bool(m.group(1)), m.start(), m.end())
        for m in _TAGS_RE[fmt].finditer(text)
    ]


def _block(
    tags: list[tuple[str, bool, int, int]], name: str
) -> tuple[tuple[int, int] | None, str | None]:
    """The single ``<name>...</name>`` block as (content start, content end), or why there is none.

    Returns ``(None, None)`` when the tag does not occur at all, ``(span, None)`` for exactly one
    well-ordered block, and ``(None, error)`` for every other arrangement.
    """
    opens = [t for t in tags if t[0] == name and not t[1]]
    closes = [t for t in tags if t[0] == name and t[1]]
    if not opens and not closes:
        return None, None
    if len(opens) > 1 or len(closes) > 1:
        n = max(len(opens), len(closes))
        return None, f"expected exactly one <{name}>...</{name}> block, found {n}"
    if not closes:
        return None, f"<{name}> is never closed by </{name}>"
    if not opens:
        return None, f"</{name}> has no opening <{name}>"
    if closes[0][2] < opens[0][3]:
        return None, f"</{name}> comes before <{name}>"
    return (opens[0][3], closes[0][2]), None


def _think(
    text: str, tags: list[tuple[str, bool, int, int]], implicit_open: bool
) -> tuple[str | None, int | None]:
    """Content of the first complete think block and the position where it closes (or Nones)."""
    start = None
    for name, closing, s, e in tags:
        if name != "think":
            continue
        if not closing and start is None:
            start = e
        elif closing and start is not None:
            return text[start:s].strip(), e
        elif closing and implicit_open:
            # Reasoning models (Qwen3, DeepSeek-R1) get "<think>" from the chat template, so their
            # output holds only the closing tag: everything before it is the reasoning.
            return text[:s].strip(), e
    return None, None


def parse_action(
    text: Any,
    fmt: ActionFormat = "think_action",
    admissible: Sequence[str] | None = None,
    *,
    require_think: bool | None = None,
    reject_cjk: bool | None = None,
    lowercase: bool | None = None,
    implicit_think_open: bool = False,
) -> ParsedAction:
    """Parse one model response into an env action; never raises on any ``text``.

    Args:
        text: the model's response. ``bytes`` are decoded as UTF-8 (with replacement); anything
            that is not text (None, numbers) gives an invalid result.
        fmt: ``"think_action"``, ``"search_answer"`` or ``"plain"`` (rules in the module
            docstring).
        admissible: if given, the action must name one of these (compared stripped,
            whitespace-collapsed and case-insensitively); the result then carries the
            admissible spelling. If None, admissibility is left to the env.
        require_think: demand a complete ``<think>...</think>`` before the action block
            (default: True for ``think_action``, False otherwise).
        reject_cjk: treat text holding CJK ideographs as invalid (default: True for
            ``think_action``).
        lowercase: lowercase the action (default: True for ``think_action``).
        implicit_think_open: accept a response that starts inside the think block and holds only
            ``</think>`` (chat templates that open ``<think>`` in the prompt).

    Raises:
        ValueError: only for a caller error, an unknown ``fmt``.
    """
    if fmt not in _DEFAULTS:
        raise ValueError(f"unknown action format {fmt!r}; choose one of {FORMATS}")
    defaults = _DEFAULTS[fmt]
    require_think = defaults["require_think"] if require_think is None else require_think
    reject_cjk = defaults["reject_cjk"] if reject_cjk is None else reject_cjk
    lowercase = defaults["lowercase"] if lowercase is None else lowercase

    text = coerce_action(text)
    if text is None:
        return ParsedAction(None, None, False, "the response is not text")

    action: str | None = None
    think: str | None = None
    error: str | None = None
    if fmt == "plain":
        action = _clean(text, lowercase) or None
        if action is None:
            error = "the response is empty"
    else:
        tags = _tags(text, fmt)
        think, think_end = _think(text, tags, implicit_think_open)
        if fmt == "think_action":
            span, error = _block(tags, "action")
            if span is None and error is None:
                error = "no <action>...</action> block"
            kind = "action"
        else:
            s_span, s_err = _block(tags, "search")
            a_span, a_err = _block(tags, "answer")
            has_s = any(t[0] == "search" for t in tags)
            has_a = any(t[0] == "answer" for t in tags)
            if has_s and has_a:
                span, error, kind = None, "give either <search> or <answer>, not both", ""
            elif has_s:
                span, error, kind = s_span, s_err, "search"
            elif has_a:
                span, error, kind = a_span, a_err, "answer"
            else:
                span, error, kind = None, "no <search>...</search> or <answer>...</answer>", ""
        if span is not None:
            inner = [t for t in tags if span[0] <= t[2] and t[3] <= span[1]]
            content = _clean(text[span[0] : span[1]], lowercase)
            if inner:
                error = f"tags are not allowed inside <{kind}>...</{kind}>"
            elif not content:
                error = f"the <{kind}></{kind}> block is empty"
            else:
                action = content if fmt == "think_action" else f"{kind}[{content}]"
            if error is None and require_think and (think_end is None or think_end > span[0]):
                error = f"a <think>...</think> block must come before <{kind}>"
        elif error is None and require_think and think is None:
            error = "no <think>...</think> block"

    if error is None and reject_cjk and _CJK_RE.search(text):
        error = "the response contains CJK characters; answer in English"
    if error is None and admissible is not None and action is not None:
        wanted = action.lower()
        match = next(
            (a for a in admissible if isinstance(a, str) and _clean(a, True) == wanted), None
        )
        if match is None:
            error = f"{action!r} is not one of the admissible actions"
        else:
            action = match
    return ParsedAction(action, think, error is None, error)


# ---------------------------------------------------------------------------------------------
# Prompt templates
# ---------------------------------------------------------------------------------------------

#: Output-format instruction per action format, placed at the end of every prompt. The
#: ``think_action`` wording is verl-agent's, so models tuned on its prompts see what they know.
FORMAT_INSTRUCTIONS: dict[str, str] = {
    "think_action": (
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning "
        "process MUST be enclosed within <think> </think> tags.\n"
        "Once you've finished your reasoning, you should choose an admissible action for "
        "current step and present it within <action> </action> tags."
    ),
    "search_answer": (
        "Now it's your turn to respond for the current step.\n"
        "You should first conduct a reasoning process. This process MUST be enclosed within "
        "<think> </think> tags.\n"
        "After completing your reasoning, choose only one of the following actions (do not "
        "perform both):\n"
        "(1) If you find you lack some knowledge, you can call a search engine to get more "
        "external information using format: <search> your query </search>.\n"
        "(2) If you have enough knowledge to answer the question confidently, provide your "
        "final answer within <answer> </answer> tags, without detailed illustrations. For "
        "example, <answer>Beijing</answer>."
    ),
    "plain": "Now it's your turn to take an action. Reply with the action text only.",
}


#: What a family without a prompt of its own is rendered with.
#: the info keys a prompt's task is read from when neither the caller nor the template names any
DEFAULT_TASK_KEYS: tuple[str, ...] = ("goal", "question", "instruction")

GENERIC_TEMPLATE = PromptTemplate(
    first=(
        "You are an expert agent operating in a text-based environment.\n"
        "{task_line}Your current observation is: {observation}\n{admissible_line}\n"
        "{instruction}\n"
    ),
    later=(
        "You are an expert agent operating in a text-based environment.\n"
        "{task_line}" + HISTORY_INTRO + "{admissible_line}\n{instruction}\n"
    ),
)

# Template names kept from before each family declared its own: the QA family's was "search".
_TEMPLATE_ALIASES = {"search": "searchqa"}


def _family_prompt(name: str, spec: FamilySpec) -> PromptTemplate | None:
    return spec.prompt


def _family_template_name(name: str, spec: FamilySpec) -> str | None:
    return name if spec.prompt is not None else None


#: Prompt templates by name, a view: ``"generic"``, then each registered family's own
#: (``FAMILY.prompt`` in its package, under the family's name; ``"search"`` is the search-QA
#: family's too). :class:`PromptRenderer` and :func:`render_prompt` accept a name or a
#: :class:`PromptTemplate`; ``PROMPT_TEMPLATES[name] = template`` adds a selectable one.
PROMPT_TEMPLATES: FamilyTable[PromptTemplate] = FamilyTable(
    _family_prompt, {"generic": GENERIC_TEMPLATE}, aliases=_TEMPLATE_ALIASES
)

#: Template name for each env family (``TextEnv.family``) that declares a prompt, a view; others
#: get ``"generic"``.
FAMILY_TEMPLATES: FamilyTable[str] = FamilyTable(_family_template_name, aliases=_TEMPLATE_ALIASES)


def template_for_family(family: str | None) -> PromptTemplate:
    """The prompt template of env family ``family`` (its ``FAMILY.prompt``), else the generic one."""
    spec = family_spec(family) if isinstance(family, str) else None
    return spec.prompt if spec is not None and spec.prompt is not None else GENERIC_TEMPLATE


def _template(template: str | PromptTemplate | None) -> PromptTemplate:
    if isinstance(template, PromptTemplate):
        return template
    name = "generic" if template is None else template
    try:
        return PROMPT_TEMPLATES[name]
    except KeyError:
        raise ValueError(
            f"unknown prompt template {name!r}; choose one of {sorted(PROMPT_TEMPLATES)} "
            "or pass a PromptTemplate"
        ) from None


def _format_admissible(actions: Sequence[str], style: str) -> str:
    if style == "json":
        return ", ".join(f'"{a}"' for a in actions)
    if style == "quoted_commas":
        return "\n".join(f"'{a}'," for a in actions)
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def _search_display(action: str) -> str:
    """``search[q]`` -> ``<search> q </search>`` (the form the model wrote it in)."""
    for kind in ("search", "answer"):
        if action.startswith(kind + "[") and action.endswith("]"):
            return f"<{kind}> {action[len(kind) + 1 : -1]} </{kind}>"
    return action


def _information_block(result: str) -> str:
    """A search result inside ``<information>`` tags, once: SearchQA's observations (Search-R1's
    format) already come wrapped, other text is wrapped here."""
    stripped = result.strip()
    if stripped.startswith("<information>") and stripped.endswith("</information>"):
        return stripped
    return f"<information> {result} </information>"


def _format_history(
    pairs: Sequence[tuple[str, str]], first_step: int, observation: str, style: str
) -> str:
    if style == "search":
        # Pair j holds the observation an action was taken FROM; its result is the observation
        # of pair j+1, or the current observation for the newest pair.
        results = [p[0] for p in pairs[1:]] + [observation]
        return "\n".join(
            f"Step {first_step + j}:\n{_search_display(act)}\n{_information_block(res)}"
            for j, ((_, act), res) in enumerate(zip(pairs, results, strict=True))
        )
    return "\n".join(
        f"[Observation {first_step + j}: '{obs}', Action {first_step + j}: '{act}']"
        for j, (obs, act) in enumerate(pairs)
    )


def render_prompt(
    task: str | None,
    observation: str,
    history: Sequence[tuple[str, str]],
    admissible: Sequence[str] | None,
    step: int,
    history_length: int,
    template: str | PromptTemplate = "generic",
    *,
    fmt: ActionFormat | None = None,
) -> str:
    """Render one verl-agent-style prompt.

    Args:
        task: the task description (ALFWorld's goal, WebShop's instruction, the QA question), or
            None where the observation or the template's rules say it all (Sokoban).
        observation: the current env observation.
        history: past (observation the action was taken from, action the env received) pairs,
            oldest first; only the last ``history_length`` are shown.
        admissible: the actions valid now, or None (the template's default list, if any, is shown).
        step: steps taken so far in the episode; step 0 (or ``history_length <= 0``) uses the
            template's ``first`` form, later steps its ``later`` form.
        history_length: how many past steps to show at most (verl-agent's ``history_length``).
        template: a name in :data:`PROMPT_TEMPLATES` or a :class:`PromptTemplate`.
        fmt: the action format whose instruction ends the prompt (default: the template's).
    """
    tpl = _template(template)
    fmt = tpl.default_fmt if fmt is None else fmt
    if fmt not in FORMAT_INSTRUCTIONS:
        raise ValueError(f"unknown action format {fmt!r}; choose one of {FORMATS}")
    if admissible is None and tpl.default_admissible is not None:
        admissible = tpl.default_admissible
    window = list(history)[-history_length:] if history_length > 0 else []
    first = step <= 0 or history_length <= 0 or not window
    if not task and tpl.task_from_observation and step <= 0:
        task = observation  # the first observation is the question
    fields = {
        "task": task or "",
        "task_line": f"{tpl.task_prefix}{task}\n" if task else "",
        "observation": observation,
        "admissible_line": (
            tpl.admissible_line.format(actions=_format_admissible(admissible, tpl.admissible_style))
            if admissible is not None
            else ""
        ),
        "step_count": step,
        "current_step": step + 1,
        "history_length": len(window),
        "history": ""
        if first
        else _format_history(window, step - len(window) + 1, observation, tpl.history_style),
        "instruction": dict(tpl.instructions).get(fmt, FORMAT_INSTRUCTIONS[fmt]),
    }
    return (tpl.first if first else tpl.later).format_map(fields)


# ---------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------


class ParseActions(gym.Wrapper):
    """Step the env with the action parsed from model text (see :func:`parse_action`).

    ``step(model_text)`` parses the text and steps the inner env with the parsed action. Text
    that does not follow ``fmt`` steps the env with :class:`agentgym.core.InvalidAction`: the
    agent loses a step (so the step cap still applies), the world does not change, the env
    reports ``info["action_valid"] = False`` and the observation tells the model what was wrong.
    It never raises, whatever the text.

    Added to ``info`` on every step:

    - ``parsed_action``: the ``str`` action the env received, or None when the text did not parse;
    - ``think``: the reasoning text, or None;
    - ``parse_error``: why the text did not parse (only on such steps).

    ``step`` also accepts an :class:`~agentgym.core.InvalidAction`, which is passed through.
    With ``check_admissible=True`` an action outside the last ``info["admissible_actions"]``
    counts as a parse failure too (by default the env judges admissibility itself).
    """

    def __init__(
        self,
        env: gym.Env,
        fmt: ActionFormat = "think_action",
        *,
        check_admissible: bool = False,
        **parse_options: Any,
    ):
        super().__init__(env)
        if fmt not in FORMATS:
            raise ValueError(f"unknown action format {fmt!r}; choose one of {FORMATS}")
        parse_action("", fmt, **parse_options)  # fail now, not mid-rollout, on a bad option
        self.fmt = fmt
        self.check_admissible = check_admissible
        self.parse_options = parse_options
        self._admissible: Sequence[str] | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._admissible = info.get("admissible_actions")
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if isinstance(action, InvalidAction):
            parsed = ParsedAction(None, None, False, action.message)
            env_action: Any = action
        else:
            admissible = self._admissible if self.check_admissible else None
            parsed = parse_action(action, self.fmt, admissible, **self.parse_options)
            env_action = parsed.action if parsed.valid else None
            if env_action is None:
                env_action = ParseFailure(
                    f"Invalid response: {parsed.error}. {_FORMAT_HINTS[self.fmt]}",
                    str(parsed.error),
                )
        obs, reward, terminated, truncated, info = self.env.step(env_action)
        # A copy: the inner env keeps its own info dict as the state of a finished episode.
        info = dict(info)
        self._admissible = info.get("admissible_actions")
        info["parsed_action"] = parsed.action if parsed.valid else None
        info["think"] = parsed.think
        if not parsed.valid:
            info["parse_error"] = parsed.error
        return obs, reward, terminated, truncated, info


class PromptRenderer(gym.Wrapper):
    """Turn each env observation into a verl-agent-style prompt (see :func:`render_prompt`).

    Keeps the last ``history_length`` (observation, action) pairs of the episode, where the
    observation is the raw env observation the action was taken from and the action is the one
    the env received. Both compositions record that action:

    - ``PromptRenderer(ParseActions(env))`` (what :func:`make_llm_env` builds): the renderer
      reads ``info["parsed_action"]`` from the parser below it;
    - ``ParseActions(PromptRenderer(env))``: the renderer is handed the parsed action directly.

    A step whose text did not parse is recorded as ``(invalid: <reason>)``. What the history
    records comes from the model, so it is sanitised as :func:`agentgym.core.describe_action`
    does (inside :data:`~agentgym.core.TEXT_CHARSET`, non-ASCII escaped) and cut to
    :data:`MAX_HISTORY_ACTION_CHARS`: a prompt is at most the template, the task, the admissible
    actions, ``history_length + 1`` observations and ``history_length`` such actions long, and
    stays inside ``observation_space`` whatever the model writes.

    The task is read from the reset info under ``task_key`` (a key or a sequence of keys tried in
    order, ``"a.b"`` for ``info["a"]["b"]``; default: the template's ``task_key``, else the env
    family's template's, else :data:`DEFAULT_TASK_KEYS`), and refreshed if a step's info
    carries it. Admissible actions come from ``info["admissible_actions"]``. The raw observation
    stays available as ``info["raw_observation"]``.
    """

    def __init__(
        self,
        env: gym.Env,
        history_length: int = 2,
        template: str | PromptTemplate | None = None,
        task_key: str | Sequence[str] | None = None,
        *,
        fmt: ActionFormat | None = None,
    ):
        super().__init__(env)
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        self.template = _template(template)
        self.history_length = history_length
        if task_key is None:  # where the family's info keeps the task, whatever the template
            family = template_for_family(getattr(env.unwrapped, "family", None))
            task_key = self.template.task_key or family.task_key or DEFAULT_TASK_KEYS
        self.task_keys = (task_key,) if isinstance(task_key, str) else tuple(task_key)
        # The instruction must ask for what the parser accepts: take the parser's format if one
        # sits below us, else the caller's, else the template's.
        below = _find_wrapper(env, ParseActions)
        self.fmt = fmt or (below.fmt if below is not None else self.template.default_fmt)
        render_prompt(None, "", [], None, 0, history_length, self.template, fmt=self.fmt)
        # Prompts hold up to history_length + 1 observations plus the template text.
        self.observation_space = spaces.Text(
            max_length=MAX_OBS_CHARS * (history_length + 2), min_length=0, charset=TEXT_CHARSET
        )
        self._history: deque[tuple[str, str]] = deque(maxlen=max(history_length, 1))
        self._steps = 0
        self._task: str | None = None
        self._obs = ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._history.clear()
        self._steps = 0
        self._task = obs if self.template.task_from_observation else None
        return self._render(obs, info)

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._history.append((self._obs, self._received(action, info)))
        self._steps += 1
        prompt, info = self._render(obs, info)
        return prompt, reward, terminated, truncated, info

    @property
    def history(self) -> list[tuple[str, str]]:
        """The last ``history_length`` (observation, action) pairs, oldest first."""
        return list(self._history)[-self.history_length :] if self.history_length else []

    @staticmethod
    def _received(action: Any, info: dict[str, Any]) -> str:
        """The action the env received this step, as shown in the history (sanitised, bounded)."""
        if "parsed_action" in info:  # a ParseActions below us parsed the model text
            if info["parsed_action"] is not None:
                shown = info["parsed_action"]
            else:
                shown = f"(invalid: {info.get('parse_error', 'unparseable response')})"
        elif isinstance(action, InvalidAction):  # a ParseActions above us rejected the text
            shown = f"(invalid: {getattr(action, 'error', action.message)})"
        else:
            text = coerce_action(action)
            shown = text if text is not None else f"(invalid: {action!r})"
        return describe_action(shown, limit=MAX_HISTORY_ACTION_CHARS)

    def _render(self, obs: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        for key in self.task_keys:
            value: Any = info
            for part in key.split("."):  # "goal.instruction_text": a field of a structured goal
                value = value.get(part) if isinstance(value, dict) else None
            if value:
                self._task = str(value)
                break
        self._obs = obs
        prompt = render_prompt(
            self._task,
            obs,
            self._history,
            info.get("admissible_actions"),
            self._steps,
            self.history_length,
            self.template,
            fmt=self.fmt,
        )
        info = dict(info)
        info["raw_observation"] = obs
        return prompt, info


def _find_wrapper(env: gym.Env, kind: type) -> Any:
    """The outermost wrapper of type ``kind`` in ``env``'s stack, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, kind):
            return env
        env = env.env
    return None


def make_llm_env(
    env: gym.Env | str,
    fmt: ActionFormat | None = None,
    history_length: int = 2,
    template: str | PromptTemplate | None = None,
    *,
    check_admissible: bool = False,
    task_key: str | Sequence[str] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    **parse_options: Any,
) -> PromptRenderer:
    """Wrap ``env`` for an LLM: ``PromptRenderer(ParseActions(env))``, stacked in the right order.

    ``env`` is an env or a registered id (made with ``gym.make(env, **env_kwargs)``). The
    template defaults to the env family's (the ``FAMILY.prompt`` its package declares for
    ``TextEnv.family``, else the generic one) and ``fmt`` to that template's format (``search_answer`` for QA,
    ``think_action`` otherwise). Other keywords go to :func:`parse_action`.

    Usable as a ``GroupVectorEnv`` wrapper: ``wrappers=[(make_llm_env, {"history_length": 2})]``.
    """
    if isinstance(env, str):
        env = gym.make(env, **(env_kwargs or {}))
    if template is None:
        tpl = template_for_family(getattr(env.unwrapped, "family", None))
    else:
        tpl = _template(template)
    fmt = tpl.default_fmt if fmt is None else fmt
    parser = ParseActions(env, fmt, check_admissible=check_admissible, **parse_options)
    return PromptRenderer(parser, history_length, tpl, task_key, fmt=fmt)
