"""Tiny random-init HF models shared by the output-level tests (built once per module)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def tiny_llama() -> Any:
    """A 2-layer Llama with a 256-token vocabulary, random init (no download). The init range
    is wide so greedy generation wanders instead of looping, as a trained model's would."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,
    )
    return transformers.LlamaForCausalLM(config).eval()
