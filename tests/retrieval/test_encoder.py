"""The encoder: E5 prefixes, mean pooling over the mask, unit norms, batching, loading rules.

Runs the real sentence-transformers path on a tiny randomly initialised BERT built offline
(``tiny_encoder_dir``), and the real pretrained MiniLM when ../shared/data has it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentgym.retrieval.encoder import E5_PREFIXES, Encoder, EncoderNotFoundError
from agentgym.retrieval.synthetic import synthetic_corpus

TEXTS = [
    "who founded the town",
    "a much longer passage about a river that is first mapped in some year and flows far",
    "x",
    "Teleria",
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir) -> Encoder:
    return Encoder(tiny_encoder_dir, device="cpu", batch_size=2)


def _manual_mean_pool(model_dir, texts: list[str]) -> np.ndarray:
    """E5's pooling written out in torch: mean of the last hidden states over the mask."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_shapes_dtype_unit_norm(encoder):
    q = encoder.encode_queries(TEXTS)
    assert q.shape == (4, 64) and q.dtype == np.float32 and q.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert encoder.encode_passages([]).shape == (0, 64)


def test_mean_pooling_equals_manual_torch(encoder, tiny_encoder_dir):
    # texts of very different lengths: padding must not leak into the mean
    expected = _manual_mean_pool(tiny_encoder_dir.parent / "raw", TEXTS)
    no_prefix = Encoder(tiny_encoder_dir, device="cpu", prefixes=False)
    np.testing.assert_allclose(no_prefix.encode_passages(TEXTS), expected, atol=1e-5)


def test_plain_transformers_folder_gets_mean_pooling(tiny_encoder_dir):
    raw = tiny_encoder_dir.parent / "raw"  # no sentence-transformers config
    plain = Encoder(raw, device="cpu", prefixes=False)
    np.testing.assert_allclose(
        plain.encode_queries(TEXTS), _manual_mean_pool(raw, TEXTS), atol=1e-5
    )


def test_prefixes(tiny_encoder_dir, encoder):
    # this folder's name has no "e5": no prefixes by default
    assert (encoder.query_prefix, encoder.passage_prefix) == ("", "")
    e5 = Encoder(tiny_encoder_dir, device="cpu", prefixes=True)
    assert (e5.query_prefix, e5.passage_prefix) == E5_PREFIXES == ("query: ", "passage: ")
    np.testing.assert_allclose(
        e5.encode_queries(TEXTS), encoder.encode_passages(["query: " + t for t in TEXTS]), atol=1e-5
    )
    np.testing.assert_allclose(
        e5.encode_passages(TEXTS),
        encoder.encode_queries(["passage: " + t for t in TEXTS]),
        atol=1e-5,
    )
    assert not np.allclose(e5.encode_queries(TEXTS), e5.encode_passages(TEXTS), atol=1e-3)
    custom = Encoder(tiny_encoder_dir, device="cpu", prefixes=("Q: ", "P: "))
    np.testing.assert_allclose(
        custom.encode_queries(TEXTS), encoder.encode_queries(["Q: " + t for t in TEXTS]), atol=1e-5
    )


def test_e5_name_turns_prefixes_on(tiny_encoder_dir, tmp_path):
    e5_dir = tmp_path / "my-e5-small"
    e5_dir.symlink_to(tiny_encoder_dir, target_is_directory=True)
    assert (Encoder(e5_dir, device="cpu").query_prefix) == "query: "
    assert Encoder(e5_dir, device="cpu", prefixes=False).query_prefix == ""


def test_batching_invariance(tiny_encoder_dir):
    texts = [r["contents"] for r in synthetic_corpus(37, seed=4)]
    one = Encoder(tiny_encoder_dir, device="cpu", batch_size=1).encode_passages(texts)
    many = Encoder(tiny_encoder_dir, device="cpu", batch_size=16).encode_passages(texts)
    np.testing.assert_allclose(one, many, atol=1e-5)
    # and each text's vector does not depend on its neighbours
    np.testing.assert_allclose(
        Encoder(tiny_encoder_dir, device="cpu").encode_passages(texts[::-1])[::-1], one, atol=1e-5
    )


def test_truncates_at_max_length(tiny_encoder_dir):
    enc = Encoder(tiny_encoder_dir, device="cpu", max_length=8)
    long = "teleria river town " * 100
    np.testing.assert_allclose(
        enc.encode_passages([long]), enc.encode_passages([long + " ostmark varland"]), atol=1e-6
    )


def test_hub_name_not_offline_says_pass_a_folder():
    with pytest.raises(EncoderNotFoundError, match="local folder"):
        Encoder("agentgym-tests/no-such-e5-model", device="cpu")


def test_missing_folder(tmp_path):
    with pytest.raises(EncoderNotFoundError, match="not found"):
        Encoder(tmp_path / "nope", device="cpu")
    with pytest.raises(EncoderNotFoundError, match="holds no model"):
        Encoder(tmp_path, device="cpu")


def test_one_string_is_refused(encoder):
    with pytest.raises(TypeError, match="list of texts"):
        encoder.encode_queries("one string")


def test_minilm_real_encoder_ranks_related_text_first(minilm_dir):
    enc = Encoder(minilm_dir, device="cpu")
    assert (enc.query_prefix, enc.passage_prefix) == ("", "") and enc.dim == 384
    passages = [
        "The Nile is a major river in Africa, flowing north into the Mediterranean Sea.",
        "Mozart was a prolific composer of the classical period.",
        "Photosynthesis converts light energy into chemical energy in plants.",
    ]
    q = enc.encode_queries(["which river flows into the Mediterranean?", "who composed music"])
    scores = q @ enc.encode_passages(passages).T
    assert scores.argmax(1).tolist() == [0, 1]
