"""Train on an agentgym env with TRL's GRPOTrainer, the env's actions given to the model as a tool.

TRL runs the conversation: the model calls the tool ``act(action)``, TRL executes it on one
:class:`agentgym.integrations.trl.AgentGymEnvironment` per rollout and appends the observation,
until the model stops calling tools; ``get_reward()`` scores the episode. Every row of the
dataset names a task and seed, so all ``num_generations`` rollouts of a prompt play the same
task from the same initial state.

Run (no downloads: a tiny randomly initialised Qwen2 that knows the tool-call format but not
the task, on the corridor env, on CPU)::

    python examples/trl_environment_factory.py

About two to four minutes on two CPU cores. It shows TRL's tool-calling loop playing agentgym
episodes; this tiny model does not learn the task in 60 steps here (the mean episode return
stays near chance, 2.5 of a win's 10: the tool schema makes the prompt long for a model this
small). ``examples/trl_rollout_func.py`` learns the corridor fully.

With a real tool-calling model (a local folder or a hub name your machine can reach)::

    python examples/trl_environment_factory.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --env AgentGym/Sokoban-v0 --max-steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

# The tiny model's builder lives with the reference trainer; make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from agentgym.integrations.trl import (  # noqa: E402
    AgentGymEnvironment,
    EnvironmentFactory,
    build_dataset,
    environment_factory,
)

TINY_ENV_KWARGS: dict[str, Any] = {
    "length": 2,
    "num_doors": 2,
    "list_doors": False,
    "max_episode_steps": 2,
}


def tool_call_text(action: str, tool: str = "act") -> str:
    """A call of ``tool`` as Qwen2.5's chat template renders it inside an assistant turn."""
    arguments = json.dumps({"action": action})
    return f'<tool_call>\n{{"name": "{tool}", "arguments": {arguments}}}\n</tool_call>'


