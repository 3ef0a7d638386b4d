"""Train on agentgym envs with verl: the ``agentgym_agent`` loop and the ``agentgym_gigpo`` estimator.

Two commands:

``demo`` (CPU, offline, no verl cluster): plays groups of Corridor episodes exactly as verl's
agent-loop worker would (through :class:`AgentGymAgentLoop` when verl is installed), generating
with a tiny random Qwen2 behind :class:`LocalHFServer`, a stand-in for verl's LLM server; then
computes GiGPO token advantages and prints, per episode, its turns, reward, model/env token
counts and each turn's advantage::

    python examples/verl_agent_loop.py demo

``data``: writes the dataset verl reads (one row per task seed) and the agent-loop config::

    python examples/verl_agent_loop.py data --env AgentGym/Sokoban-v0 --out ~/data/agentgym

Then a real verl run (GPUs, verl 0.9.x with vLLM or SGLang) launched with verl's own entry point.
The Ray hook registers the loop and the estimator in every verl worker process::

    python -m verl.trainer.main_ppo \\
        data.train_files=$HOME/data/agentgym/train.parquet \\
        data.val_files=$HOME/data/agentgym/val.parquet \\
        data.max_prompt_length=1024 data.max_response_length=4096 \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \\
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \\
        actor_rollout_ref.rollout.n=8 \\
        actor_rollout_ref.rollout.agent.default_agent_loop=agentgym_agent \\
        actor_rollout_ref.rollout.agent.agent_loop_config_path=$HOME/data/agentgym/agent_loop.yaml \\
        actor_rollout_ref.rollout.multi_turn.max_assistant_turns=15 \\
        algorithm.adv_estimator=agentgym_gigpo algorithm.gamma=0.95 \\
        algorithm.norm_adv_by_std_in_grpo=False \\
        +algorithm.gigpo.omega=1.0 +algorithm.gigpo.invalid_penalty=0.1 \\
        trainer.use_v1=False \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=agentgym.integrations.verl.setup_verl_worker

``rollout.n`` rollouts of a row share its seed, so each GiGPO group starts from one task and
state. ``trainer.use_v1=False``: verl 0.9.1's v1 trainer hands estimators a fixed set of fields
that leaves out the per-turn spans and state keys. ``norm_adv_by_std_in_grpo=False`` gives the
paper's ``mean_norm`` (verl's default, True, divides by the group std as well). The agent-loop
config written by ``data`` is::

    - name: agentgym_agent
      _target_: agentgym.integrations.verl.AgentGymAgentLoop
      history_length: 0      # the conversation already holds earlier turns
      max_turn_tokens: 512   # most tokens of one model turn
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import torch

from agentgym.integrations.verl import (
    AGENT_NAME,
    EXTRA_KEYS,
    EpisodeRunner,
    LocalHFServer,
    build_dataset,
    compute_gigpo_advantage,
    episode_spec,
)
from agentgym.io import atomic_path

AGENT_LOOP_YAML = f"""- name: {AGENT_NAME}
  _target_: agentgym.integrations.verl.AgentGymAgentLoop
  history_length: 0
  max_turn_tokens: {{max_turn_tokens}}
"""


def _play_through_verl(rows, tokenizer, server, order, args):
    """Episodes from verl's agent-loop class, built the way verl's worker builds it."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    from agentgym.integrations.verl import setup_verl_worker

    setup_verl_worker()
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": args.prompt_length,
                    "response_length": args.response_length,
                    "multi_turn": {"max_assistant_turns": args.max_turns},
                }
            },
            "data": {},
        }
    )

    async def main():
        loop = hydra.utils.instantiate(
            _agent_loop_registry[AGENT_NAME],
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            hf_model_type=None,
            tools=None,
            max_turn_tokens=args.max_turn_tokens,
            fmt=args.fmt,
        )
        params = {"temperature": 1.0}
        return await asyncio.gather(
            *[loop.run(params, raw_prompt=rows[i]["prompt"], **rows[i]) for i in order]
        )

    outputs = asyncio.run(main())
    return [(o.response_ids, o.response_mask, o.extra_fields) for o in outputs]


def _play_with_runner(rows, tokenizer, server, order, args):
    runner = EpisodeRunner(
        tokenizer,
        server,
        prompt_length=args.prompt_length,
        response_length=args.response_length,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        fmt=args.fmt,
    )

    async def main():
        return await asyncio.gather(
            *[runner.run({"temperature": 1.0}, **episode_spec(rows[i])) for i in order]
        )

    episodes = asyncio.run(main())
    return [(e.response_ids, e.response_mask, e.extra_fields()) for e in episodes]


