"""A tensor's content sum: the fingerprint capture checks that a tensor seen again is unchanged
with (a write behind the version counter's back, a *stomp*, changes it).

The sum of the bit patterns of a tensor's real components (its elements; a complex tensor's
real and imaginary parts), each read as a signed integer of its own size, wrapping modulo
2**32 (components of up to 4 bytes) or 2**64 (8 bytes): exact integer arithmetic, so every
path and every order of adding gives the same value, and torch sums it in the components' own
width, as fast as a copy (widening each element on the way is ten times slower). It misses a
write that only permutes elements or whose changes cancel exactly.

A tensor recorded anew is read once: the statistics pass computes its content sum while it
reads the elements (:func:`tensor_stats_and_content`), and a private copy while it copies
them (:func:`copy_with_content`). Only a tensor seen again is summed alone
(:func:`content_sum`), to check it is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import _kernels, _stats, _stats_pass


def _component_bits(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s real components as signed integers (a view); ``None`` where its memory is not
    what its values are (a conjugate or negative bit) or its components have no integer
    type of their size."""
    if t.is_conj() or t.is_neg():
        return None
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    bits = _stats_pass.SIGNED_BITS.get(t.element_size())
    return None if bits is None else t.view(bits)


def wrapped(total: int, component_size: int) -> int:
    """``total`` reduced to the content sum's width for components of ``component_size``
    bytes, as a signed integer."""
    half = 1 << (31 if component_size <= 4 else 63)
    return (total + half) % (2 * half) - half


def _start(component_size: int) -> np.signedinteger[Any]:
    """The kernels' starting sum: of the type they sum components of ``component_size`` in."""
    return np.int32(0) if component_size <= 4 else np.int64(0)


def _numba_sum(array: np.ndarray) -> int:
    """The content sum, before :func:`wrapped`, of a flat integer array by the kernels, one
    range per thread from ``_kernels.PARALLEL_NUMEL`` elements."""
    kernel, start = _kernels._jit()._content_sum, _start(array.itemsize)
    if array.size < _kernels.PARALLEL_NUMEL:
        return int(kernel(array, start))
    return sum(_kernels.run_chunks(array.size, lambda a, b: int(kernel(array[a:b], start))))


def _memory_run(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as the flat run of memory they fill, in memory order, if they fill one
    exactly: a contiguous tensor, or a permutation of one (a transposed view). The content sum
    adds in any order, so it is the run's."""
    if t.is_contiguous():
        return t.reshape(-1)
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1):
        if stride != expected:
            return None
        expected *= size
    return t.as_strided((t.numel(),), (1,))


def content_sum(t: torch.Tensor) -> int | None:
    """``t``'s content sum (see the module), ``None`` when it has none to tell.

    Tensors that fill a run of memory (contiguous, or permuted: a transposed view) are summed
    over that run by the kernels on this thread (below a few MiB): torch shares even a 1 MiB
    sum between its threads, and in tensor mode waits for the one the dump writer's thread
    holds up (checks of the HF Llama's tensors seen again: 78 instead of 110 ms per forward),
    and sums a transposed view gathering it (3x slower). A float tensor, the common case,
    takes the shortest way there (a check costs 2 instead of 8 us besides its read)."""
    if (
        t.is_floating_point()  # its components are its elements
        and t.device.type == "cpu"
        and not t.is_neg()
        and _kernels.enabled()
        and (run := _memory_run(t.detach())) is not None
    ):
        array = run.view(_stats_pass.SIGNED_BITS[t.element_size()]).numpy()
        return wrapped(_numba_sum(array), array.itemsize)
    bits = _component_bits(t)
    if bits is None:
        return None
    size = bits.element_size()
    run = _memory_run(bits)
    if run is not None and _kernels.accepts_bits(bits):
        return wrapped(_numba_sum(run.numpy()), size)
    # other strided views: torch's integer sum in the components' own width
    return wrapped(int(bits.sum(dtype=torch.int32 if size <= 4 else torch.int64)), size)


def tensor_stats_and_content(
    t: torch.Tensor, content: bool = True
) -> tuple[_stats.TensorStats, int | None]:
    """:func:`~._stats.tensor_stats` of ``t`` and, with ``content``, its :func:`content_sum`,
    from one read of its elements."""
    stats, total = _stats.stats_with_bit_sum(t, bit_sum=content)
    if not content or t.is_conj() or t.is_neg():
        return stats, None
    return stats, wrapped(total, t.element_size() // (2 if t.is_complex() else 1))


def copy_with_content(t: torch.Tensor, content: bool = True) -> tuple[torch.Tensor, int | None]:
    """A contiguous copy of the CPU tensor ``t`` (its conjugate and negative bits resolved)
    and, with ``content``, ``t``'s content sum, computed while copying where the kernels run.
    The kernel copies bit patterns, so the copy is byte for byte ``t``'s memory (torch's copy
    of a bool tensor would make every nonzero byte 1)."""
    bits = _component_bits(t) if content else None
    if bits is None or not (bits.is_contiguous() and _kernels.accepts_bits(bits)):
        copy = t.detach().resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
        return copy, content_sum(t) if bits is not None else None
    copy = torch.empty(t.shape, dtype=t.dtype)
    source, target = bits.reshape(-1).numpy(), _component_bits(copy)
    assert target is not None
    into = target.reshape(-1).numpy()
    kernel, start = _kernels._jit()._copy_content_sum, _start(bits.element_size())

    def work(a: int, b: int) -> int:
        return int(kernel(source[a:b], into[a:b], start))

    return copy, wrapped(sum(_kernels.run_chunks(source.size, work)), bits.element_size())
