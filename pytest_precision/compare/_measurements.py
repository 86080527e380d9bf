"""Everything a dump comparison reads from tensors, kept apart from what it decides.

Three measurements read tensors: the metrics of a record pair, the float64 rerun of a call
whose output fails, and whether a failing record lies beyond the rounding of its golden value.
Each is computed on first use and kept, keyed by where its records are, as small data (floats
and strings). So the walk that judges guilt (``_dumps.walk``) reads no tensor when the
measurements were taken beforehand, by workers that each read only their part of the dumps
(``_shards``), and the same walk gives the same report either way (``docs/scale-out.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..dump._records import Call, Record
from ..numerics._comparison import TensorComparison, judge_pair, judge_rounding, resolve_standard
from ..numerics._dtypes import dtype_from_name, dtype_name
from ..numerics._measure import ErrorMetrics, NonFinite
from ..numerics._standards import Standard, StandardName, Verdict
from ..rerun._ops import NotReplayable
from ..rerun._recompute import Rerun
from ._padding import real_pair, real_positions

#: A record pair judged in a dtype, as a weight (any differing element fails) or not.
PairKey = tuple[str, str, str, bool]
#: A call of the target: rank, step, name.
CallKey = tuple[int, int, str]
#: One output of a target call.
SlotKey = tuple[int, int, str, str]
#: A record pair and the dtype whose rounding it is judged in.
RoundingKey = tuple[str, str, str]


@dataclass(frozen=True)
class RerunCheck:
    """A failing output against the rerun of its call from the call's own recorded inputs."""

    #: the rerun's verdict; None: the output could not be checked
    verdict: Verdict | None
    dtype: str | None = None
    reason: str = ""
    #: the rerun raised NotReplayable while judging this output: later outputs are not checked
    refused: bool = False


class Measurements:
    """The measurements of one comparison, computed on demand or merged from workers'
    payloads. ``computed`` counts what was computed here; ``payload()`` hands over what was
    computed since the last call, ``merge`` takes in another process's."""

    def __init__(self, standard: Standard | StandardName | None) -> None:
        self.standard = standard
        self.pairs: dict[PairKey, TensorComparison | str] = {}
        #: why a call cannot be rerun (None: it can)
        self.refusals: dict[CallKey, str | None] = {}
        self.reruns: dict[SlotKey, RerunCheck] = {}
        #: whether a failing record differs by more than rounding
        self.rounding: dict[RoundingKey, bool] = {}
        self.computed = 0
        self._fresh: list[tuple[str, Any]] = []
        #: the last call rerun, kept for its other failing outputs
        self._rerun: tuple[CallKey, Rerun] | None = None

    # -- measuring -------------------------------------------------------------------------------

    def pair(self, g: Record, t: Record, dtype: torch.dtype, weight: bool) -> TensorComparison:
        """The stored tensors compared, once per pair of stored data (a weight is recorded as a
        module's parameter and as its op's input). Weights are data, not computations: any
        element that differs from the golden's (cast to the target's dtype) fails them.
        Raises PrecisionInputError for a pair that cannot be compared."""
        key = (record_id(g), record_id(t), dtype_name(dtype), weight)
        known = self.pairs.get(key)
        if known is None:
            try:
                known = self._judge_pair(g, t, dtype, weight)
            except PrecisionInputError as exc:
                known = str(exc)
            self._keep("pairs", key, known)
        if isinstance(known, str):
            raise PrecisionInputError(known)
        return known

    def _judge_pair(
        self, g: Record, t: Record, dtype: torch.dtype, weight: bool
    ) -> TensorComparison:
        assert g.loader is not None
        assert t.loader is not None
        target_tensor, golden_tensor = t.loader(), g.loader()
        if not weight:
            golden_tensor, target_tensor = real_pair(g, golden_tensor, t, target_tensor)
        if target_tensor.is_complex() and golden_tensor.is_complex():
            # rotary embeddings as complex numbers (torch.polar): real and imaginary parts,
            # each judged as a float of the parts' precision
            target_tensor = torch.view_as_real(target_tensor.resolve_conj())
            golden_tensor = torch.view_as_real(golden_tensor.resolve_conj())
            dtype = dtype.to_real()
        standard = resolve_standard(self.standard, dtype)
        known = judge_pair(target_tensor, golden_tensor, standard, dtype)
        if weight and known.verdict != "fail":
            differing = _differing_elements(target_tensor, golden_tensor)
            if differing:
                reason = (
                    f"{differing} of {target_tensor.numel()} weight element(s) differ from "
                    f"the golden's cast to {dtype_name(target_tensor.dtype)}; {known.reason}"
                )
                known = replace(known, verdict="fail", reason=reason)
        return known

    def refusal(self, target: Call) -> str | None:
        """Why ``target`` cannot be rerun from its recorded inputs; None when it can."""
        key = (target.rank, target.step, target.name)
        if key not in self.refusals:
            try:
                self._rerun = (key, Rerun(target))
            except NotReplayable as exc:
                self._keep("refusals", key, str(exc))
            else:
                self._keep("refusals", key, None)
        return self.refusals[key]

    def rerun_check(self, target: Call, slot: str) -> RerunCheck:
        """A failing output of a call that can be rerun (``refusal`` is None), against the
        rerun: within its dtype's rounding envelope, or not."""
        key = (target.rank, target.step, target.name, slot)
        known = self.reruns.get(key)
        if known is None:
            known = self._rerun_check(target, slot)
            self._keep("reruns", key, known)
        return known

    def _rerun_check(self, target: Call, slot: str) -> RerunCheck:
        call = (target.rank, target.step, target.name)
        if self._rerun is None or self._rerun[0] != call:
            self._rerun = (call, Rerun(target))
        rerun = self._rerun[1]
        record = next((r for r in target.outputs if r.slot == slot), None)
        try:
            recorded = None if record is None else record.load()
            keep = None if record is None else real_positions(record)
            own = None if recorded is None else rerun.judge(slot, recorded, keep=keep)
        except NotReplayable:  # the rerun at the recorded dtypes an index needs
            return RerunCheck(None, refused=True)
        if own is None:
            return RerunCheck(None)
        return RerunCheck(own.verdict, dtype_name(own.dtype), own.reason)

    def beyond_rounding(self, g: Record | None, t: Record | None, dtype: torch.dtype) -> bool:
        """Whether the target's record lies outside the rounding envelope (in ``dtype``) of
        the golden's value; True when there is no data to tell."""
        if g is None or t is None:
            return True
        key = (record_id(g), record_id(t), dtype_name(dtype))
        known = self.rounding.get(key)
        if known is None:
            g_tensor, t_tensor = g.load(), t.load()
            if g_tensor is not None and t_tensor is not None:
                g_tensor, t_tensor = real_pair(g, g_tensor, t, t_tensor)
            known = (
                g_tensor is None
                or t_tensor is None
                or not t_tensor.is_floating_point()
                or judge_rounding(t_tensor, g_tensor.double(), dtype).verdict == "fail"
            )
            self._keep("rounding", key, known)
        return known

    def _keep(self, kind: str, key: Any, value: Any) -> None:
        getattr(self, kind)[key] = value
        self._fresh.append((kind, key))
        self.computed += 1

    # -- handing over ----------------------------------------------------------------------------

    def payload(self) -> dict[str, list[list[Any]]]:
        """What was computed here since the last call, as lists of plain values (floats,
        strings, ints, None; ``json.dumps`` writes it, inf and NaN included)."""
        out: dict[str, list[list[Any]]] = {kind: [] for kind in _KINDS}
        for kind, key in self._fresh:
            value = getattr(self, kind)[key]
            out[kind].append([*key, _ENCODE[kind](value)])
        self._fresh = []
        return out

    def merge(self, payload: dict[str, list[list[Any]]]) -> None:
        """Take in what another process measured (``payload()`` there)."""
        for kind in _KINDS:
            for *key, value in payload.get(kind, []):
                getattr(self, kind)[tuple(key)] = _DECODE[kind](self, key, value)


