"""Noise envelopes of goldens: measured when a value is recorded, applied when it is checked.

A golden that came out of many ops carries many roundings; judging a port against it by one
rounding (the dtype default) fails honest ports. So a golden records what its own noise is:

- ``reference``: a float64 rerun of the same computation, stored with the golden (float32 for
  bf16 / fp16 goldens, whose noise is 1e-3: float32's 1e-7 does not move the ratios). The check
  is the reference standard: the value's error against it at most 5 / 2 / 2 times the golden's
  own (max / mean / RMSE), failing above the limits (a warn band would pass real bugs).
- ``perturbation``: the spread of legitimate reruns (``perturbations=``) against the golden,
  times 4. Used only when no reference is stored; recorded with a reference as information.
- ``model``: a multi-op value with nothing measured: the model-level rule (32u RMSE, 128u max).
- ``rounding``: the dtype's default standard (today's behaviour).

Call, marker and ini tolerances override every envelope (:meth:`Golden._tolerance_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..numerics._assertions import to_tensor
from ..numerics._envelopes import SPREAD_FACTOR, ModelLevel, Spread, unit_roundoff
from ..numerics._measure import measure
from ..numerics._nested import iter_leaf_pairs
from ..numerics._standards import Reference, ReferenceLimit, Standard, _allclose_rule

KINDS = ("reference", "perturbation", "model", "rounding")

#: The reference standard's default limits, with no warn band: 14 of 320 planted bf16 bugs
#: fell between 1x and 1.5x the limits and would have passed as warnings.
REFERENCE_LIMIT = ReferenceLimit(5.0, 2.0, 2.0, warn_factor=1.0)
_LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class EnvelopeRequest:
    """What a call asks for: an envelope kind, a reference, legitimate reruns."""

    kind: str | None = None
    reference: Any = None
    perturbations: Sequence[Callable[[], Any]] = ()
    source: str = "assert_close_to_golden"

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise PrecisionInputError(
                f"envelope must be one of {', '.join(KINDS)} (or None), not {self.kind!r}"
            )
        if self.kind == "reference" and self.reference is None:
            raise PrecisionInputError("envelope='reference' needs reference= (float64 rerun)")
        if self.kind == "perturbation" and not self.perturbations:
            raise PrecisionInputError("envelope='perturbation' needs perturbations= (callables)")
        if not all(callable(p) for p in self.perturbations):
            raise PrecisionInputError("perturbations= takes zero-argument callables")

    @property
    def is_set(self) -> bool:
        return self.kind is not None or self.reference is not None or bool(self.perturbations)


NO_REQUEST = EnvelopeRequest()


def _stats(value: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    rule = _allclose_rule(0.0, 0.0)
    m = measure(value, reference.to(value.device), rule, dtype=value.dtype)
    return {
        "max_abs": m.max_abs_err,
        "mean_abs": m.mean_abs_err,
        "rmse": m.rmse,
        "reference_rms": m.expected_rms,
    }


def _leaves(value: Any, other: Any, name: str, what: str) -> list[tuple[str, torch.Tensor, Any]]:
    try:
        return [
            (f"{name}{path}", to_tensor(v, f"{name}{path}"), o)
            for path, v, o in iter_leaf_pairs(value, other, sides=("value", what))
        ]
    except PrecisionInputError as exc:
        raise PrecisionInputError(f"golden {name}: {what} does not fit the value: {exc}") from None


def measure_envelope(
    value: Any, name: str, request: EnvelopeRequest, order: int
) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """The envelope record of ``value`` and its reference tensors (record time only: a
    callable reference or perturbation runs here, never when checking)."""
    if not request.is_set or request.kind == "rounding":
        return None, {}
    record: dict[str, Any] = {"order": order, "source": request.source, "torch": torch.__version__}
    references: dict[str, torch.Tensor] = {}
    reference = request.reference
    if reference is not None:
        if callable(reference) and not isinstance(reference, torch.Tensor):
            reference = reference()
        pairs = []
        for key, leaf, ref_leaf in _leaves(value, reference, name, "reference"):
            ref = to_tensor(ref_leaf, f"{key} (reference)").detach().to("cpu", torch.float64)
            if tuple(ref.shape) != tuple(leaf.shape):
                raise PrecisionInputError(
                    f"golden {key}: reference has shape {tuple(ref.shape)}, value "
                    f"{tuple(leaf.shape)}"
                )
            if leaf.is_floating_point():
                pairs.append((key, leaf, ref))
        record.update(reference_record(pairs, references))
    if request.perturbations:
        spreads: dict[str, dict[str, float]] = {}
        for rerun in request.perturbations:
            for key, leaf, other in _leaves(value, rerun(), name, "perturbation"):
                if not leaf.is_floating_point():
                    continue
                other_t = to_tensor(other, f"{key} (perturbation)").detach().cpu()
                stats = _stats(other_t.to(leaf.dtype), leaf.detach().cpu())
                worst = spreads.setdefault(key, {"rmse": 0.0, "max_abs": 0.0})
                worst["rmse"] = max(worst["rmse"], stats["rmse"])
                worst["max_abs"] = max(worst["max_abs"], stats["max_abs"])
        record["perturbations"] = {
            "count": len(request.perturbations),
            "factor": SPREAD_FACTOR,
            "spread": spreads,
        }
        if "kind" not in record:
            record.update(kind="perturbation", measured_from="legitimate reruns (perturbations=)")
    if "kind" not in record:  # "model", or a kind the call named without data
        record.update(kind="model", measured_from=f"a multi-op value ({request.source})")
    return record, references


def reference_record(
    pairs: Sequence[tuple[str, torch.Tensor, torch.Tensor]], references: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """The ``reference`` envelope fields of ``(key, golden leaf, float64 reference)`` pairs;
    the tensors to store go into ``references``."""
    leaves: dict[str, Any] = {}
    for key, leaf, ref in pairs:
        # a copy: the caller's tensor may be another leaf's reference too, and safetensors
        # refuses to write tensors that share memory
        stored = ref.float() if leaf.dtype in _LOW_PRECISION else ref.clone()
        references[key] = stored.contiguous()
        leaves[key] = {"golden_vs_reference": _stats(leaf.detach().cpu(), stored)}
    return {
        "kind": "reference",
        "measured_from": (
            "float64 rerun of the same computation (stored float32 for bf16/fp16 goldens)"
        ),
        "limits": {
            "max_abs": REFERENCE_LIMIT.max_abs_ratio,
            "mean_abs": REFERENCE_LIMIT.mean_abs_ratio,
            "rmse": REFERENCE_LIMIT.rmse_ratio,
        },
        "leaves": leaves,
        "references": sorted(references),
    }


def envelope_standard(
    envelope: Mapping[str, Any] | None,
    references: Mapping[str, torch.Tensor],
    key: str,
    golden: torch.Tensor,
) -> tuple[Standard | None, torch.Tensor | None]:
    """The standard a stored envelope judges the leaf ``key`` by, and its reference tensor;
    ``(None, None)``: the dtype's default."""
    if not envelope or not golden.is_floating_point() or key in envelope.get("rounding", ()):
        return None, None  # ``rounding``: leaves no op rounded (data), or float32-only ones
    kind = envelope.get("kind")
    if kind == "reference" and key in references:
        return Reference(limits={"default": REFERENCE_LIMIT}), references[key]
    spread = envelope.get("perturbations", {}).get("spread", {}).get(key)
    if kind in ("reference", "perturbation") and spread is not None:
        factor = float(envelope["perturbations"].get("factor", SPREAD_FACTOR))
        u = unit_roundoff(golden.dtype)
        g = golden.double()
        rms = float(g.square().mean().sqrt()) if g.numel() else 0.0
        top = float(g.abs().max()) if g.numel() else 0.0
        return Spread(
            rmse=max(factor * spread["rmse"], u * rms),
            max_abs=max(factor * spread["max_abs"], u * top),
        ), None
    if kind in ("model", "reference", "perturbation"):
        top = float(golden.double().abs().max()) if golden.numel() else 0.0
        return ModelLevel(expected_max_abs=top), None
    return None, None


def describe(envelope: Mapping[str, Any] | None) -> str:
    """One line: which envelope, measured from what."""
    if not envelope:
        return "the dtype's default standard (one rounding)"
    return f"the {envelope.get('kind')} envelope recorded from {envelope.get('measured_from')}"
