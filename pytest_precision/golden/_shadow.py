"""The float64 rerun of a test at ``--golden-update``: its values become the goldens' references.

The plugin runs a passing test body a second time under :func:`float64_mode`; every value the
rerun asserts is collected here (never judged), matched to the first run's value of the same
name, and stored as that golden's float64 reference. When the rerun cannot stand for the test
(it raised, asserted other names, or a value of another structure or shape), a low-precision
golden gets the model-level rule instead, and its record says why and how to sharpen it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics._assertions import Comparison, to_tensor
from ..numerics._envelopes import MODEL_RMSE_UNITS, unit_roundoff
from ..numerics._nested import iter_leaf_pairs
from ._envelope import EnvelopeRequest, measure_envelope, reference_record
from ._files import Entry, flatten
from ._float64_mode import Float64Mode, is_deepened
from ._names import GoldenNames

SOURCE = "float64 rerun of the test (--golden-update)"
_LOW = (torch.bfloat16, torch.float16)
_SHARPER = "for a sharper check pass reference= (docs/goldens-in-ci.md)"


def _flat(value: Any, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    for path, leaf, _ in iter_leaf_pairs(value, value):
        key = f"{name}{path}"
        yield key, to_tensor(leaf, key)


@dataclass(frozen=True)
class ShadowValue:
    """One value the rerun asserted: its leaves in float64 on the CPU, and which of them the
    mode computed (the others are data no op rounded)."""

    leaves: dict[str, torch.Tensor]
    deepened: frozenset[str]


class ShadowRun:
    """Collects what a test's float64 rerun asserts, named as the test names them."""

    def __init__(self, test_id: str) -> None:
        self.names = GoldenNames(test_id)
        self.values: dict[str, ShadowValue] = {}
        self.mode = Float64Mode()

    def collect(self, value: Any, name: str | None) -> None:
        with torch._C.DisableTorchFunction():  # bookkeeping, not the test's computation
            name = self.names.take(name)
            leaves, deepened = {}, set()
            for key, leaf in _flat(value, name):
                if is_deepened(leaf):
                    deepened.add(key)
                leaf = leaf.detach().cpu()
                leaves[key] = leaf.double() if leaf.is_floating_point() else leaf.clone()
            self.values[name] = ShadowValue(leaves, frozenset(deepened))


@dataclass
class Pending:
    """A value the first run of an update recorded, or kept without an envelope, waiting for
    the rerun to say how its noise is judged."""

    name: str
    where: str
    status: str  # recorded / rewritten, or "pass": a stored value that still matched
    message: str
    value: Any  # for its structure only: the test may change its tensors in place
    comparison: Comparison | None
    order: int
    entry: Entry = field(repr=False)  # copies of the value's tensors, to store
    leaves: dict[str, torch.Tensor] = field(repr=False)  # the same, by leaf key
    device: torch.device | None = None


def make_pending(
    value: Any,
    name: str,
    where: str,
    status: str,
    message: str,
    comparison: Comparison | None,
    order: int,
    device: torch.device | None,
) -> Pending:
    entry = flatten(value, name)
    leaves = {k: t.detach().cpu().clone() for k, t in _flat(value, name)}
    return Pending(name, where, status, message, value, comparison, order, entry, leaves, device)


def wants_reference(value: Any, name: str) -> bool:
    return any(leaf.is_floating_point() for _, leaf in _flat(value, name))


def rerun_problem(
    first_names: list[str], run: ShadowRun | None, error: BaseException | None
) -> str | None:
    """Why the rerun cannot stand for the test as a whole; None when it can."""
    if run is None:
        return "the test did not pass, so it was not rerun in float64"
    if error is not None:
        line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"its float64 rerun raised {type(error).__name__}{': ' + line if line else ''}"
    if run.names.order != first_names:
        return (
            f"its float64 rerun asserted {len(run.names.order)} golden(s) "
            f"({', '.join(run.names.order) or 'none'}) where the test asserted "
            f"{len(first_names)} ({', '.join(first_names)})"
        )
    return None