def record_id(record: Record) -> str:
    """Where a record's data is: its stored data (shared by the records of one tensor), else
    the record itself."""
    if record.data_id is not None:
        return record.data_id
    return f"{record.rank}/{record.step}/{record.name}/{record.slot}"


def _differing_elements(target: torch.Tensor, golden: torch.Tensor) -> int:
    """Elements of ``target`` that are not bitwise the golden's cast to the target's dtype."""
    cast = golden.to(target.dtype)
    if torch.equal(target, cast):
        return 0
    same = (target == cast) | (target.isnan() & cast.isnan())
    return int((~same).sum())


# -- plain values ----------------------------------------------------------------------------------

_DTYPES = frozenset({"actual_dtype", "expected_dtype", "dtype"})
_TUPLES = frozenset({"shape", "max_abs_index", "max_rel_index", "rule_counts"})


def _encode_metrics(m: TensorComparison | str) -> Any:
    if isinstance(m, str):
        return m
    assert m.actual_vs_reference is None, "a dump comparison has no float64 reference"
    out: dict[str, Any] = {"verdict": m.verdict, "reason": m.reason}
    for f in fields(ErrorMetrics):
        value = getattr(m, f.name)
        if isinstance(value, torch.dtype):
            value = dtype_name(value)
        elif isinstance(value, NonFinite):
            value = [value.nan, value.posinf, value.neginf]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _decode_metrics(measurements: Measurements, key: list[Any], value: Any) -> Any:
    if isinstance(value, str):
        return value
    values = dict(value)
    for name in _DTYPES:
        values[name] = dtype_from_name(values[name])
    for name in _TUPLES:
        if values[name] is not None:
            values[name] = tuple(values[name])
    for name in ("actual_nonfinite", "expected_nonfinite"):
        values[name] = NonFinite(*values[name])
    # the standard is the one the pair was judged by: the comparison's, in the key's dtype
    standard = resolve_standard(measurements.standard, dtype_from_name(key[2]))
    return TensorComparison(**values, standard=standard)


def _encode_rerun(check: RerunCheck) -> list[Any]:
    return [check.verdict, check.dtype, check.reason, check.refused]


_KINDS = ("pairs", "refusals", "reruns", "rounding")
_ENCODE: dict[str, Any] = {
    "pairs": _encode_metrics,
    "refusals": lambda value: value,
    "reruns": _encode_rerun,
    "rounding": bool,
}
_DECODE: dict[str, Any] = {
    "pairs": _decode_metrics,
    "refusals": lambda _, __, value: value,
    "reruns": lambda _, __, value: RerunCheck(*value),
    "rounding": lambda _, __, value: bool(value),
}