def demo(args: argparse.Namespace) -> None:
    # Imported here: the tiny model lives with the bundled trainer, an example-only dependency.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from trainers.gigpo.tiny import build_model, build_tokenizer

    rows = build_dataset(args.env, args.tasks, env_kwargs=json.loads(args.env_kwargs))
    tokenizer = build_tokenizer([r["prompt"][0]["content"] for r in rows])
    server = LocalHFServer(build_model(tokenizer), tokenizer, seed=args.seed)
    order = [i for i in range(args.tasks) for _ in range(args.group_size)]
    try:
        played = _play_through_verl(rows, tokenizer, server, order, args)
        how = "verl's agent loop (AgentGymAgentLoop)"
    except ImportError:
        played = _play_with_runner(rows, tokenizer, server, order, args)
        how = "EpisodeRunner (verl is not installed)"

    # What verl's batch holds: padded response_mask and one non_tensor_batch column per field.
    length = args.response_length
    mask = torch.zeros(len(played), length, dtype=torch.int64)
    columns = {key: np.empty(len(played), dtype=object) for key in EXTRA_KEYS}
    for row, (_, response_mask, fields) in enumerate(played):
        mask[row, : len(response_mask)] = torch.tensor(response_mask)
        for key in EXTRA_KEYS:
            columns[key][row] = fields[key]
    uids = np.array([f"task{i}" for i in order], dtype=object)
    advantages, _ = compute_gigpo_advantage(
        torch.zeros(mask.shape),
        mask,
        index=uids,
        non_tensor_batch=columns,
        gamma=0.95,
        norm_adv_by_std_in_grpo=False,  # the paper's mean_norm
    )

    print(f"{len(played)} episodes of {args.env} played through {how}")
    print(f"{'uid':>6} {'turns':>5} {'valid':>5} {'reward':>6} {'model':>5} {'env':>5}  advantages")
    for row, (response_ids, response_mask, fields) in enumerate(played):
        spans = fields["agentgym_turn_spans"]
        per_turn = " ".join(f"{float(advantages[row, s]):+.2f}" for s, _ in spans)
        model_tokens = int(sum(response_mask))
        print(
            f"{uids[row]:>6} {len(spans):>5} {sum(fields['agentgym_turn_valid']):>5} "
            f"{fields['agentgym_episode_reward']:>6.1f} "
            f"{model_tokens:>5} {len(response_ids) - model_tokens:>5}  {per_turn}"
        )


def write_data(args: argparse.Namespace) -> None:
    import pandas as pd

    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = json.loads(args.env_kwargs)
    splits = {
        "train": (args.first_seed, args.num_tasks),
        "val": (args.first_seed + args.num_tasks, args.num_val),
    }
    for name, (first, count) in splits.items():
        rows = build_dataset(
            args.env, count, first_seed=first, split=args.split, env_kwargs=env_kwargs
        )
        with atomic_path(out / f"{name}.parquet") as tmp:  # a kill leaves no half-written file
            pd.DataFrame(rows).to_parquet(tmp)
        print(f"wrote {out / f'{name}.parquet'} ({count} tasks)")
    (out / "agent_loop.yaml").write_text(
        AGENT_LOOP_YAML.format(max_turn_tokens=args.max_turn_tokens)
    )
    print(f"wrote {out / 'agent_loop.yaml'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="play episodes on CPU with a tiny model; print advantages")
    d.add_argument("--env", default="AgentGym/Corridor-v0")
    d.add_argument("--env-kwargs", default='{"length": 2}', help="JSON keywords of gym.make")
    d.add_argument(
        "--fmt", default="plain", help="action format (plain: a random tiny model hits doors)"
    )
    d.add_argument("--tasks", type=int, default=2)
    d.add_argument("--group-size", type=int, default=4)
    d.add_argument("--prompt-length", type=int, default=512)
    d.add_argument("--response-length", type=int, default=600)
    d.add_argument("--max-turns", type=int, default=6)
    d.add_argument("--max-turn-tokens", type=int, default=1)
    d.add_argument("--seed", type=int, default=0)
    w = sub.add_parser("data", help="write train/val parquet and agent_loop.yaml for verl")
    w.add_argument("--env", default="AgentGym/Sokoban-v0")
    w.add_argument("--env-kwargs", default="{}", help="JSON keywords of gym.make")
    w.add_argument("--out", required=True, help="folder for train.parquet, val.parquet, yaml")
    w.add_argument("--num-tasks", type=int, default=1024)
    w.add_argument("--num-val", type=int, default=64)
    w.add_argument("--first-seed", type=int, default=0)
    w.add_argument("--split", default=None, help="the env family's split, where it has them")
    w.add_argument("--max-turn-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    demo(args) if args.command == "demo" else write_data(args)


if __name__ == "__main__":
    main()
