"""Train on an agentgym env with TRL's GRPOTrainer, agentgym playing the episodes (rollout_func).

:class:`agentgym.integrations.trl.GroupRollout` plays each prompt's ``num_generations``
generations with the library's engine (:class:`agentgym.engine.RolloutEngine`; one group, same
task, same initial state), generating every turn with the trainer's model, and hands TRL one multi-turn completion
per generation: model tokens (trained) and env tokens (masked out by ``env_mask``). The reward
is the episode's return; each completion also carries the ``state_key`` of every turn.

Run (no downloads: a tiny randomly initialised Qwen2 that knows the reply format but not the
task, on the corridor env, on CPU)::

    python examples/trl_rollout_func.py

It learns the corridor in about two minutes on two CPU cores (mean episode return, 10 for a
win: about 2 over the first 30 steps, about 9.9 over the last 30 of 120).

With a real model (a local folder or a hub name your machine can reach)::

    python examples/trl_rollout_func.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --env AgentGym/Sokoban-v0 --fmt think_action --max-turn-tokens 256 --max-steps 200
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Any

# The tiny model's builder lives with the reference trainer; make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

from agentgym.integrations.trl import GroupRollout, build_dataset, env_return_reward  # noqa: E402

TINY_ENV_KWARGS: dict[str, Any] = {
    "length": 2,
    "num_doors": 2,
    "list_doors": False,
    "max_episode_steps": 2,
}
TINY_INSTRUCTION = "Say one door.\n"


def tiny_model(
    env_id: str, env_kwargs: dict[str, Any], *, seed: int = 0, warmup_steps: int = 30
) -> tuple[Any, Any]:
    """A tiny Qwen2 and word-level tokenizer over the env's text; built offline.

    Every action word is one token. A short supervised warm-up teaches the random model the
    reply format (one admissible action word, then ``<|im_end|>``) with uniformly random
    actions, so it acts validly from the first GRPO step without knowing which door is right.
    """
    from trl_environment_factory import warm_up_format

    from trainers.gigpo.tiny import build_model, build_tokenizer

    rng = random.Random(seed)
    env = gym.make(env_id, disable_env_checker=True, **env_kwargs)
    texts, chats, actions = [], [], set()
    for episode in range(8):
        obs, info = env.reset(seed=10_000 + seed + episode)
        chat = [{"role": "user", "content": TINY_INSTRUCTION + obs}]
        for _ in range(6):
            texts.append(obs)
            chats.append(list(chat))
            admissible = info.get("admissible_actions") or ["look"]
            actions.update(admissible)
            action = rng.choice(admissible + ["<invalid>"])
            obs, _, terminated, truncated, info = env.step(action)
            chat += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
            if terminated or truncated:
                break
    env.close()
    tokenizer = build_tokenizer(texts + [TINY_INSTRUCTION] + sorted(actions))
    model = build_model(tokenizer, seed=seed)
    contexts = [
        list(tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False))[-24:]
        for c in chats
    ]
    eos = tokenizer.eos_token_id
    targets = [[tokenizer.convert_tokens_to_ids(a), eos] for a in sorted(actions)]
    warm_up_format(model, tokenizer, contexts, targets, steps=warmup_steps, seed=seed)
    return model, tokenizer


def build(
    argv: list[str] | None = None,
    reward_funcs: list[Any] | None = None,
    callbacks: list[Any] | None = None,
) -> tuple[Any, GroupRollout]:
    """The trainer and its rollout function, from command-line arguments.

    ``reward_funcs`` are added after the env return with weight 0 (logged, not trained on);
    ``callbacks`` are ``transformers.TrainerCallback`` s. With the tiny model, torch runs on
    one thread from here on: its ops are too small to split, extra threads only wait.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="AgentGym/Corridor-v0")
    parser.add_argument("--model", default="tiny", help="'tiny' (offline) or a model path/name")
    parser.add_argument("--fmt", default=None, help="action format (tiny: plain)")
    parser.add_argument("--num-tasks", type=int, default=64)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="rollouts per step")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--max-turn-tokens", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--output-dir", default="runs/trl_rollout_func")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    extra_rewards = list(reward_funcs or [])

    from trl import GRPOConfig, GRPOTrainer

    tiny = args.model == "tiny"
    env_kwargs = TINY_ENV_KWARGS if tiny and args.env == "AgentGym/Corridor-v0" else {}
    if tiny:
        torch.set_num_threads(1)
        model, tokenizer = tiny_model(args.env, env_kwargs, seed=args.seed)
        instruction, fmt = TINY_INSTRUCTION, args.fmt or "plain"
    else:
        from transformers import AutoTokenizer

        model, tokenizer = args.model, AutoTokenizer.from_pretrained(args.model)
        instruction, fmt = None, args.fmt or "think_action"

    rollout = GroupRollout(
        args.env,
        env_kwargs,
        fmt=fmt,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        format_instruction=not tiny,  # the tiny model reads only the room text
    )
    dataset_kwargs = {"instruction": instruction} if instruction is not None else {}
    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr if args.lr is not None else (3e-3 if tiny else 1e-6),
        beta=0.0,
        reward_weights=[1.0] + [0.0] * len(extra_rewards),
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_return_reward, *extra_rewards],
        args=config,
        train_dataset=build_dataset(
            args.env, args.num_tasks, env_kwargs=env_kwargs, **dataset_kwargs
        ),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=callbacks,
    )
    return trainer, rollout


def main(argv: list[str] | None = None) -> None:
    trainer, rollout = build(argv)
    try:
        trainer.train()
    finally:
        rollout.close()
    history = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    k = max(1, len(history) // 4)
    print(
        f"steps: {len(history)}; mean reward of the first {k}: {sum(history[:k]) / k:.2f}, "
        f"of the last {k}: {sum(history[-k:]) / k:.2f}"
    )


if __name__ == "__main__":
    main()
