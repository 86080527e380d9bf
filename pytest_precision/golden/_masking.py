"""Masked positions are not evidence: goldens compare only the positions the model attends to.

In a padded batch the outputs at positions with ``attention_mask`` 0 are never used by the
model, and their values follow each dtype's mask constant (a bf16 run, its float32 port and
its float64 reference disagree there by whole units). Comparing them fails honest ports at
the first layer and hides where a bug enters. So a golden checked with a mask keeps only the
real positions of every tensor shaped ``(batch, seq, ...)`` like the mask, both when it is
recorded and when it is checked, and says how many positions it left out.

The float64 reference meets a second problem there: a fully masked query row (a left pad
position under a causal mask) adds two ``finfo(float64).min`` and overflows to ``-inf``, its
softmax is NaN, and ``0 * NaN`` carries the NaN into every real position of later layers.
:func:`finite_at_masked` replaces non-finite values at masked positions by 0 after each
module; real positions are untouched (they never read masked ones but through zero weights).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from .._errors import PrecisionInputError
from ._envelope import EnvelopeRequest


@dataclass(frozen=True)
class LeftOut:
    """How many ``(batch, seq)`` positions a golden left out, of how many."""

    positions: int
    of: int


def left_out_record(left_out: LeftOut | None) -> dict[str, Any]:
    """The ``masked`` field of a golden's JSON record (nothing without a mask)."""
    if left_out is None:
        return {}
    return {"masked": {"left_out": left_out.positions, "positions": left_out.of}}


def left_out_line(name: str, left_out: LeftOut | None) -> str:
    """The failure message's line on masked positions (empty without a mask)."""
    if left_out is None:
        return ""
    return (
        f"\n{name}: {left_out.positions} of {left_out.of} (batch, seq) positions left out "
        "(mask 0: never used by the model, not compared)"
    )


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor inside it (tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def as_mask(mask: Any, where: str = "mask") -> torch.Tensor:
    """``mask`` as a boolean ``(batch, seq)`` tensor (True: a real position), or a clear error."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise PrecisionInputError(
            f"{where} must be a 2-D (batch, seq) tensor of 0 and 1 like attention_mask, not {shape}"
        )
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise PrecisionInputError(f"{where} must hold only 0 and 1 (1: a real position)")
    if not bool(mask.any()):  # a check of nothing would pass whatever the values
        raise PrecisionInputError(f"{where} is 0 everywhere: no position would be compared")
    return mask.detach().to(torch.bool)


def mask_of(mask: Any, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The mask a layer check applies: ``mask=False`` none, a tensor that one, else the
    model's 2-D ``attention_mask`` keyword (a 4-D or missing one: none)."""
    if mask is False:
        return None
    if mask is not None and mask is not True:
        return as_mask(mask)
    found = kwargs.get("attention_mask")
    if isinstance(found, torch.Tensor) and found.dim() == 2:
        return as_mask(found, "attention_mask")
    if mask is True:
        raise PrecisionInputError("mask=True needs a 2-D attention_mask keyword for the model")
    return None


def _fits(tensor: torch.Tensor, mask: torch.Tensor) -> bool:
    return tensor.dim() >= 2 and tuple(tensor.shape[:2]) == tuple(mask.shape)


def keep_real(value: Any, mask: torch.Tensor | None) -> tuple[Any, LeftOut | None]:
    """``value`` with every tensor shaped ``(batch, seq, ...)`` like ``mask`` reduced to its
    real positions (``(real, ...)``), and what was left out (None: no tensor fits the mask)."""
    if mask is None:
        return value, None
    fitted = False

    def select(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal fitted
        if not _fits(tensor, mask):
            return tensor
        fitted = True
        return tensor[mask.to(tensor.device)]

    kept = map_tensors(value, select)
    if not fitted:
        return value, None
    return kept, LeftOut(int((~mask).sum()), mask.numel())


def keep_real_strict(value: Any, mask: Any, name: str) -> tuple[Any, LeftOut | None]:
    """:func:`keep_real` for an explicit ``mask=``: a mask that fits no tensor is an error."""
    if mask is None or mask is False:
        return value, None
    checked = as_mask(mask)
    kept, left_out = keep_real(value, checked)
    if left_out is None:
        raise PrecisionInputError(
            f"mask of shape {tuple(checked.shape)} fits no tensor of golden {name!r}: it "
            "applies to tensors shaped (batch, seq, ...)"
        )
    return kept, left_out


def keep_real_later(make: Callable[[], Any], mask: torch.Tensor | None) -> Callable[[], Any]:
    """A zero-argument callable (a reference or a rerun) whose result is reduced like the
    value, so the envelope is measured on the positions the golden keeps."""
    if mask is None:
        return make
    return lambda: keep_real(make(), mask)[0]


def _zero_nonfinite(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not tensor.is_floating_point() or not _fits(tensor, mask):
        return tensor
    masked = (~mask.to(tensor.device)).reshape(*mask.shape, *([1] * (tensor.dim() - 2)))
    bad = masked & ~torch.isfinite(tensor)
    return torch.where(bad, torch.zeros((), dtype=tensor.dtype, device=tensor.device), tensor)


@contextmanager
def finite_at_masked(module: torch.nn.Module, mask: torch.Tensor | None) -> Iterator[None]:
    """While active, every submodule's outputs have their non-finite values at masked
    positions replaced by 0, so a fully masked row's NaN stays out of real positions."""
    if mask is None:
        yield
        return

    def clean(output: Any) -> Any:
        if isinstance(output, dict):  # in place: an HF ModelOutput must stay one
            for key, item in output.items():
                output[key] = clean(item)
            return output
        return map_tensors(output, lambda t: _zero_nonfinite(t, mask))

    def hook(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        return clean(output)

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def masked_call(
    value: Any, request: EnvelopeRequest, mask: Any, name: str | None
) -> tuple[Any, EnvelopeRequest, LeftOut | None]:
    """A direct golden call with ``mask=``: its value, its reference and its reruns reduced
    to the real positions (``mask`` None or False: unchanged)."""
    kept, left_out = keep_real_strict(value, mask, name or "value")
    if left_out is None:
        return value, request, None
    real = as_mask(mask)
    reference = request.reference
    if callable(reference):
        reference = keep_real_later(reference, real)
    elif reference is not None:
        reference = keep_real(reference, real)[0]
    reruns = tuple(keep_real_later(p, real) for p in request.perturbations)
    return kept, replace(request, reference=reference, perturbations=reruns), left_out
