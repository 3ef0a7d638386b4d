"""Chat templates of the models users train, played turn by turn (agentgym.integrations.chat).

The templates are the public Jinja strings of Qwen2.5, Qwen3 (thinking, and Instruct-2507),
Llama 3.1/3.2, Gemma 3, Phi-3.5 and Mistral v0.3 (``templates/``, sources in its README),
applied with a real BPE tokenizer: SmolLM2-135M-Instruct's, given each model's special tokens
(as that model's own tokenizer has them). In every mode the sequences trained must be exactly
the prompts the model saw and the ids it sampled, with the loss mask on exactly those ids.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentgym.integrations.chat import EPISODE, PER_TURN, ChatTurns
from agentgym.integrations.verl import EpisodeRunner, build_dataset, episode_spec
from agentgym.wrappers.llm import make_llm_env

TEMPLATES = Path(__file__).parent / "templates"
ENV_ID = "AgentGym/Corridor-v0"
LIGHT = re.compile(r"Light comes through the (\w+) door")

#: name -> (template file, special tokens of the model, template kwargs, expected mode).
#: ``end`` are turn-ending tokens besides EOS (the models' generation configs list them).
#: Llama 3.x keeps earlier turns, but under SmolLM2's BPE the header's trailing "\n\n" merges
#: with the reply's first characters, so its generation prompt is not a token prefix of the
#: reply: the probe sees that and plays it per turn.
CASES = {
    "qwen2_5": ("qwen2_5", {"eos": "<|im_end|>"}, {}, EPISODE),
    "qwen3": ("qwen3", {"eos": "<|im_end|>", "added": ["<think>", "</think>"]}, {}, PER_TURN),
    "qwen3_no_thinking": (
        "qwen3",
        {"eos": "<|im_end|>", "added": ["<think>", "</think>"]},
        {"enable_thinking": False},
        PER_TURN,
    ),
    "qwen3_instruct_2507": ("qwen3_instruct_2507", {"eos": "<|im_end|>"}, {}, EPISODE),
    "llama3_1": (
        "llama3_1",
        {
            "bos": "<|begin_of_text|>",
            "eos": "<|eot_id|>",
            "special": ["<|start_header_id|>", "<|end_header_id|>"],
        },
        {},
        PER_TURN,
    ),
    "llama3_2": (
        "llama3_2",
        {
            "bos": "<|begin_of_text|>",
            "eos": "<|eot_id|>",
            "special": ["<|start_header_id|>", "<|end_header_id|>"],
        },
        {},
        PER_TURN,
    ),
    "gemma3": (
        "gemma3",
        {
            "bos": "<bos>",
            "eos": "<eos>",
            "special": ["<start_of_turn>", "<end_of_turn>"],
            "end": ["<end_of_turn>"],
        },
        {},
        EPISODE,
    ),
    "phi3_5": (
        "phi3_5",
        {
            "eos": "<|endoftext|>",
            "special": ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"],
            "end": ["<|end|>"],
        },
        {},
        EPISODE,
    ),
    "mistral_v0_3": (
        "mistral_v0_3",
        {"bos": "<s>", "eos": "</s>", "special": ["[INST]", "[/INST]"]},
        {},
        EPISODE,
    ),
}


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def template_tokenizer(base, name: str):
    """``(tokenizer, end_ids, template kwargs, expected mode)`` for case ``name``."""
    file, tokens, kwargs, mode = CASES[name]
    tok = copy.deepcopy(base)
    special = {"eos_token": tokens["eos"]}
    if "bos" in tokens:
        special["bos_token"] = tokens["bos"]
    if tokens.get("special"):
        special["additional_special_tokens"] = tokens["special"]
    tok.add_special_tokens(special)
    if tokens.get("added"):
        tok.add_tokens(tokens["added"])  # Qwen3's <think> tags are added, not special, tokens
    tok.chat_template = (TEMPLATES / f"{file}.jinja").read_text()
    end_ids = [tok.convert_tokens_to_ids(t) for t in tokens.get("end", [])]
    return tok, end_ids, kwargs, mode


@pytest.mark.parametrize("name", list(CASES))
def test_probe_finds_each_templates_mode(smollm2_tokenizer, name, caplog):
    tok, end_ids, kwargs, expected = template_tokenizer(smollm2_tokenizer, name)
    with caplog.at_level(logging.INFO, logger="agentgym.integrations.chat"):
        chat = ChatTurns(tok, template_kwargs=kwargs, end_ids=end_ids)
    assert chat.mode == expected, chat.reason
    assert chat.prefix_preserving == (expected == EPISODE)
    assert f"{expected} mode" in caplog.text  # the mode that runs is logged


class RecordingServer:
    """Stand-in for verl's LLM server, answering the light's door in the think/action format
    (the corridor's hint, read from the last observation in the prompt), as token ids that a
    model could sample but a re-encode of the text would not give (the action word split into
    single characters), ended by the template's end-of-turn token. Records every call."""

    def __init__(self, tokenizer, end_id: int):
        self.tokenizer, self.end_id, self.calls = tokenizer, end_id, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        text = self.tokenizer.decode(prompt_ids)
        found = LIGHT.findall(text)
        door = found[-1] if found else "back"
        encode = self.tokenizer.encode
        ids = encode("<think>go where the light is</think> <action>", add_special_tokens=False)
        ids += [t for ch in door for t in encode(ch, add_special_tokens=False)]
        ids += encode("</action>", add_special_tokens=False) + [self.end_id]
        self.calls.append((list(prompt_ids), list(ids)))
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids))


def play(runner, row):
    return asyncio.run(runner.run({"temperature": 1.0}, **episode_spec(row)))