def _value_problem(item: Pending, shadow: ShadowValue) -> str | None:
    leaves = item.leaves
    if set(leaves) != set(shadow.leaves):
        return f"its float64 rerun gave {item.name} another structure"
    for key, leaf in leaves.items():
        if tuple(leaf.shape) != tuple(shadow.leaves[key].shape):
            return (
                f"its float64 rerun gave {key} the shape {tuple(shadow.leaves[key].shape)}, "
                f"not {tuple(leaf.shape)}"
            )
    for key in sorted(shadow.deepened & set(leaves)):
        drift = _drift_in_units(leaves[key], shadow.leaves[key])
        if drift > MODEL_RMSE_UNITS:
            return (
                f"its float64 rerun gave {key} values {drift:.3g}u RMS away from the test's "
                f"(beyond the {MODEL_RMSE_UNITS:g}u any honest rounding reaches: another "
                "computation, such as unseeded random inputs)"
            )
    return None


def _drift_in_units(value: torch.Tensor, reference: torch.Tensor) -> float:
    """RMS(value - reference) / RMS(reference) in unit roundoffs of the value's dtype: a
    reference of the same computation stays far below the model-level rule's 32."""
    if not value.is_floating_point() or value.numel() == 0:
        return 0.0
    v, r = value.double(), reference.double()
    finite = torch.isfinite(v) & torch.isfinite(r)
    if not bool(finite.any()):
        return 0.0
    v, r = v[finite], r[finite]
    rms = float(r.square().mean().sqrt())
    error = float((v - r).square().mean().sqrt())
    if rms == 0.0:
        return 0.0 if error == 0.0 else math.inf
    return error / rms / unit_roundoff(value.dtype)


def resolve(
    item: Pending, run: ShadowRun | None, problem: str | None
) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor], str]:
    """``(envelope record, reference tensors, what the record's message says)`` of a value."""
    leaves = item.leaves
    floating = {k for k, t in leaves.items() if t.is_floating_point()}
    if problem is None and run is not None:
        shadow = run.values[item.name]
        problem = _value_problem(item, shadow)
        if problem is None:
            deepened = sorted(shadow.deepened & floating)
            if not deepened:
                return None, {}, "no op rounded it: the dtype's default standard"
            references: dict[str, torch.Tensor] = {}
            pairs = [(k, leaves[k], shadow.leaves[k]) for k in deepened]
            record: dict[str, Any] = {
                "order": item.order,
                "source": SOURCE,
                "torch": torch.__version__,
                **reference_record(pairs, references),
            }
            record["measured_from"] = SOURCE
            if floating - set(deepened):
                record["rounding"] = sorted(floating - set(deepened))
            return record, references, "float64 reference from the test's float64 rerun"
    low = {k for k in floating if leaves[k].dtype in _LOW}
    if not low:
        return None, {}, f"{problem}: the dtype's default standard"
    model, _ = measure_envelope(
        item.value, item.name, EnvelopeRequest("model", source=SOURCE), item.order
    )
    assert model is not None
    model["measured_from"] = f"nothing: {problem}"
    if floating - low:
        model["rounding"] = sorted(floating - low)
    return model, {}, f"model-level envelope ({problem}); {_SHARPER}"


#: Resolved: a waiting value with its envelope, reference tensors and the record's note.
Resolved = tuple[Pending, "dict[str, Any] | None", dict[str, torch.Tensor], str]


class RerunBook:
    """An update's values waiting for the float64 rerun, and the rerun while it runs."""

    def __init__(self, test_id: str) -> None:
        self.test_id = test_id
        self.waiting: list[Pending] = []
        self.run: ShadowRun | None = None
        self.ended: str | None = None  # set once the rerun is over: why later values miss it

    def begin(self) -> ShadowRun:
        self.run = ShadowRun(self.test_id)
        return self.run

    def add(self, item: Pending) -> list[Resolved]:
        """Wait with ``item`` for the rerun; after it, resolve it at once."""
        if self.ended is None:
            self.waiting.append(item)
            return []
        return [(item, *resolve(item, None, self.ended))]

    def end(self, first_names: list[str], error: BaseException | None) -> list[Resolved]:
        run, self.run = self.run, None
        problem = rerun_problem(first_names, run, error)
        waiting, self.waiting = self.waiting, []
        self.ended = "asserted after the test body (a fixture's teardown), which is not rerun"
        return [(item, *resolve(item, run, problem)) for item in waiting]
