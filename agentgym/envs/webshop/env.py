"""The WebShop text env: WebShop's pages and actions, on a shared catalogue and index."""

from __future__ import annotations

import os
import re
from collections.abc import Hashable
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
from gymnasium import spaces

from agentgym.core import (
    MAX_OBS_CHARS,
    TEXT_CHARSET,
    ResetOptionError,
    SnapshotMismatch,
    TextEnv,
    describe_action,
)
from agentgym.envs.webshop import pages
from agentgym.envs.webshop.data import DEFAULT_SEED, SPLITS, Catalogue, load_catalogue
from agentgym.envs.webshop.nouns import (
    NounExtractor,
    default_noun_extractor,
    prepare_title_nouns,
)
from agentgym.envs.webshop.reward import webshop_reward
from agentgym.envs.webshop.search import ProductSearch, product_search

__all__ = ["WebShopEnv", "parse_action", "SEARCH_ACTION"]

#: How ``admissible_actions`` shows the search bar (verl-agent's prompt shows it this way).
SEARCH_ACTION = "search[<your query>]"

# page kinds
SEARCH, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "sub", "done"


def parse_action(action: str) -> tuple[str, str | None]:
    r"""WebShop's ``parse_action``: ``"click[Buy Now]"`` -> ``("click", "Buy Now")``.

    Gives exactly what ``re.match(r"(.+)\[(.+)\]", action)`` gives WebShop (``(action, None)``
    when it does not match), in linear time: the regex backtracks quadratically on text such as
    ``"[" * 100_000``. Its reading: ``.`` stops at a newline, so everything lies before the first
    ``"\n"``; the name is greedy, so the ``"["`` is the last one that still leaves a non-empty
    argument before some ``"]"``; the argument is greedy, so it ends at the last ``"]"``; text
    after that ``"]"`` is ignored.
    """
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    # the "[" must leave a name of >= 1 character before it and an argument of >= 1 after it
    open_ = line.rfind("[", 1, close - 1) if close >= 3 else -1
    if open_ < 1:
        return action, None
    return line[:open_], line[open_ + 1 : close]


