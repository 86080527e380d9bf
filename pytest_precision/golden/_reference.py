"""``float64_reference``: the same computation rerun in float64, for goldens' noise envelopes.

The reference must come from the *same* low-precision weights, upcast exactly: the float32
master would differ from the bf16 checkpoint by a weight rounding that dwarfs the golden's own
noise and loosens the check. The user's module is never touched: a deep copy is upcast.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .._errors import PrecisionInputError
from ._masking import finite_at_masked, map_tensors, mask_of


def upcast(value: Any, dtype: torch.dtype = torch.float64) -> Any:
    """Floating tensors inside ``value`` (tuples, lists, dicts) converted exactly to ``dtype``."""
    return map_tensors(value, lambda t: t.detach().to(dtype) if t.is_floating_point() else t)


def primary_output(output: Any) -> Any:
    """A module's main output: a tensor, the first item of a tuple, or ``logits`` / the first
    field of a model-output mapping (HF ``ModelOutput``)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if "logits" in output:
            return output["logits"]
        return next(iter(output.values()), None)
    if isinstance(output, (tuple, list)) and output:
        return primary_output(output[0])
    return output


@contextmanager
def capture_outputs(model: torch.nn.Module, paths: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Record the primary output of the modules at ``paths`` (first call of each), in the
    order they run."""
    modules = dict(model.named_modules())
    missing = [p for p in paths if p not in modules]
    if missing:
        raise PrecisionInputError(
            f"no module named {', '.join(map(repr, missing))} in {type(model).__name__} "
            "(module paths as model.named_modules() spells them)"
        )
    captured: dict[str, Any] = {}
    handles = []

    def hook_for(path: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if path not in captured:
                out = primary_output(output)
                captured[path] = out.detach().clone() if isinstance(out, torch.Tensor) else out

        return hook

    for path in paths:
        handles.append(modules[path].register_forward_hook(hook_for(path)))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def float64_reference(
    module_or_fn: torch.nn.Module | Callable[..., Any],
    *args: Any,
    capture: Sequence[str] | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``module_or_fn`` in float64 on the same weights and inputs, upcast exactly.

    A module is deep-copied and its floating parameters and buffers upcast (the user's model
    is never modified); floating tensors in ``args`` / ``kwargs`` are upcast too. Returns the
    output, or ``(output, {path: output})`` with ``capture``: the outputs of those submodules
    (paths as ``named_modules()`` spells them), in the order they ran. With a 2-D
    ``attention_mask`` keyword, non-finite values at its masked positions become 0 after each
    submodule: float64's mask constant overflows in fully masked rows, and their NaN would
    reach real positions through zero attention weights.
    """
    if isinstance(module_or_fn, torch.nn.Module):
        target: Any = copy.deepcopy(module_or_fn).to(torch.float64)
    elif callable(module_or_fn):
        if capture:
            raise PrecisionInputError("capture= needs a module, not a plain callable")
        target = module_or_fn
    else:
        raise PrecisionInputError(
            f"float64_reference takes a module or a callable, not {type(module_or_fn).__name__}"
        )
    args, kwargs = upcast(args), upcast(kwargs)
    mask = _reference_mask(target, kwargs)
    with torch.no_grad(), finite_at_masked(target, mask):
        if capture is None:
            return target(*args, **kwargs)
        with capture_outputs(target, list(capture)) as captured:
            output = target(*args, **kwargs)
        return output, dict(captured)


def _reference_mask(target: Any, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The 2-D 0/1 ``attention_mask`` of a module's call, if it has one (any other: none)."""
    if not isinstance(target, torch.nn.Module):
        return None
    try:
        return mask_of(None, kwargs)
    except PrecisionInputError:
        return None