@pytest.fixture(scope="module")
def row():
    return build_dataset(ENV_ID, 1, first_seed=3)[0]


@pytest.mark.parametrize("forced", [None, EPISODE])
@pytest.mark.parametrize("name", list(CASES))
def test_episode_runner_trains_exactly_the_sampled_ids(smollm2_tokenizer, row, name, forced):
    """Every mode: each trained sequence is a prompt the server was sent plus the ids it
    returned, with the mask on exactly those ids; per turn, prompts are the template's own
    rendering of the conversation so far. ``forced=episode`` is how verl's agent loop plays."""
    tok, end_ids, kwargs, mode = template_tokenizer(smollm2_tokenizer, name)
    chat = ChatTurns(tok, template_kwargs=kwargs, end_ids=end_ids)
    end_id = chat.turn_end_id or (end_ids[0] if end_ids else tok.eos_token_id)
    server = RecordingServer(tok, end_id)
    options = dict(chat_template_kwargs=kwargs, end_ids=end_ids, fmt="think_action")
    runner = EpisodeRunner(
        tok, server, prompt_length=4096, response_length=4096, mode=forced or "auto", **options
    )
    assert runner.mode == (forced or mode)
    episode = play(runner, row)
    assert episode.mode == runner.mode
    assert episode.won and episode.num_turns == len(server.calls) >= 2
    sequences = episode.sequences()
    if runner.mode == EPISODE:
        assert len(sequences) == 1
        seq = sequences[0]
        for (start, end), (sent, sampled) in zip(episode.turn_spans, server.calls, strict=True):
            assert sent == seq["prompt_ids"] + seq["response_ids"][:start]  # trained = seen
            assert seq["response_ids"][start:end] == sampled
        ones = [p for p, m in enumerate(seq["response_mask"]) if m]
        assert ones == [p for s, e in episode.turn_spans for p in range(s, e)]
        assert [seq["response_logprobs"][p] for p in ones] == [-0.5] * len(ones)
    else:
        assert len(sequences) == len(server.calls)
        for t, (seq, (sent, sampled)) in enumerate(zip(sequences, server.calls, strict=True)):
            assert seq["prompt_ids"] == sent and seq["response_ids"] == sampled
            assert seq["response_mask"] == [1] * len(sampled)
            assert seq["response_logprobs"] == [-0.5] * len(sampled)
            # the template's own rendering of the conversation so far
            assert sent == chat.render(conversation(episode.turn_texts[:t], row), True)


def conversation(turn_texts: list[str], row: dict) -> list[dict]:
    """The chat after ``turn_texts`` were played from ``row``'s task, replayed in a fresh env."""
    env = make_llm_env(ENV_ID, fmt="think_action", history_length=0)  # as the runner plays
    obs, _ = env.reset(seed=episode_spec(row)["seed"])
    messages = [{"role": "user", "content": obs}]
    for text in turn_texts:
        obs, *_ = env.step(text)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
    env.close()
    return messages


def test_a_template_without_a_known_turn_end_says_what_to_do(smollm2_tokenizer):
    """Phi-3.5 ends turns with <|end|>, not its EOS: without that id, episodes cannot be played
    as one sequence, and the error says how to play them."""
    tok, _, kwargs, _ = template_tokenizer(smollm2_tokenizer, "phi3_5")
    chat = ChatTurns(tok, template_kwargs=kwargs)
    assert chat.mode == PER_TURN and chat.turn_end_id is None
    with pytest.raises(ValueError, match=r"mode='per_turn'.*end_ids") as info:
        chat.observation_ids("next observation")
    assert "\n" not in str(info.value)


def test_trl_rollout_keeps_sampling_and_training_sequences_equal(smollm2_tokenizer, smollm2_path):
    """TRL's rollout_func with the real SmolLM2 model and Qwen3's template (which re-renders
    earlier turns): one sequence per episode, whose model tokens have, in the trained sequence,
    exactly the log-probs they were sampled with."""
    pytest.importorskip("trl")
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, GenerationConfig

    from agentgym.integrations.trl import GroupRollout
    from agentgym.integrations.trl import build_dataset as trl_dataset

    tok, end_ids, kwargs, _ = template_tokenizer(smollm2_tokenizer, "qwen3")
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.train()
    torch.manual_seed(0)
    trainer = SimpleNamespace(
        processing_class=tok,
        model=model,
        model_wrapped=model,
        accelerator=Accelerator(cpu=True),
        num_generations=2,
        num_generations_eval=2,
        generation_config=GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=[tok.eos_token_id],
        ),
        max_completion_length=64,
        eos_token_ids=end_ids,
        chat_template_kwargs=kwargs,
        use_vllm=False,
    )
    env_kwargs = {"length": 2, "num_doors": 2, "max_episode_steps": 3}
    rollout = GroupRollout(ENV_ID, env_kwargs, fmt="plain", max_turn_tokens=6, max_turns=2)
    prompts = list(trl_dataset(ENV_ID, 1, env_kwargs=env_kwargs)["prompt"]) * 2
    try:
        out = rollout(prompts, trainer)
    finally:
        rollout.close()
    assert rollout.mode == EPISODE and rollout.prefix_preserving is False
    assert all(len(spans) == 2 for spans in out["turn_spans"])  # an observation between turns
    model.eval()
    for p, c, m, lp, spans in zip(
        out["prompt_ids"],
        out["completion_ids"],
        out["env_mask"],
        out["logprobs"],
        out["turn_spans"],
        strict=True,
    ):
        assert [i for i, v in enumerate(m) if v] == [i for s, e in spans for i in range(s, e)]
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
        own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
        at = torch.tensor(m, dtype=torch.bool)
        assert torch.allclose(own[at], torch.tensor(lp)[at], atol=1e-3)