def _copy_goal(goal: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy of a goal for an info dict (callers keep infos; the catalogue's stay intact)."""
    out = dict(goal)
    out["attributes"] = list(goal["attributes"])
    options = goal["goal_options"]
    out["goal_options"] = dict(options) if isinstance(options, dict) else list(options)
    return out


class _WebShopState(NamedTuple):
    """What a WebShop step reads and changes (see ``WebShopEnv``'s snapshot paragraph)."""

    goal_index: int
    kind: str
    query: str | None
    page: int | None
    asin: str | None
    options: tuple[tuple[str, str], ...]  # in click order, as the done page lists them
    sub: str | None
    results: np.ndarray  # read-only rows of the search, shared with the search memo
    score: float
    reward_info: tuple[tuple[str, Any], ...] | None


class WebShopEnv(TextEnv):
    """WebShop (``AgentGym/WebShop-v0``; synthetic shop: ``AgentGym/WebShop-Synthetic-v0``).

    Plays WebShop's text mode (``WebAgentTextEnv(observation_mode="text")``): the same pages with
    the same text (:mod:`.pages`), the same actions, the same transitions, the same reward. The
    first observation is ``WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search``.

    **Actions** are WebShop's: ``search[<query>]`` (the query is lower-cased) and
    ``click[<x>]`` where ``x`` (lower-cased) is a button (``back to search``, ``next >``,
    ``< prev``, ``description``, ``features``, ``reviews``, ``buy now``), a product's asin on a
    results page, or an option value on a product page. Only ``click[buy now]`` ends the
    episode. As in WebShop, ``search[...]`` works from every page (``search_anywhere=False``
    allows it only where the page has a search bar), ``Next >`` is offered on every results page
    (past the 50th result the page is empty), and an option click keeps the other options.

    **Invalid actions.** WebShop silently ignores an action it cannot use and shows the same
    page again. Here such an action also changes nothing, but the observation is a one-line
    message saying why (``Invalid action ...``) and ``info["action_valid"]`` is False; a valid
    action always gets WebShop's page text. Unlike WebShop, ``click[search]`` is invalid (WebShop
    lists it as clickable but ignores it) and ``search[<r>]``-style debug prefixes of WebShop's
    web UI are ordinary queries.

    **Rewards.** At ``click[buy now]``, ``info["score"]`` is WebShop's 0..1 reward
    (:func:`agentgym.envs.webshop.reward.webshop_reward`, given the product's fixed price and the
    options clicked, as WebShop's ``done()`` calls ``get_reward``) and ``info["won"]`` is
    ``score == 1``. The env reward is ``success_reward`` (10, verl-agent's) on a win and 0
    otherwise (``reward_mode="success"``), or the score itself (``reward_mode="raw"``).
    Every other step gives 0.

    **Tasks and splits.** A task is a goal of the catalogue (``catalogue.goals``, in WebShop's
    shuffled order); goals 0-499 are ``test``, 500-1499 ``valid`` and the rest ``train``, fixed
    for every seed. ``reset()`` draws a goal of the split uniformly with ``self.np_random``
    (as verl-agent does; WebShop's own server weights goals by attribute rarity).
    ``options={"split": ...}`` picks the split (default: the constructor's, ``"train"``);
    ``options={"task": i}`` picks goal ``i`` by its index in the goal list (WebShop's session
    number; the split it lies in is implied, and must agree with ``split`` if both are given).
    ``task_id`` is ``"webshop-<index>"``, and is accepted back as a task (so is the bare index).

    **state_key** is ``(goal index, page kind, query, result page, asin, selected options
    (sorted name/value pairs), sub-page)``; fields a page does not have are None. The same page
    reached by two paths has the same key (e.g. an item page left through ``< prev`` from its
    description page and the item page first opened); the query is kept exactly as typed.

    **Sharing.** The catalogue (:func:`.data.load_catalogue`), its search index
    (:func:`.search.product_search`) and the goals are loaded once per process and shared by
    every env there; an env holds references and its own page state only. Pickling an env
    sends its arguments and state, not the catalogue.

    **Snapshot** (:meth:`~agentgym.core.TextEnv.snapshot`): the session's page state (goal
    index, page kind, query, result page, asin, selected options, sub-page), the read-only
    result rows of the last search (shared, at most 50 ints: a restore never searches again),
    and the purchase's score and reward details; the catalogue, index and goals are shared and
    never copied. Identity: the catalogue's fingerprint (a digest of the products and what the
    index reads) and number of goals, and every argument that changes the pages, the search or
    the reward (``search_backend``, ``split``, ``reward_mode``, ``success_reward``,
    ``show_attrs``, ``search_anywhere``, the noun extractor's class, the step cap).

    Args:
        data_dir: WebShop's data folder (default ``$WEBSHOP_DATA``); see :mod:`.data`.
        catalogue: ``"small"`` (1000 products) or ``"full"`` (1.18M).
        synthetic: play the generated shop (:mod:`.synthetic`) instead of real files.
        goals: ``"auto"``, ``"synthetic"`` or ``"human"`` (see :func:`.data.load_catalogue`).
        num_products: keep the first N products (synthetic: the shop's size).
        price_seed: seed of the fixed prices and price bounds.
        search_backend: ``"bm25s"`` (default) or ``"pyserini"``.
        split: default split of ``reset``.
        reward_mode: ``"success"`` (``success_reward`` on a win, else 0) or ``"raw"``.
        success_reward: the winning reward in ``"success"`` mode.
        max_episode_steps: step cap (None: none; the registered ids use 15, as verl-agent).
        show_attrs: show the item page's ``Attributes`` button (WebShop's ``show_attrs``).
        search_anywhere: accept ``search[...]`` on every page, as WebShop's text env does.
        noun_extractor: title-noun extractor of the reward; default the process-wide
            :func:`.nouns.default_noun_extractor` (spaCy's ``en_core_web_sm`` when installed).
    """

    family: ClassVar[str] = "webshop"
    action_syntax: ClassVar[str] = (
        "search[<query>] on the search page, click[<button, product id or option>] elsewhere"
    )

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        catalogue: Literal["small", "full"] = "small",
        synthetic: bool = False,
        goals: Literal["auto", "synthetic", "human"] = "auto",
        num_products: int | None = None,
        price_seed: int = DEFAULT_SEED,
        search_backend: Literal["bm25s", "pyserini"] = "bm25s",
        split: str = "train",
        reward_mode: Literal["success", "raw"] = "success",
        success_reward: float = 10.0,
        max_episode_steps: int | None = None,
        show_attrs: bool = False,
        search_anywhere: bool = True,
        noun_extractor: NounExtractor | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        if reward_mode not in ("success", "raw"):
            raise ValueError(f"reward_mode={reward_mode!r}: choose 'success' or 'raw'")
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: choose one of {list(SPLITS)}")
        self._load_args = dict(
            data_dir=data_dir,
            catalogue=catalogue,
            synthetic=synthetic,
            seed=price_seed,
            goals=goals,
            num_products=num_products,
        )
        self.search_backend = search_backend
        self.split = split
        self.reward_mode = reward_mode
        self.success_reward = float(success_reward)
        self.show_attrs = bool(show_attrs)
        self.search_anywhere = bool(search_anywhere)
        self._noun_extractor_arg = noun_extractor
        self._attach()
        # real product text is not ASCII; the space admits every character a page can show
        self.observation_space = spaces.Text(
            max_length=MAX_OBS_CHARS, min_length=0, charset=TEXT_CHARSET | self.catalogue.charset
        )
        # page state (WebShop's user session)
        self._goal_index = 0
        self._goal: dict[str, Any] = {}
        self._kind = SEARCH
        self._query: str | None = None
        self._page: int | None = None
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._sub: str | None = None
        self._results: np.ndarray = np.zeros(0, dtype=np.int64)
        self._score = 0.0
        self._reward_info: dict[str, float] | None = None

    def _attach(self) -> None:
        """Take references to the process-wide catalogue, index and reward function."""
        self.catalogue: Catalogue = load_catalogue(**self._load_args)
        self.search_engine: ProductSearch = product_search(self.catalogue, self.search_backend)
        # chosen now, not at the first purchase: loading spaCy takes seconds (once per process)
        self.noun_extractor: NounExtractor = (
            self._noun_extractor_arg
            if self._noun_extractor_arg is not None
            else default_noun_extractor()
        )
        # every title's nouns now (or from the disk cache), once per catalogue: no step tags text
        prepare_title_nouns(
            self.noun_extractor, self.catalogue.titles, self.catalogue.titles_digest
        )

    # -- pickling: the shared data stays behind, the next process loads (or reuses) its own ------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("catalogue", None)
        state.pop("search_engine", None)
        state.pop("noun_extractor", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attach()

    # -- tasks ---------------------------------------------------------------------------------
    def _split_of(self, goal_index: int) -> str:
        for name, rows in self.catalogue.splits.items():
            if len(rows) and rows[0] <= goal_index <= rows[-1]:
                return name
        raise ResetOptionError(
            f"goal {goal_index} is outside the catalogue's {len(self.catalogue.goals)} goals"
        )

    def _choose_goal(self, options: dict[str, Any]) -> int:
        split = options.get("split")
        if split is not None and split not in SPLITS:
            raise ResetOptionError(
                f"unknown split {describe_action(split)!r}; choose one of {list(SPLITS)}"
            )
        task = options.get("task")
        if task is None:
            rows = self.catalogue.splits[split or self.split]
            if not len(rows):
                raise ResetOptionError(
                    f"split {split or self.split!r} of the catalogue has no goals "
                    f"({len(self.catalogue.goals)} goals in all; test is 0-499, valid 500-1499)"
                )
            return int(rows[int(self.np_random.integers(len(rows)))])
        if isinstance(task, str):
            digits = task.strip().removeprefix("webshop-")
            if not digits.isdigit():
                raise ResetOptionError(
                    f"task id {task!r} is not a WebShop task (ids look like webshop-<goal index>)"
                )
            task = int(digits)
        if not isinstance(task, (int, np.integer)) or isinstance(task, bool):
            raise ResetOptionError(
                f"options['task'] must be a goal index (int, or its task_id string), got {task!r:.60}"
            )
        index = int(task)
        if not 0 <= index < len(self.catalogue.goals):
            raise ResetOptionError(
                f"task {index}: goals are 0..{len(self.catalogue.goals) - 1} "
                "(test 0-499, valid 500-1499, train the rest)"
            )
        if split is not None and self._split_of(index) != split:
            raise ResetOptionError(
                f"goal {index} is in split {self._split_of(index)!r}, not {split!r}"
            )
        return index

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._goal_index = self._choose_goal(options)
        self._goal = self.catalogue.goals[self._goal_index]
        self._to_search_page()
        self._score, self._reward_info = 0.0, None
        return self._render(), self._info(valid=True)

    # -- state ---------------------------------------------------------------------------------
    def state_key(self) -> Hashable:
        options = tuple(sorted(self._options.items())) if self._kind in (ITEM, SUB, DONE) else ()
        return (
            self._goal_index,
            self._kind,
            self._query,
            self._page,
            self._asin,
            options,
            self._sub,
        )

    # -- snapshot / restore --------------------------------------------------------------------
    def _snapshot_identity(self) -> Hashable:
        catalogue = self.catalogue
        return (
            catalogue.fingerprint,
            len(catalogue.goals),
            catalogue.goal_kind,
            self._load_args["seed"],
            self.search_backend,
            self.split,
            self.reward_mode,
            self.success_reward,
            self.show_attrs,
            self.search_anywhere,
            type(self.noun_extractor).__qualname__,
        )

    def _snapshot_state(self) -> _WebShopState:
        reward_info = self._reward_info
        return _WebShopState(
            self._goal_index,
            self._kind,
            self._query,
            self._page,
            self._asin,
            tuple(self._options.items()),
            self._sub,
            self._results,
            self._score,
            None if reward_info is None else tuple(reward_info.items()),
        )

    def _restore_state(self, state: _WebShopState) -> None:
        if not 0 <= state.goal_index < len(self.catalogue.goals):
            raise SnapshotMismatch(f"goal {state.goal_index} is not in {self.catalogue.source}")
        results = state.results
        if results.flags.writeable:  # unpickled (or the empty start page): keep rows read-only
            results.flags.writeable = False
        self._goal_index = state.goal_index
        self._goal = self.catalogue.goals[state.goal_index]
        self._kind, self._query, self._page = state.kind, state.query, state.page
        self._asin, self._sub = state.asin, state.sub
        self._options = dict(state.options)
        self._results = results
        self._score = state.score
        self._reward_info = None if state.reward_info is None else dict(state.reward_info)

    def _to_search_page(self) -> None:
        self._kind, self._query, self._page, self._asin, self._sub = SEARCH, None, None, None, None
        self._options = {}
        self._results = np.zeros(0, dtype=np.int64)

    def _page_products(self) -> list[dict[str, Any]]:
        start = (self._page - 1) * pages.PRODUCT_WINDOW
        rows = self._results[start : start + pages.PRODUCT_WINDOW]
        products = self.catalogue.products
        return [products[r] for r in rows.tolist()]

    @property
    def _product(self) -> dict[str, Any]:
        return self.catalogue.product_by_asin[self._asin]

    # -- what the page shows and offers ----------------------------------------------------------
    def _render(self) -> str:
        instruction = self._goal["instruction_text"]
        if self._kind == SEARCH:
            return pages.search_page(instruction)
        if self._kind == RESULTS:
            return pages.results_page(
                instruction, self._page_products(), self._page, len(self._results)
            )
        if self._kind == ITEM:
            return pages.item_page(instruction, self._product, show_attrs=self.show_attrs)
        if self._kind == SUB:
            return pages.sub_page(instruction, self._product, self._sub)
        return pages.done_page(self._score, self._asin, self._options)

    def _clickables(self) -> tuple[list[str], dict[str, str]]:
        """WebShop's ``get_available_actions()["clickables"]`` and option value -> group."""
        if self._kind == SEARCH:
            return [pages.SEARCH_BUTTON], {}
        if self._kind == RESULTS:
            return pages.results_clickables(self._page_products(), self._page), {}
        if self._kind == ITEM:
            return pages.item_clickables(self._product, show_attrs=self.show_attrs)
        if self._kind == SUB:
            return [pages.BACK_TO_SEARCH, pages.PREV_PAGE], {}
        return [], {}

    def _info(self, valid: bool) -> dict[str, Any]:
        clickables, _ = self._clickables()
        has_search_bar = self._kind == SEARCH
        admissible = [SEARCH_ACTION] if has_search_bar else []
        admissible += [f"click[{c}]" for c in clickables if c != pages.SEARCH_BUTTON]
        info: dict[str, Any] = {
            "state_key": self.state_key(),
            "task_id": f"webshop-{self._goal_index}",
            "admissible_actions": admissible,
            "action_valid": valid,
            "won": self._score == 1.0,
            "score": float(self._score),
            "goal": _copy_goal(self._goal),
            "synthetic": self.catalogue.synthetic,
            "page": self._kind,
            # WebShop's own get_available_actions(), for prompts written against it
            "available_actions": {"has_search_bar": has_search_bar, "clickables": clickables},
        }
        # The placeholder stays in admissible_actions (verl-agent's list, which prompts quote);
        # random rollouts draw from concrete searches built from the instruction instead.
        info["suggested_actions"] = [
            a for c in admissible for a in (self._searches() if c == SEARCH_ACTION else [c])
        ]
        if self._reward_info is not None:
            info["reward_info"] = dict(self._reward_info)
        return info

    def _searches(self) -> list[str]:
        """Searches a random rollout can type: the goal's instruction (what it reads on the
        page) and its first clause (the product words before ``with``/``,``)."""
        instruction = self._goal["instruction_text"].lower()
        head = re.split(r",| with | and price ", instruction, maxsplit=1)[0].strip()
        head = re.sub(r"^(i (would like|want|need|am looking for)|find me|get me)\s+", "", head)
        return list(dict.fromkeys(f"search[{q}]" for q in (head, instruction) if q))

    # -- dynamics (web_agent_text_env.step + SimServer.receive) ----------------------------------
    def _invalid(self, action: str, why: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs = f"Invalid action {describe_action(action)}: {why}"
        return obs, self.invalid_action_reward, False, self._info(valid=False)

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        name, arg = parse_action(action)
        if arg is None:
            return self._invalid(
                action, "use search[<query>] or click[<button, product id or option>]."
            )
        arg = arg.lower()
        if name == "search":
            if not self.search_anywhere and self._kind != SEARCH:
                return self._invalid(action, "no search bar here; click[back to search] first.")
            self._search(arg)
            return self._render(), 0.0, False, self._info(valid=True)
        if name != "click":
            return self._invalid(action, "actions are search[...] or click[...].")
        if arg == pages.SEARCH_BUTTON:
            return self._invalid(action, "type the query instead: search[<your query>].")
        clickables, option_group = self._clickables()
        if arg not in clickables:
            return self._invalid(action, "that is not clickable on this page.")
        if arg == pages.BUY_NOW:
            return self._buy()
        self._click(arg, option_group)
        return self._render(), 0.0, False, self._info(valid=True)

    def _search(self, query: str) -> None:
        self._kind, self._query, self._page, self._asin, self._sub = RESULTS, query, 1, None, None
        self._options = {}
        self._results = self.search_engine.search(query)

    def _click(self, arg: str, option_group: dict[str, str]) -> None:
        kind = self._kind
        if arg == pages.BACK_TO_SEARCH:
            self._to_search_page()
        elif arg == pages.NEXT_PAGE and kind == RESULTS:
            self._page += 1
        elif arg == pages.PREV_PAGE and kind == RESULTS:
            self._page -= 1
        elif arg == pages.PREV_PAGE and kind == SUB:
            self._kind, self._sub = ITEM, None
        elif arg == pages.PREV_PAGE and kind == ITEM:
            # back to the results page it came from; WebShop's search_results clears the options
            self._kind, self._asin, self._options = RESULTS, None, {}
        elif arg in pages.SUB_PAGES and kind == ITEM:
            self._kind, self._sub = SUB, arg
        elif kind == RESULTS:  # a product link
            self._kind, self._asin = ITEM, arg.upper()
        else:  # an option value on the item page
            self._options[option_group[arg]] = arg

    def _buy(self) -> tuple[str, float, bool, dict[str, Any]]:
        asin = self._asin
        score, reward_info = webshop_reward(
            self._product,
            self._goal,
            price=self.catalogue.product_prices[asin],
            options=dict(self._options),
            noun_extractor=self.noun_extractor,
        )
        self._score, self._reward_info = float(score), reward_info
        self._kind, self._sub = DONE, None
        if self.reward_mode == "raw":
            reward = self._score
        else:
            reward = self.success_reward if self._score == 1.0 else 0.0
        return self._render(), reward, True, self._info(valid=True)
