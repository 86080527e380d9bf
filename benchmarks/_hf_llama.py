"""The HF ``transformers`` Llama the capture benchmark runs (issue #13), built the same way in
this environment and in msprobe's: hidden 1024, intermediate 2816, 8 layers, 16 heads,
vocabulary 8192, eager attention, float32, random weights under a fixed seed, one sequence of
256 tokens. Needs only torch and transformers (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import torch

SEED = 0
SEQ = 256
CONFIG = {
    "vocab_size": 8192,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "use_cache": False,
}


def build() -> torch.nn.Module:
    """The model in eval mode (about 135M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**CONFIG, attn_implementation="eager")
    return LlamaForCausalLM(config).eval()


def input_ids(seq: int = SEQ) -> torch.Tensor:
    tokens = torch.Generator().manual_seed(SEED)
    return torch.randint(3, CONFIG["vocab_size"], (1, seq), generator=tokens)


def describe(model: torch.nn.Module, seq: int) -> str:
    params = sum(p.numel() for p in model.parameters())
    return (
        f"HF transformers Llama: {params / 1e6:.0f}M parameters (hidden 1024, intermediate 2816, "
        f"8 layers, 16 heads, vocab 8192), eager attention, fp32, seq {seq}, "
        f"{torch.get_num_threads()} threads"
    )
