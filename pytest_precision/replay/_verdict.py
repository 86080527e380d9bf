"""``replay_op``: one recorded op rerun alone on a device and judged against a float64 rerun:
``op-bug`` (it computes wrong by itself), ``context`` (it is right alone; what ran around it was
not) or ``noise``. See ``docs/replay.md``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from .._errors import PrecisionInputError
from ..dump._load import as_dump
from ..dump._records import Call, Dump, Record
from ..numerics._comparison import TensorComparison
from ..numerics._dtypes import dtype_name
from ..rerun._ops import NotReplayable
from ..rerun._recompute import Rerun, find_call, lowest_float, recompute
from ..runtime._devices import backend_of

ReplayVerdict = Literal["noise", "context", "op-bug"]


#: Worst first: a call's verdict is the worst of its output slots'.
_SEVERITY: dict[ReplayVerdict, int] = {"noise": 0, "context": 1, "op-bug": 2}


@dataclass(frozen=True)
class SlotReplay:
    """One output slot of a replayed call, each side judged against the float64 rerun."""

    slot: str
    verdict: ReplayVerdict
    #: what the dump recorded
    recorded: TensorComparison
    #: the op rerun alone on the device, at the recorded dtypes
    rerun: TensorComparison
    #: the golden dump's recorded output, when a golden was given and its shape matches
    golden: TensorComparison | None = None


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay_op` found: the verdict on one recorded op on one device."""

    name: str
    module: str | None
    step: int
    rank: int
    device: str
    #: the lowest floating precision among the call's tensors, whose rounding envelope judges
    precision: str
    verdict: ReplayVerdict
    reason: str
    slots: tuple[SlotReplay, ...]
    #: where the dump (and the golden, if any) came from
    dump: str
    golden: str | None = None

    @property
    def passed(self) -> bool:
        """False only for ``op-bug``: the op itself computes wrong on this device."""
        return self.verdict != "op-bug"


def replay_op(
    dump: Dump | str | os.PathLike[str],
    name: str,
    device: str | torch.device = "cpu",
    *,
    golden: Dump | str | os.PathLike[str] | None = None,
    step: int | None = None,
    rank: int | None = None,
) -> ReplayResult:
    """Rerun the recorded op ``name`` alone on ``device`` and say whose fault a difference is.

    Each output slot is judged by the rounding envelope of its own dtype against a float64 CPU
    rerun (indices and masks against the CPU rerun at the recorded dtypes; see
    :class:`Rerun`): the recorded output, the op rerun alone on ``device`` at the recorded
    dtypes, and the golden's recorded output (reported only). The verdict is ``op-bug`` when
    the rerun lands outside the envelope (the op alone reproduces a wrong output), ``context``
    when only the recorded output does (the op is right; its surroundings were not), ``noise``
    otherwise. ``step`` and ``rank`` choose among calls of the same name. Raises
    :class:`NotReplayable` (module calls, statistics-only dumps, ...) and
    :class:`PrecisionInputError` (unknown name, unavailable device) with a one-line reason.
    """
    target = as_dump(dump)
    call = find_call(target, name, step=step, rank=rank)
    backend_device = _available_device(device)
    golden_dump = None if golden is None else as_dump(golden)
    golden_call = (
        None
        if golden_dump is None
        else find_call(golden_dump, name, step=call.step, rank=call.rank)
    )
    reference = Rerun(call)
    rerun = recompute(call, dtype=None, device=backend_device)
    golden_outputs = {} if golden_call is None else {r.slot: r for r in golden_call.outputs}
    slots = []
    for record in call.outputs:
        recorded_judged = None
        if record.slot in reference.exact:
            recorded_judged = reference.judge(record.slot, _loaded(call, record), saturate=True)
        if recorded_judged is None:
            continue  # not a tensor: nothing to judge
        rerun_judged = reference.judge(record.slot, rerun[record.slot].cpu(), saturate=True)
        assert rerun_judged is not None  # recompute checked slots and shapes
        other = golden_outputs.get(record.slot)
        golden_data = None if other is None else other.load()
        slots.append(
            _judge_slot(
                record.slot,
                recorded_judged,
                rerun_judged,
                None if golden_data is None else reference.judge(record.slot, golden_data),
            )
        )
    precision = lowest_float(call.outputs)
    overflowed = reference.overflowed
    verdict: ReplayVerdict = max(
        (s.verdict for s in slots), key=_SEVERITY.__getitem__, default="noise"
    )
    reason = _reason(verdict, slots, str(backend_device), precision)
    stomp = _stomped_input(target, call)
    if stomp is not None and verdict == "noise":
        verdict, reason = "context", stomp
    return ReplayResult(
        name=call.name,
        module=call.module,
        step=call.step,
        rank=call.rank,
        device=str(backend_device),
        precision=dtype_name(precision),
        verdict=verdict,
        reason=reason
        + (
            f"; the float64 result overflows {dtype_name(precision)} ({', '.join(overflowed)}), "
            "where +-inf is the right answer: a range problem of the model, not of the op"
            if overflowed
            else ""
        ),
        slots=tuple(slots),
        dump=str(target.path),
        golden=None if golden_dump is None else str(golden_dump.path),
    )