def tiny_tool_model(
    env_id: str, env_kwargs: dict[str, Any], *, seed: int = 0, warmup_steps: int = 30
) -> tuple[Any, Any]:
    """A tiny Qwen2 and tokenizer that call ``act`` in Qwen2.5's tool format; built offline.

    The tokenizer is word-level but keeps whitespace as tokens (so decoding is exact, which
    TRL's tool-call parser needs), uses Qwen2.5's chat template, and makes each complete
    ``<tool_call>`` of an action the env accepts one token. A short supervised warm-up teaches
    the random model the *format* (one tool call, then ``<|im_end|>``) with actions drawn
    uniformly from those a fresh episode admits, so it calls tools from the first GRPO step
    without knowing which action is right.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    from trainers.gigpo.tiny import build_model

    # Texts the run will show the model: prompts, observations, tool calls, tool responses.
    rng = random.Random(seed)
    dataset = build_dataset(env_id, 8, seed=10_000 + seed, env_kwargs=env_kwargs)
    env = AgentGymEnvironment(env_id, env_kwargs)
    conversations, actions, first_actions = [], set(), set()
    for row in dataset:
        messages = [{**row["prompt"][0]}]
        messages[0]["content"] += env.reset(**row)
        first_actions.update(env.info.get("admissible_actions") or ["look"])
        for _ in range(6):
            admissible = env.info.get("admissible_actions") or ["look"]
            actions.update(admissible)
            action = rng.choice(admissible)
            call = {
                "type": "function",
                "function": {"name": "act", "arguments": {"action": action}},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "name": "act", "content": env.act(action)})
            conversations.append(list(messages))
    specials = ["<|endoftext|>", "<|unk|>", "<|im_start|>", "<|im_end|>"]
    calls = [tool_call_text(a) for a in sorted(actions)]

    pieces = r"\w+|[^\w\s]+|\s+"  # every character belongs to a piece: exact round trip
    split = pre_tokenizers.Split(Regex(pieces), behavior="isolated")
    backend = Tokenizer(models.WordLevel(vocab={"<|unk|>": 0}, unk_token="<|unk|>"))
    backend.pre_tokenizer = split
    backend.decoder = decoders.Fuse()
    probe = PreTrainedTokenizerFast(tokenizer_object=backend)
    probe.chat_template = qwen2_5_chat_template
    texts = [
        probe.apply_chat_template(c, tools=[env.act], tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    words: dict[str, int] = {}
    for text in texts:
        for special in specials + calls:
            text = text.replace(special, " ")
        for piece, _ in split.pre_tokenize_str(text):
            words[piece] = words.get(piece, 0) + 1
    vocab = {tok: i for i, tok in enumerate(specials)}
    for w in sorted(words, key=lambda w: (-words[w], w)):
        vocab.setdefault(w, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    backend.pre_tokenizer = split
    backend.decoder = decoders.Fuse()
    backend.add_tokens([AddedToken(c, normalized=False, special=False) for c in calls])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        unk_token="<|unk|>",
        eos_token="<|im_end|>",
        padding_side="left",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = qwen2_5_chat_template
    model = build_model(tokenizer, seed=seed)

    # Format warm-up: after any prompt, one uniformly drawn tool call, then <|im_end|>.
    contexts = []
    for c in conversations:
        for cut in range(1, len(c) + 1, 2):  # the prompt, then after each tool response
            ids = tokenizer.apply_chat_template(
                c[:cut],
                tools=[env.act],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            # the format depends on the last turn only: short contexts make the warm-up cheap
            contexts.append(list(ids)[-24:])
    # the calls a fresh episode admits (the corridor's doors, not `back`)
    openers = tokenizer.convert_tokens_to_ids([tool_call_text(a) for a in sorted(first_actions)])
    targets = [[c, tokenizer.eos_token_id] for c in openers]
    warm_up_format(model, tokenizer, contexts, targets, steps=warmup_steps, seed=seed)
    return model, tokenizer


def warm_up_format(
    model: Any,
    tokenizer: Any,
    contexts: list[list[int]],
    targets: list[list[int]],
    *,
    steps: int = 30,
    batch_size: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
) -> None:
    """Teach ``model`` the reply format: after any context, one of ``targets`` drawn uniformly.

    Supervised steps on (random context, random target) pairs, loss on the target tokens only;
    the target is independent of the context, so the model learns the format, not the task.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows, n_target = [], []
        for _ in range(batch_size):
            ctx = contexts[int(torch.randint(len(contexts), (1,), generator=gen))]
            tgt = targets[int(torch.randint(len(targets), (1,), generator=gen))]
            rows.append(ctx + tgt)
            n_target.append(len(tgt))
        width = max(len(r) for r in rows)
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100)
        for r, (row, k) in enumerate(zip(rows, n_target, strict=True)):
            ids[r, width - len(row) :] = torch.tensor(row)  # left padding, as generation sees it
            mask[r, width - len(row) :] = 1
            labels[r, width - k :] = torch.tensor(row[-k:])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def build(
    argv: list[str] | None = None, callbacks: list[Any] | None = None
) -> tuple[Any, EnvironmentFactory]:
    """The trainer and its environment factory (whose ``episodes`` log every scored rollout, in
    order), from command-line arguments; ``callbacks`` are ``transformers.TrainerCallback`` s.

    With the tiny model, torch runs on one thread from here on: its ops are too small to split,
    and extra threads only wait on each other.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="AgentGym/Corridor-v0")
    parser.add_argument("--model", default="tiny", help="'tiny' (offline) or a model path/name")
    parser.add_argument("--num-tasks", type=int, default=64)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16, help="rollouts per step")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument(
        "--max-tool-calls", type=int, default=None, help="default: 2 (tiny corridor), else 16"
    )
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--output-dir", default="runs/trl_environment_factory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from trl import GRPOConfig, GRPOTrainer

    tiny = args.model == "tiny"
    env_kwargs = TINY_ENV_KWARGS if tiny and args.env == "AgentGym/Corridor-v0" else {}
    if tiny:
        torch.set_num_threads(1)
        model, tokenizer = tiny_tool_model(args.env, env_kwargs, seed=args.seed)
    else:
        from transformers import AutoTokenizer

        model, tokenizer = args.model, AutoTokenizer.from_pretrained(args.model)

    factory = environment_factory(args.env, env_kwargs)
    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls or (2 if tiny else 16),
        learning_rate=args.lr if args.lr is not None else (3e-3 if tiny else 1e-6),
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=build_dataset(args.env, args.num_tasks, env_kwargs=env_kwargs),
        processing_class=tokenizer,
        environment_factory=factory,
        callbacks=callbacks,
    )
    return trainer, factory


def main(argv: list[str] | None = None) -> None:
    trainer, factory = build(argv)
    trainer.train()
    rewards = [e.reward for e in factory.episodes]
    k = max(1, len(rewards) // 4)
    print(
        f"episodes: {len(rewards)}; mean reward of the first {k}: "
        f"{sum(rewards[:k]) / k:.2f}, of the last {k}: {sum(rewards[-k:]) / k:.2f}"
    )


if __name__ == "__main__":
    main()
