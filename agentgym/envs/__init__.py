"""The env registry: one :class:`EnvEntry` per registered id.

Adding a family: create ``agentgym/envs/<family>/`` (or any package) whose ``__init__.py``
exposes the env class (a :class:`agentgym.core.TextEnv` whose ``family`` is the folder's name),
a ``data_status() -> str`` function if it loads real data, and ``FAMILY =``
:class:`agentgym.family.FamilySpec` ``(...)``: its LLM prompt, its rule judge, its trainer
defaults and its data variable. Then add its line to ``ENTRIES`` (or call
``agentgym.register(EnvEntry(...))`` from outside the package). Nothing else needs to change:
``import agentgym`` registers every entry with gymnasium, the LLM wrappers, the judges and the
trainer's presets read the family's ``FAMILY``, and the CLI, the registry-wide tests and the
main rollout job pick it up from here. A new optional dependency still needs its extra in
``pyproject.toml`` (named by the entry's ``extra``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

# re-exported: the registry's errors and hints, defined where every subpackage can import them
from agentgym.extras import DISTRIBUTION as DISTRIBUTION
from agentgym.extras import MissingExtra, install_hint


@dataclass(frozen=True)
class EnvEntry:
    """One registered id: where its env class is, its family, the arguments of its variant and
    its step cap. ``agentgym.register(entry)`` adds one (a new family's registration line):

    >>> import agentgym, gymnasium as gym
    >>> long = EnvEntry("Mine/Corridor-6-v0", "agentgym.envs.corridor:CorridorEnv", "corridor",
    ...                 kwargs={"length": 6}, max_episode_steps=20)
    >>> agentgym.register(long)
    >>> env = gym.make("Mine/Corridor-6-v0")
    >>> env.reset(seed=0)[0].split(".")[0], env.spec.max_episode_steps
    ('Room 1 of 6', 20)
    >>> agentgym.register(long)
    Traceback (most recent call last):
    ValueError: Mine/Corridor-6-v0 is already registered; give the new entry another id
    >>> ENTRIES.remove(long); del gym.registry["Mine/Corridor-6-v0"]  # (undone for the tests)
    """

    id: str
    """gymnasium id, ``AgentGym/<Name>-v<N>``"""
    entry_point: str
    """``module:Class`` of the env"""
    family: str
    """family name: its folder under ``agentgym/envs``, the env class's ``family``; the
    ``FAMILY`` spec is read from the entry point's package"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """constructor arguments that make this id's variant"""
    data_status: str | None = None
    """``module:function`` returning a one-line description of the data found, if the family loads
    real data; None for families that generate their tasks"""
    needs: tuple[str, ...] = ()
    """importable modules the env needs (optional extras); ids whose modules are missing are still
    registered but skipped by the main job and the registry-wide tests"""
    real_data: bool = False
    """True where the id plays real benchmark data that may be absent on this machine"""
    extra: str | None = None
    """the optional extra (``pip install -e ".[EXTRA]"`` in a clone) that installs ``needs``"""
    max_episode_steps: int | None = None
    """the id's step cap, the only copy of it: registered with gymnasium, so ``env.spec``
    reports it and ``gym.make(id, max_episode_steps=N)`` replaces it; the env enforces it
    (:class:`agentgym.core.StepCap`). Env classes have no cap of their own."""

    def missing(self) -> list[str]:
        """The modules of ``needs`` that are not importable here."""
        return [m for m in self.needs if not _importable(m)]

    def available(self) -> bool:
        """Whether the optional packages this id needs are importable here."""
        return not self.missing()

    def check_available(self) -> None:
        """Raise :class:`MissingExtra` (one line naming the extra) if packages are missing."""
        missing = self.missing()
        if missing:
            how = install_hint(self.extra) if self.extra else "install them"
            raise MissingExtra(f"{self.id} needs {', '.join(missing)}, not installed: {how}")

    def make(self, **kwargs: Any) -> Any:
        """Build the env (what gymnasium calls for this id): check the extras, then construct.

        The step cap is not an env argument here: ``gym.make`` sets it (:attr:`max_episode_steps`,
        or ``gym.make``'s ``max_episode_steps``), so a cap passed as an env argument is refused
        with the way to pass it.
        """
        capped = [k for k in CAP_KWARGS if k in kwargs]
        if capped:
            raise ValueError(
                f"{self.id}: the step cap is gymnasium's, not an env argument: call "
                f"gym.make({self.id!r}, max_episode_steps={kwargs[capped[0]]!r}) instead of "
                f"passing {capped[0]}="
            )
        self.check_available()
        module, cls = self.entry_point.split(":")
        return getattr(importlib.import_module(module), cls)(**kwargs)

    def describe_data(self) -> str:
        if self.data_status is None:
            return "generated (no data needed)"
        module, func = self.data_status.split(":")
        try:
            return getattr(importlib.import_module(module), func)()
        except Exception as exc:  # noqa: BLE001 - a status line must never crash `agentgym list`
            return f"unavailable ({type(exc).__name__}: {exc})"


#: Env arguments that set an env's step cap (``max_turns``: SearchQA's deprecated name); the
#: registered entry point refuses them, since ``gym.make``'s ``max_episode_steps`` sets it there.
CAP_KWARGS = ("max_episode_steps", "max_turns")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken module entry
        return False


_ALFWORLD_NEEDS = ("textworld", "alfworld")

ENTRIES: list[EnvEntry] = [
    # --- sokoban: rooms generated by our numpy generator ---------------------------------
    EnvEntry(
        "AgentGym/Sokoban-v0", "agentgym.envs.sokoban:SokobanEnv", "sokoban", max_episode_steps=15
    ),
    EnvEntry(  # larger rooms: more steps to solve, so a longer cap
        "AgentGym/Sokoban-8x8-2box-v0",
        "agentgym.envs.sokoban:SokobanEnv",
        "sokoban",
        kwargs={"dim_room": (8, 8), "num_boxes": 2},
        max_episode_steps=30,
    ),
    EnvEntry(  # 10x10/3 rooms take ~0.1 s each to generate: played from the bundled cache
        "AgentGym/Sokoban-10x10-3box-v0",
        "agentgym.envs.sokoban:SokobanEnv",
        "sokoban",
        kwargs={
            "dim_room": (10, 10),
            "num_boxes": 3,
            "room_cache": "10x10-3box",
        },
        max_episode_steps=50,
    ),
    # --- alfworld: real TextWorld/PDDL games, and synthetic games generated in the domain ---
    EnvEntry(
        "AgentGym/ALFWorld-v0",
        "agentgym.envs.alfworld:ALFWorldEnv",
        "alfworld",
        data_status="agentgym.envs.alfworld:data_status",
        needs=_ALFWORLD_NEEDS,
        real_data=True,
        extra="alfworld",
        max_episode_steps=50,
    ),
    EnvEntry(
        "AgentGym/ALFWorld-Synthetic-v0",
        "agentgym.envs.alfworld:ALFWorldEnv",
        "alfworld",
        kwargs={"synthetic": True},
        needs=_ALFWORLD_NEEDS,
        extra="alfworld",
        max_episode_steps=50,
    ),
    # --- searchqa: Search-R1 question files over a retrieval index or server; a synthetic KB ---
    EnvEntry(
        "AgentGym/SearchQA-v0",
        "agentgym.envs.searchqa:SearchQAEnv",
        "searchqa",
        data_status="agentgym.envs.searchqa:data_status",
        needs=("bm25s", "regex", "pyarrow"),
        real_data=True,
        extra="searchqa",
        max_episode_steps=4,
    ),
    EnvEntry(
        "AgentGym/SearchQA-Synthetic-v0",
        "agentgym.envs.searchqa:SearchQAEnv",
        "searchqa",
        kwargs={"synthetic": True},
        needs=("bm25s", "regex"),
        extra="searchqa",
        max_episode_steps=4,
    ),
    # --- webshop: WebShop's own catalogue files, and a generated shop in their format ---
    EnvEntry(
        "AgentGym/WebShop-v0",
        "agentgym.envs.webshop:WebShopEnv",
        "webshop",
        data_status="agentgym.envs.webshop:data_status",
        needs=("bm25s", "regex", "rapidfuzz"),
        real_data=True,
        extra="webshop",
        max_episode_steps=15,
    ),
    EnvEntry(
        "AgentGym/WebShop-Synthetic-v0",
        "agentgym.envs.webshop:WebShopEnv",
        "webshop",
        kwargs={"synthetic": True},
        needs=("bm25s", "regex", "rapidfuzz"),
        extra="webshop",
        max_episode_steps=15,
    ),
    # --- corridor: a tiny env where step-level credit matters (trainer tests, GiGPO vs GRPO) ---
    EnvEntry(
        "AgentGym/Corridor-v0",
        "agentgym.envs.corridor:CorridorEnv",
        "corridor",
        max_episode_steps=12,  # 2 * length + 4 at the default length 4
    ),
]


def entry(env_id: str) -> EnvEntry:
    """The registry entry of ``env_id``; raises a KeyError listing the known ids otherwise.

    >>> e = entry("AgentGym/Corridor-v0")
    >>> e.family, e.entry_point, e.max_episode_steps, e.available()
    ('corridor', 'agentgym.envs.corridor:CorridorEnv', 12, True)
    """
    for e in ENTRIES:
        if e.id == env_id:
            return e
    known = ", ".join(e.id for e in ENTRIES)
    raise KeyError(f"unknown env id {env_id!r}; registered ids: {known}")