def _available_device(device: str | torch.device) -> torch.device:
    available, reason = backend_of(device).is_available()
    if not available:
        raise PrecisionInputError(f"device {str(device)!r} is not available: {reason}")
    return torch.device(device)


def _loaded(call: Call, record: Record) -> torch.Tensor:
    tensor = record.load()
    if tensor is None:
        raise NotReplayable(
            f"{call.name}: {record.slot} has no tensor data: the dump holds statistics only "
            "(replay needs a dump of tensors: capture mode='tensor', msprobe task 'tensor')"
        )
    return tensor


def _stomped_input(dump: Dump, call: Call) -> str | None:
    """Why the call is ``context`` although it computes right from what it read: an input's
    data is what capture recorded as changed with no recorded write (a stomp, see
    ``Record.changed_since``), by this record or by an earlier one sharing its data."""
    changed = {r.data_id: r.changed_since for r in dump.records if r.changed_since and r.data_id}
    for record in call.inputs:
        since = record.changed_since or changed.get(record.data_id or "")
        if since is not None:
            return (
                f"the op is right on what it read, but its {record.slot} was changed between "
                f"`{since.name}` {since.slot} and this call by no recorded call (a stomp): "
                "what ran around it was not"
            )
    return None


def _judge_slot(
    slot: str,
    recorded: TensorComparison,
    rerun: TensorComparison,
    golden: TensorComparison | None,
) -> SlotReplay:
    if rerun.verdict == "fail":
        verdict: ReplayVerdict = "op-bug"
    elif recorded.verdict == "fail":
        verdict = "context"
    else:
        verdict = "noise"
    return SlotReplay(slot, verdict, recorded, rerun, golden)


def _reason(
    verdict: ReplayVerdict, slots: list[SlotReplay], device: str, precision: torch.dtype
) -> str:
    envelope = f"{dtype_name(precision)} rounding of the float64 result"
    if not slots:
        return "the op returns no tensor to judge"
    if verdict == "noise":
        return f"the recorded output and the op rerun alone on {device} are within {envelope}"
    worst = next(s for s in slots if s.verdict == verdict)
    if verdict == "op-bug":
        return (
            f"the op rerun alone on {device} lands outside {envelope} ({worst.slot}: "
            f"{worst.rerun.reason}): it computes wrong by itself"
        )
    return (
        f"the op rerun alone on {device} is within {envelope}, but the recorded {worst.slot} "
        f"is not ({worst.recorded.reason}): the op is right, what ran around it was not "
        "(memory stomping, stale state, another code path)"
    )
