"""Planted batch bugs for the batch-invariance tests: each changes nothing for a prompt run
alone (a batch of one) and changes its row inside a batch, as the serving bugs do.

Each patches one module instance of decoder layer 1 and returns that module's path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hf_zoo import Arch


def _wrap_output(module: torch.nn.Module, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if isinstance(out, tuple):
            return (change(out[0]), *out[1:])
        return change(out)

    module.forward = forward  # type: ignore[method-assign]


def row_leak(model: torch.nn.Module, arch: Arch) -> str:
    """The MLP's output of each row reads its neighbour row (a kernel indexing the wrong row)."""
    path = f"{arch.layer(1)}.mlp"
    _wrap_output(model.get_submodule(path), lambda out: out + 0.25 * (out.roll(1, 0) - out))
    return path


def shared_state(model: torch.nn.Module, arch: Arch) -> str:
    """The MLP's output is pulled toward the batch's mean (statistics shared across rows)."""
    path = f"{arch.layer(1)}.mlp"
    _wrap_output(
        model.get_submodule(path), lambda out: out + 0.25 * (out.mean(0, keepdim=True) - out)
    )
    return path


def padding_mask_dropped(model: torch.nn.Module, arch: Arch) -> str:
    """The attention keeps the causal part of its mask and drops the padding part: a padded
    row attends to its pad tokens (alone, with no padding, the two masks are the same)."""
    path = f"{arch.layer(1)}.{arch.attn}"
    module = model.get_submodule(path)
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            kwargs["attention_mask"] = _causal_like(mask)
        return original(*args, **kwargs)

    module.forward = forward  # type: ignore[method-assign]
    return path


def _causal_like(mask: torch.Tensor) -> torch.Tensor:
    queries, keys = mask.shape[-2:]
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    if mask.dtype == torch.bool:
        return allowed.expand_as(mask)
    blocked = torch.full((queries, keys), torch.finfo(mask.dtype).min, dtype=mask.dtype)
    return torch.where(allowed, torch.zeros((), dtype=mask.dtype), blocked).expand_as(mask)


BUGS = {"row_leak": row_leak, "shared_state": shared_state, "padding_mask": padding_mask_dropped}
