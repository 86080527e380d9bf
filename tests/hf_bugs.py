"""Planted bugs and noise cases for the tiny HF models of ``tests/hf_zoo.py``.

A bug patches ONE module instance of a freshly built model (its ``forward``, a weight or a
buffer; never a class, so the golden built next to it stays clean) and returns the dotted path
of the module where it is planted: a correct localization names that module or one inside it.
Every bug lives in decoder layer 1 (or in the shared rotary / position embedding), so that layer
0 and everything before the bug is clean, and compare_dumps has to find the first call that
*added* error rather than the first record that differs.

Applicability is explicit (``Bug.skip``): a bug that does not change what an architecture
computes is left out of the matrix, with the reason:

- GPT-2 has learned absolute positions (``transformer.wpe``), no RoPE: the two RoPE-base bugs do
  not apply; its position offset is planted in ``wpe`` instead of the rotary embedding.
- GPT-2's q and k come out of one fused ``c_attn`` with no rotation: permuting the rows of q and
  k the same way inside a head leaves every q.k product unchanged, so "q/k rows swapped" is not
  a bug there (it is one for every RoPE model, where the rotation pairs dimension i with
  i + d/2).
- GPT-2's projections all have a bias (``Conv1D``): a "stray" bias cannot exist; a wrong bias is
  the "weight not loaded" case.

Noise cases (``NOISE``) change how, not what, the model computes: thread count, an extra no-op
op, the whole model in bf16 against the fp32 golden, a dump against itself. No culprit may be
named on them.

A note on ``position_offset`` in RoPE models: RoPE depends only on the distance between query
and key positions, so shifting every position by one leaves attention unchanged up to rounding;
the shared rotary embedding's cos / sin do differ, and they are what the judge must blame (its
inputs match, its output does not). In GPT-2 the shift changes the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from hf_zoo import HEAD_DIM, HEADS, INIT_STD, KV_HEADS, Arch

#: the layer every layer-local bug is planted in (layer 0 stays clean)
LAYER = 1
#: the wrong RoPE base (the models use 10000)
WRONG_BASE = 5000.0
#: the wrong softmax scale factor
WRONG_SCALE = 1.25


def wrap_forward(
    module: torch.nn.Module, make: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    """Replace ``module``'s forward (this instance only) with ``make(original_forward)``."""
    module.forward = make(module.forward)  # type: ignore[method-assign]


def _layer(model: torch.nn.Module, arch: Arch, sub: str = "") -> tuple[torch.nn.Module, str]:
    path = arch.layer(LAYER) + (f".{sub}" if sub else "")
    return model.get_submodule(path), path


def _inv_freq(rotary: torch.nn.Module, base: float) -> torch.Tensor:
    inv = rotary.inv_freq
    dim = 2 * inv.numel()
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


# -- bugs ------------------------------------------------------------------------------------------


