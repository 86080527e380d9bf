"""Tiny random-init HF models and planted bugs for the diagnose tests (no downloads)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

VOCAB = 256


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    """A 2-layer causal LM of ``kind`` (llama, gpt2, gemma2, moe), random init, eval mode. The
    init range is wide so greedy generation wanders, as a trained model's would."""
    import transformers as tf

    torch.manual_seed(seed)
    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.5,
    }
    if kind == "llama":
        from hf_zoo import wandering_llama

        model = wandering_llama(seed)
    elif kind == "gpt2":
        config = tf.GPT2Config(
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=128,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            **common,
        )
        model = tf.GPT2LMHeadModel(config)
    elif kind == "gemma2":
        config = tf.Gemma2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=128,
            sliding_window=8,
            **{**common, "initializer_range": 0.1},
        )
        model = tf.Gemma2ForCausalLM(config)
    elif kind == "moe":
        config = tf.MixtralConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=128,
            **common,
        )
        model = tf.MixtralForCausalLM(config)
    else:
        raise ValueError(kind)
    model.config._attn_implementation = "eager"
    return model.eval()


def twin(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


#: Per model kind: (the module to plant the kernel bug in, the torch function it breaks).
PLANT: dict[str, tuple[str, str]] = {
    "llama": ("model.layers.1.mlp.act_fn", "silu"),
    "gpt2": ("transformer.h.1.mlp.act", "tanh"),
    "gemma2": ("model.layers.0.mlp.act_fn", "gelu"),
    "moe": ("model.layers.1.self_attn.o_proj", "linear"),
}


class KernelBug(TorchFunctionMode):
    """A broken kernel in one module of one model: while ``module`` runs, the torch function
    named ``func`` returns its output skewed by ``(1 + size * index / n)`` along the last axis.
    Enter it outside the capture (around ``diagnose``), as a patched device kernel would be."""

    def __init__(self, model: torch.nn.Module, module: str, func: str, size: float) -> None:
        super().__init__()
        self.func, self.size, self.inside = func, size, 0
        target = model.get_submodule(module)
        self.handles = [
            target.register_forward_pre_hook(lambda *_: self._enter()),
            target.register_forward_hook(lambda *_: self._leave()),
        ]

    def _enter(self) -> None:
        self.inside += 1

    def _leave(self) -> None:
        self.inside -= 1

    def __torch_function__(
        self,
        func: Any,
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.inside and getattr(func, "__name__", None) == self.func:
            skew = 1 + self.size * torch.arange(out.shape[-1], dtype=out.dtype) / out.shape[-1]
            out = out * skew
        return out

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for h in self.handles:
            h.remove()


@torch.no_grad()
def brute_force_first_tokens(
    golden: torch.nn.Module,
    target: torch.nn.Module,
    ids: torch.Tensor,
    n: int,
    bug: Callable[[], Any] | None = None,
) -> list[int | None]:
    """Greedy tokens of both models by a plain loop of full forwards; the first position per
    row where they differ."""

    def tokens(model: torch.nn.Module, ctx: Callable[[], Any] | None) -> torch.Tensor:
        seq = ids
        for _ in range(n):
            if ctx is None:
                logits = model(seq).logits
            else:
                with ctx():
                    logits = model(seq).logits
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
        return seq[:, ids.shape[1] :]

    g, t = tokens(golden, None), tokens(target, bug)
    out: list[int | None] = []
    for a, b in zip(g.tolist(), t.tolist(), strict=True):
        out.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None))
    return out
