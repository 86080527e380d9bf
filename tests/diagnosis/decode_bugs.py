"""Bugs that live only in the cached decode path of the tiny HF Llama (``tests/hf_zoo.py``), and
one that lives in both paths, planted in ONE model instance (its attention modules' ``forward``
or the cache layer objects those see; never a class, so a golden built next to it stays clean).

Each plant returns the decoder layer it is planted in: a correct localization names it.

- ``decode_position_off_by_one``: in every layer, a decode forward (one new token) rotates its
  query and key as if it stood one position later (what a serving loop that computes the decode
  position as ``cache length + 1`` does). The prefill is exact.
- ``keys_stored_in_bf16``: in every layer, the keys written to the cache are rounded to bf16
  (an fp32 model); the forward that writes them uses them exact, so only later steps see it.
- ``cache_slot_not_written``: layer 1 writes zeros instead of the decode token's key and value
  into its cache slot (a static cache whose write was skipped); the prefill's slots are written.
- ``dropped_causal_mask``: layer 0's attention gets no mask at all (no causality, no padding),
  in the prefill and in every decode step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

LAYERS = "model.layers"


def _attention(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    return model.get_submodule(f"{LAYERS}.{layer}.self_attn")


def _wrap_attention(
    model: torch.nn.Module, layer: int, make: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    attention = _attention(model, layer)
    attention.forward = make(attention.forward)  # type: ignore[method-assign]


def _cache_kwarg(kwargs: dict[str, Any]) -> str:
    """The attention's cache argument: ``cache`` (transformers 5) or ``past_key_values``."""
    return "cache" if "cache" in kwargs else "past_key_values"


def _patch_cache_layer(
    cache: Any, index: int, store: Callable[[torch.Tensor, torch.Tensor, bool], tuple[Any, Any]]
) -> None:
    """Make layer ``index`` of ``cache`` store ``store(keys, values, prefill)`` instead of the
    new keys and values, while the forward writing them still reads them exact."""
    layer = cache.layers[index]
    if getattr(layer, "_planted", False):
        return
    original = layer.update

    def update(keys: torch.Tensor, values: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        prefill = not layer.is_initialized
        stored_k, stored_v = store(keys, values, prefill)
        all_k, all_v = original(stored_k, stored_v, *args, **kwargs)
        new = keys.shape[-2]
        return (
            torch.cat([all_k[..., :-new, :], keys], dim=-2),
            torch.cat([all_v[..., :-new, :], values], dim=-2),
        )

    layer.update = update
    layer._planted = True


def _cache_bug(
    layers: Callable[[torch.nn.Module], list[int]],
    store: Callable[[torch.Tensor, torch.Tensor, bool], tuple[Any, Any]],
) -> Callable[[torch.nn.Module], str]:
    def plant(model: torch.nn.Module) -> str:
        chosen = layers(model)
        for layer in chosen:

            def make(forward: Callable[..., Any], index: int = layer) -> Callable[..., Any]:
                def patched(*args: Any, **kwargs: Any) -> Any:
                    cache = kwargs.get(_cache_kwarg(kwargs))
                    if cache is not None:
                        _patch_cache_layer(cache, index, store)
                    return forward(*args, **kwargs)

                return patched

            _wrap_attention(model, layer, make)
        return f"{LAYERS}.{chosen[0]}"

    return plant


def _every_layer(model: torch.nn.Module) -> list[int]:
    return list(range(len(model.get_submodule(LAYERS))))


def _bf16(keys: torch.Tensor, values: torch.Tensor, prefill: bool) -> tuple[Any, Any]:
    return keys.to(torch.bfloat16).to(keys.dtype), values


def _unwritten(keys: torch.Tensor, values: torch.Tensor, prefill: bool) -> tuple[Any, Any]:
    if prefill:
        return keys, values
    return torch.zeros_like(keys), torch.zeros_like(values)


keys_stored_in_bf16 = _cache_bug(_every_layer, _bf16)
cache_slot_not_written = _cache_bug(lambda model: [1], _unwritten)


def _rotate_one_more(
    rotary: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos / sin of one position later, computed inside the attention (the rotary module's
    arithmetic, not a second call of the shared module)."""
    with torch.no_grad():
        return rotary.forward(x, position_ids + 1)


def decode_position_off_by_one(model: torch.nn.Module) -> str:
    rotary = model.get_submodule("model.rotary_emb")
    for layer in _every_layer(model):

        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            def patched(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                position_ids = kwargs.get("position_ids")
                if hidden_states.shape[1] == 1 and position_ids is not None:
                    kwargs["position_embeddings"] = _rotate_one_more(
                        rotary, hidden_states, position_ids
                    )
                return forward(hidden_states, *args, **kwargs)

            return patched

        _wrap_attention(model, layer, make)
    return f"{LAYERS}.0"


def dropped_causal_mask(model: torch.nn.Module) -> str:
    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            kwargs["attention_mask"] = None
            return forward(*args, **kwargs)

        return patched

    _wrap_attention(model, 0, make)
    return f"{LAYERS}.0"


#: name -> plant (returns the decoder layer the bug is in)
DECODE_BUGS: dict[str, Callable[[torch.nn.Module], str]] = {
    "decode position off by one": decode_position_off_by_one,
    "keys stored in bf16": keys_stored_in_bf16,
    "cache slot not written": cache_slot_not_written,
    "dropped causal mask": dropped_causal_mask,
}