def rope_base_in_one_layer(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention computes its own cos / sin with base 5000 instead of using the shared
    rotary embedding's (base 10000): code only the target runs, inside the attention."""
    assert arch.rotary is not None
    attn, path = _layer(model, arch, arch.attn)
    rotary = model.get_submodule(arch.rotary)
    inv_freq = _inv_freq(rotary, WRONG_BASE)
    scaling = float(getattr(rotary, "attention_scaling", 1.0))

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            position_ids = kwargs["position_ids"]
            cos, _ = kwargs["position_embeddings"]
            freqs = position_ids[..., None].float() * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            kwargs["position_embeddings"] = (
                (emb.cos() * scaling).to(cos.dtype),
                (emb.sin() * scaling).to(cos.dtype),
            )
            return forward(*args, **kwargs)

        return patched

    wrap_forward(attn, make)
    return path


def rope_base_shared(model: torch.nn.Module, arch: Arch) -> str:
    """The shared rotary embedding's ``inv_freq`` buffer holds base 5000's frequencies (a config
    value not loaded): a buffer from nowhere that differs."""
    assert arch.rotary is not None
    rotary = model.get_submodule(arch.rotary)
    with torch.no_grad():
        rotary.inv_freq.copy_(_inv_freq(rotary, WRONG_BASE))
    return arch.rotary


def position_offset(model: torch.nn.Module, arch: Arch) -> str:
    """Positions off by one where they are turned into embeddings: the shared rotary embedding
    (RoPE models) or the learned position embedding (GPT-2's ``wpe``)."""
    path = arch.rotary or "transformer.wpe"
    module = model.get_submodule(path)
    if arch.rotary is not None:

        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            def patched(x: torch.Tensor, position_ids: torch.Tensor, *a: Any, **k: Any) -> Any:
                return forward(x, position_ids + 1, *a, **k)

            return patched

    else:

        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            def patched(position_ids: torch.Tensor) -> Any:
                return forward(position_ids + 1)

            return patched

    wrap_forward(module, make)
    return path


def _mask_bug(transform: Callable[[torch.Tensor], torch.Tensor | None]) -> Callable[..., str]:
    def plant(model: torch.nn.Module, arch: Arch) -> str:
        attn, path = _layer(model, arch, arch.attn)

        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            def patched(*args: Any, **kwargs: Any) -> Any:
                kwargs["attention_mask"] = transform(kwargs["attention_mask"])
                return forward(*args, **kwargs)

            return patched

        wrap_forward(attn, make)
        return path

    return plant


#: layer 1's attention runs without any mask: every token sees the future (and the padding)
dropped_causal_mask = _mask_bug(lambda mask: None)
dropped_causal_mask.__doc__ = "Layer 1's attention gets no mask: no causality, no padding."

#: layer 1's attention uses the causal mask of an unpadded row for every row: the left-padded
#: row attends to its pad tokens
ignored_padding_mask = _mask_bug(lambda mask: mask[:1].expand_as(mask))
ignored_padding_mask.__doc__ = "Layer 1's attention ignores the padding (causal mask only)."


def stray_bias(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention output projection gets a bias the golden does not have (a
    checkpoint converted with ``bias=True``)."""
    proj, path = _layer(model, arch, arch.out_proj)
    assert getattr(proj, "bias", None) is None
    generator = torch.Generator().manual_seed(7)
    bias = torch.randn(proj.weight.shape[0], generator=generator) * INIT_STD
    proj.bias = torch.nn.Parameter(bias.to(proj.weight.dtype), requires_grad=False)
    return path


def weight_not_loaded(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's MLP down projection keeps a fresh random init (its checkpoint key was missed):
    a weight from nowhere that differs (a 3D expert parameter in the MoE blocks)."""
    module, path = _layer(model, arch, arch.down)
    weight = module.down_proj if arch.moe else module.weight
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        fresh = torch.randn(weight.shape, generator=generator) * INIT_STD
        weight.copy_(fresh.to(weight.dtype))
    return path


def _interleave(rows: int) -> torch.Tensor:
    """Row order of a head converted without RoPE's permutation: halves -> interleaved."""
    half = HEAD_DIM // 2
    per_head = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).flatten()
    heads = rows // HEAD_DIM
    return (per_head[None, :] + HEAD_DIM * torch.arange(heads)[:, None]).flatten()


def qk_rows_swapped(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's q and k projection rows in the interleaved order of the original checkpoint
    (the permutation for rotate_half was not applied when converting): weights that differ."""
    attn, path = _layer(model, arch, arch.attn)
    q_rows, k_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    with torch.no_grad():
        if arch.fused_qkv:
            proj = attn.qkv_proj
            order = torch.arange(proj.weight.shape[0])
            order[:q_rows] = _interleave(q_rows)
            order[q_rows : q_rows + k_rows] = q_rows + _interleave(k_rows)
            proj.weight.copy_(proj.weight[order])
        else:
            for proj, rows in ((attn.q_proj, q_rows), (attn.k_proj, k_rows)):
                order = _interleave(rows)
                proj.weight.copy_(proj.weight[order])
                if proj.bias is not None:
                    proj.bias.copy_(proj.bias[order])
    return path


def norm_in_bf16(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's input norm re-implemented as separate ops computing in bf16 inside the fp32
    model (RMSNorm, Gemma's ``1 + weight`` RMSNorm, or GPT-2's LayerNorm)."""
    norm, path = _layer(model, arch, arch.norm)
    low = torch.bfloat16

    if isinstance(norm, torch.nn.LayerNorm):

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = x.to(low)
            mu = h.mean(-1, keepdim=True)
            var = (h - mu).pow(2).mean(-1, keepdim=True)
            h = (h - mu) * torch.rsqrt(var + norm.eps)
            return h.to(x.dtype) * norm.weight + norm.bias

    elif "Gemma" in type(norm).__name__:

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = x.to(low)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps)
            return (h * (1.0 + norm.weight.to(low))).to(x.dtype)

    else:
        eps = norm.variance_epsilon

        def forward(x: torch.Tensor) -> torch.Tensor:
            h = x.to(low)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return norm.weight * h.to(x.dtype)

    norm.forward = forward  # type: ignore[method-assign]
    return path


def projection_rounded_to_bf16(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention output projection rounds its output to bf16 and back inside the
    fp32 model."""
    proj, path = _layer(model, arch, arch.out_proj)

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(x: torch.Tensor) -> torch.Tensor:
            out = forward(x)
            return out.to(torch.bfloat16).to(out.dtype)

        return patched

    wrap_forward(proj, make)
    return path


def softmax_scale(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention scales its scores by 1.25 x the right factor (a python float
    argument of the scores' multiplication)."""
    attn, path = _layer(model, arch, arch.attn)
    attn.scaling = attn.scaling * WRONG_SCALE
    return path


@dataclass(frozen=True)
class Bug:
    name: str
    plant: Callable[[torch.nn.Module, Arch], str]
    #: why the bug does not apply to an architecture (``None``: it applies)
    skip: Callable[[Arch], str | None] = lambda arch: None


def _needs_rope(arch: Arch) -> str | None:
    return None if arch.rotary else "learned absolute positions, no RoPE"


def _needs_unbiased_out_proj(arch: Arch) -> str | None:
    return "every projection has a bias (Conv1D)" if arch.name == "gpt2" else None


def _qk_skip(arch: Arch) -> str | None:
    return (
        "no RoPE: the same permutation of q and k leaves q.k unchanged" if not arch.rotary else None
    )


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("rope_base_layer", rope_base_in_one_layer, _needs_rope),
        Bug("rope_base_shared", rope_base_shared, _needs_rope),
        Bug("position_offset", position_offset),
        Bug("dropped_causal_mask", dropped_causal_mask),
        Bug("ignored_padding_mask", ignored_padding_mask),
        Bug("stray_bias", stray_bias, _needs_unbiased_out_proj),
        Bug("weight_not_loaded", weight_not_loaded),
        Bug("qk_rows_swapped", qk_rows_swapped, _qk_skip),
        Bug("norm_in_bf16", norm_in_bf16),
        Bug("projection_bf16", projection_rounded_to_bf16),
        Bug("softmax_scale", softmax_scale),
    )
}


def applicable(arch: Arch) -> list[str]:
    return [name for name, bug in BUGS.items() if bug.skip(arch) is None]


# -- noise -------------------------------------------------------------------------------------


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def extra_noop_op(model: torch.nn.Module, arch: Arch) -> None:
    """Layer 1's MLP multiplies its input by 1.0 first: one op only the target makes, same
    values."""
    mlp, _ = _layer(model, arch, "mlp")
    wrap_forward(mlp, lambda forward: lambda x, *a, **k: forward(x * 1.0, *a, **k))


#: noise case -> (target dtype, planting function or None, threads of the target or None); the
#: golden is always fp32 on 2 threads; "self" compares the golden dump with itself
NOISE: dict[str, tuple[torch.dtype, Callable[[torch.nn.Module, Arch], None] | None, int | None]] = {
    "threads": (torch.float32, None, 1),
    "extra_noop_op": (torch.float32, extra_noop_op, None),
    "bf16_vs_fp32": (torch.bfloat16, None, None),
    "self": (torch.float32, None, None),
}
