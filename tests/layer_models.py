"""Tiny HF decoder models from configs (random init, no downloads), an honest port and planted
bugs: the cases of issue #15 (measured in docs/standards.md, "Multi-op values")."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
)

transformers.logging.set_verbosity_error()

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 128, 4, 4, 2, 32, 256, 256
#: 0.1: peaked attention; at 0.02 a q/k swap and at 0.2 a stray bias sit below bf16 noise.
INIT = 0.1
BUG_LAYER = 1
ARCHS = ("llama", "gpt2", "gemma", "qwen2")
#: Two more for the float64 rerun's bar (Phi-3: one fused qkv_proj; Mistral: Llama-like)
MORE_ARCHS = ("mistral", "phi3")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BUGS = ("weight_not_loaded", "stray_bias", "no_causal_mask", "qk_swap")


def config(arch: str) -> Any:
    common: dict[str, Any] = {"vocab_size": VOCAB, "initializer_range": INIT}
    decoder = {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": FFN,
        "max_position_embeddings": 128,
    }
    if arch == "llama":
        return LlamaConfig(head_dim=HEAD_DIM, **decoder, **common)
    if arch == "qwen2":
        return Qwen2Config(**decoder, **common)
    if arch == "gemma":
        return GemmaConfig(head_dim=HEAD_DIM, **decoder, **common)
    if arch == "mistral":
        return MistralConfig(head_dim=HEAD_DIM, sliding_window=None, **decoder, **common)
    if arch == "phi3":  # head_dim derives: 128 / 4 = 32
        return Phi3Config(
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            sliding_window=None,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **decoder,
            **common,
        )
    return GPT2Config(
        n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=128, n_inner=2 * FFN, **common
    )


def _rotaries(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "inv_freq")]


def checkpoint(arch: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """The model in its dtype, as from_pretrained(dtype=...) leaves it (rotary in float32)."""
    torch.manual_seed(seed)
    master = AutoModelForCausalLM.from_config(config(arch), attn_implementation="eager")
    master = master.float().eval()
    model = copy.deepcopy(master).to(dtype)
    for dst, src in zip(_rotaries(model), _rotaries(master), strict=True):
        dst.inv_freq = src.inv_freq.clone()
    return model


def honest_port(model: torch.nn.Module) -> torch.nn.Module:
    """The same low-precision weights computed in float32 (the caller casts outputs back)."""
    port = copy.deepcopy(model).float()
    for rotary in _rotaries(port):
        rotary.inv_freq = rotary.inv_freq.float()
    return port


def inputs(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(seed))


def blocks(model: torch.nn.Module) -> Any:
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def plant(model: torch.nn.Module, bug: str, seed: int = 7) -> None:
    """Plant ``bug`` in block BUG_LAYER of ``model``, in place."""
    g = torch.Generator().manual_seed(seed)
    layer = blocks(model)[BUG_LAYER]
    gpt2 = hasattr(layer, "attn")
    with torch.no_grad():
        if bug == "weight_not_loaded":  # the projection keeps a fresh random init
            w = layer.mlp.c_proj.weight if gpt2 else layer.mlp.down_proj.weight
            w.copy_((torch.randn(w.shape, generator=g) * INIT).to(w.dtype))
        elif bug == "stray_bias":  # a bias that should not be there (nn.Linear's default init)
            lin = layer.mlp.c_proj if gpt2 else layer.self_attn.o_proj
            n_in = lin.weight.shape[0] if gpt2 else lin.weight.shape[1]
            extra = (torch.rand(HIDDEN, generator=g) * 2 - 1) / math.sqrt(n_in)
            if gpt2:
                lin.bias.copy_((lin.bias.double() + extra.double()).to(lin.bias.dtype))
            else:
                lin.bias = torch.nn.Parameter(extra.to(lin.weight.dtype))
        elif bug == "qk_swap":  # the first head's q and k rows exchanged (a wrong fused split)
            if gpt2:
                w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias
                hd = HIDDEN // HEADS
                q, k = w[:, :hd].clone(), w[:, HIDDEN : HIDDEN + hd].clone()
                w[:, :hd], w[:, HIDDEN : HIDDEN + hd] = k, q
                qb, kb = b[:hd].clone(), b[HIDDEN : HIDDEN + hd].clone()
                b[:hd], b[HIDDEN : HIDDEN + hd] = kb, qb
            elif hasattr(layer.self_attn, "qkv_proj"):  # fused: q rows first, then k, then v
                w, hd = layer.self_attn.qkv_proj.weight, layer.self_attn.head_dim
                q, k = w[:hd].clone(), w[HIDDEN : HIDDEN + hd].clone()
                w[:hd], w[HIDDEN : HIDDEN + hd] = k, q
            else:
                at = layer.self_attn
                hd = at.head_dim
                q, k = at.q_proj.weight[:hd].clone(), at.k_proj.weight[:hd].clone()
                at.q_proj.weight[:hd], at.k_proj.weight[:hd] = k, q
                if at.q_proj.bias is not None:
                    qb, kb = at.q_proj.bias[:hd].clone(), at.k_proj.bias[:hd].clone()
                    at.q_proj.bias[:hd], at.k_proj.bias[:hd] = kb, qb
        elif bug == "no_causal_mask":
            attn = layer.attn if gpt2 else layer.self_attn

            def drop(_m: Any, args: Any, kwargs: dict[str, Any]) -> Any:
                return args, {**kwargs, "attention_mask": None}

            attn.register_forward_pre_hook(drop, with_kwargs=True)
        else:
            raise ValueError(bug)


def variant(arch: str, dtype: torch.dtype, which: str) -> torch.nn.Module:
    """``golden``: the checkpoint in its dtype; ``port``: the honest port; a bug name: the
    honest port with that bug in block 1."""
    model = checkpoint(arch, dtype)
    if which == "golden":
        return model
    port = honest_port(model)
    if which != "port":
        plant(port, which)
    return port
