"""Statistics and copies of an accelerator's tensors, made without stalling the device.

On CPU the fused kernels (``_stats_pass``) or the chunked torch pipeline of ``_stats`` hand
back Python floats. On a GPU or an NPU every such float is a host read that waits until the
device has drained its queue (a synchronisation), several per chunk: a capture of a forward's
thousands of records would stall the device thousands of times. Here nothing is read on the
host while the records are made:

* :class:`DeviceStats` reduces a tensor on its device in one pass over its chunks into seven
  float64 values (sum and sum of squares of the finite elements, their min and max, the NaN,
  +inf and -inf counts), then starts one copy of those 56 bytes to the host;
* :class:`DeviceCopy` starts the copy of a tensor's data to the host;

both asynchronous where the device allows it (CUDA and NPU: into pinned host memory,
``non_blocking``, with an event marking arrival). Only :meth:`DeviceStats.result` and
:meth:`DeviceCopy.wait` wait, and the dump writer calls them on its own thread when it writes
the record, so the thread running the model never waits for the device (the device queue
keeps it busy meanwhile).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._chunks import iter_flat_chunks
from ._stats import TensorStats, from_sums, with_reduction_kernels

#: Device types whose host copies run asynchronously (pinned memory, events).
ASYNC_COPY_DEVICES = ("cuda", "npu")


def _start_host_copy(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A contiguous host tensor receiving ``t``, and the event marking its arrival (None: the
    copy is complete already)."""
    kind = t.device.type
    if kind == "cpu":
        return t.clone(memory_format=torch.contiguous_format), None
    if kind in ASYNC_COPY_DEVICES:
        backend = getattr(torch, kind)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = backend.Event()
        event.record()
        return host, event
    return t.to("cpu").contiguous(), None  # a device without pinned memory: a plain copy


def _wait(event: Any) -> None:
    """Wait for ``event`` unless it has passed (``query`` does not block)."""
    if event is not None and not event.query():
        event.synchronize()


def reduce_on_device(t: torch.Tensor) -> torch.Tensor:
    """``(sum, sum of squares, min, max, nan, +inf, -inf)`` of ``t`` as a float64 tensor on
    ``t``'s device (sums, min and max over the finite elements; min > max when none is), made
    without reading any value on the host. ``t`` is real (complex as its real view)."""
    device = t.device
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    low = torch.full((1,), math.inf, dtype=torch.float64, device=device)
    high = torch.full((1,), -math.inf, dtype=torch.float64, device=device)
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for chunk in iter_flat_chunks(t):
        wide = with_reduction_kernels(chunk).to(torch.float64)
        if chunk.is_floating_point():
            counts += torch.stack(
                [wide.isnan().sum(), (wide == math.inf).sum(), (wide == -math.inf).sum()]
            )
            finite = wide.isfinite()
            summed = torch.where(finite, wide, 0.0)
            low = torch.minimum(low, torch.where(finite, wide, math.inf).amin(0, keepdim=True))
            high = torch.maximum(high, torch.where(finite, wide, -math.inf).amax(0, keepdim=True))
        else:
            summed = wide
            low = torch.minimum(low, wide.amin(0, keepdim=True))
            high = torch.maximum(high, wide.amax(0, keepdim=True))
        totals += torch.stack([summed.sum(), torch.dot(summed, summed)])
    return torch.cat([totals, low, high, counts])


class DeviceStats:
    """A tensor's statistics, reduced on its device and on their way to the host."""

    def __init__(self, t: torch.Tensor) -> None:
        self.numel = t.numel()  # elements of ``t`` itself, also for complex tensors
        if t.is_complex():
            t = torch.view_as_real(t.resolve_conj().resolve_neg())
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        self.components = t.numel()
        self._host, self._ready = _start_host_copy(reduce_on_device(t))

    def wait(self) -> None:
        """Wait until the statistics are on the host. A device works in order: once these
        have arrived, so have all started before them on the same stream."""
        _wait(self._ready)

    def result(self) -> TensorStats:
        """The statistics (waits for the device to reach them: call it off the model's
        thread)."""
        _wait(self._ready)
        total, squares, low, high, nan, posinf, neginf = self._host.tolist()
        if low > high:  # no finite element
            low, high = math.inf, -math.inf
        return from_sums(
            self.numel, self.components, total, squares, low, high,
            int(nan), int(posinf), int(neginf),
        )  # fmt: skip


class DeviceCopy:
    """A tensor's data on its way to a contiguous host tensor (pinned on CUDA and NPU)."""

    def __init__(self, t: torch.Tensor) -> None:
        self._host, self._ready = _start_host_copy(t)

    @property
    def nbytes(self) -> int:
        return self._host.numel() * self._host.element_size()

    def wait(self) -> torch.Tensor:
        """The host tensor, once the copy has arrived (call it off the model's thread)."""
        _wait(self._ready)
        return self._host
