"""Sokoban: push every box onto a target, in verl-agent's text symbols.

:class:`SokobanEnv` is the env (``AgentGym/Sokoban-v0`` and its size variants). Rooms come
from our numpy port of gym-sokoban's generator (:mod:`.generator`), or from a pre-generated
room cache for large rooms (:mod:`.cache`, ``python -m agentgym.envs.sokoban.cache``).
"""

from agentgym.envs.sokoban.cache import RoomCache, build_room_cache, load_room_cache
from agentgym.envs.sokoban.env import ACTIONS, SokobanEnv, parse_room, render_room_rgb
from agentgym.envs.sokoban.generator import GenerationError, Room, generate_room
from agentgym.family import FamilySpec, JudgeSpec, PromptTemplate

__all__ = [
    "FAMILY",
    "ACTIONS",
    "SokobanEnv",
    "parse_room",
    "render_room_rgb",
    "Room",
    "generate_room",
    "GenerationError",
    "RoomCache",
    "build_room_cache",
    "load_room_cache",
]

_RULES = (
    "You are an expert agent operating in the Sokoban environment.\n\n"
    "# Symbols and Their Meaning\n"
    "- Walls (`#`): These block movement. You can't move through or push anything into walls.\n"
    "- Floor (`_`): Open spaces where you can walk and move boxes.\n"
    "- Targets (`O`): The spots where boxes need to go.\n"
    "- Boxes (`X`): These are what you need to push onto the targets.\n"
    "- Player (`P`): That's you! You'll move around the grid to push boxes.\n"
    "- Box on Target (`\u221a`): A box successfully placed on a target.\n"
    "- Player on Target (`S`): You standing on a target.\n\n"
    "# Your Goal\n"
    "Your goal is to push all the boxes (`X`) onto the target spots (`O`). Once all boxes are "
    "on the targets, you win!\n\n"
    "# Rules\n"
    "You can only push boxes. You can't pull them, so plan ahead to avoid getting stuck.\n"
    "You can't walk through or push boxes into walls (`#`).\n"
    "To avoid traps, do not push boxes into corners or against walls where they can't be moved "
    "again.\n\n"
    "# Current Step\n"
)

#: What shared code asks of Sokoban: verl-agent's Sokoban prompt (rules, then the room, the four
#: moves listed); a rule judge on ``info["score"]``, the share of boxes on targets (a round
#: scores 1 when it put a box on a target for the first time).
FAMILY = FamilySpec(
    prompt=PromptTemplate(
        first=_RULES
        + "Your current observation is:\n{observation}\n{admissible_line}\n{instruction}\n",
        later=_RULES
        + (
            "Prior to this step, you have already taken {step_count} step(s). Below are the most "
            "recent {history_length} observations and the corresponding actions you took:\n"
            "{history}\nYou are now at step {current_step} and your current observation is:\n"
            "{observation}\n{admissible_line}\n{instruction}\n"
        ),
        admissible_line="Your admissible actions are [{actions}].\n",
        admissible_style="json",
        default_admissible=("up", "down", "left", "right"),
        instructions=(
            (
                "think_action",
                "Now it's your turn to make a move (choose ONE action only for the current "
                "step).\nYou should first reason step-by-step about the current situation - "
                "observe the positions of boxes and targets, plan a path to push a box toward a "
                "target, and avoid traps like corners or walls. This reasoning process MUST be "
                "enclosed within <think> </think> tags.\nOnce you've finished your reasoning, you "
                "should choose an admissible action for current step and present it within "
                "<action> </action> tags.",
            ),
        ),
    ),
    rule_judge=JudgeSpec("progress", {"key": "score"}),
)
