"""Tensors already recorded during a capture, so that one seen again unchanged is not redone.

The output of one op is the input of the next, a parameter is an input of every forward, and a
view (``x.view(...)``, ``x[0]``, ``x.transpose(1, 2)``) often lies exactly where a recorded
tensor lies: a tensor seen again reuses the data and statistics of its first record instead of
copying and summarizing it again. Reuse needs the same elements in the same order, read from
the same memory, unchanged since:

* the same *geometry*: data pointer (storage and offset), dtype, shape, strides and conj / neg
  bits; a contiguous tensor's elements are its flat run, so with ``any_shape`` (statistics
  mode, where nothing but the statistics is shared) its shape may differ (``x.view(2, -1)``);
* the same *base*: both are the same tensor or views of the same one (``Tensor._base``), and so
  share its version counter, which every in-place op bumps, through any view;
* the same version counter value as when the first was recorded;
* the same *content fingerprint*: the sum of its elements' bit patterns as integers (the
  content sum of ``numerics._content``).

The fingerprint catches what the version counter cannot see: writes through ``.data``, from
outside torch (a numpy view, a kernel writing out of bounds: a *stomp*). Such a tensor is
recorded anew, and :attr:`RecordedTensors.changed_since` names the record it no longer equals,
so the stomped values reach the dump and the record says where they changed. A new record's
fingerprint costs no read of its own: the statistics pass, or the private copy, computes it
while reading the tensor (:meth:`RecordedTensors.remember` takes it). Checking a tensor seen
again is one integer reduction over it, about as fast as a copy and several times cheaper than
its statistics (over a large parameter's edges and a sparse sample only: see
:func:`fingerprint`); it misses a write that only permutes elements or whose changes cancel
exactly.

Entries hold weak references to the base and go with it, so nothing is kept alive; the record
keys they hold are let go then (the writer drops what it kept for them).

``torch.distributed`` collectives bump no version counter either, and are recorded calls:
capture tells :meth:`RecordedTensors.forget` what they wrote. Inference tensors have no version
counter, and tensors with a conjugate or negative bit no fingerprint: neither is ever
reused. Nor is an accelerator's tensor: verifying
it would read its fingerprint back to the host, a synchronisation per record; each of its records
is reduced on the device instead (asynchronously), and a stomp there shows as a reader's record
that differs from its producer's, which the judge finds in the dump.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch

from ..numerics._content import content_sum
from . import _writer


def _base(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose version counter ``t`` shares: its base if it is a view, else itself."""
    base = t._base
    return t if base is None else base


#: A large parameter's fingerprint reads its first and last ``_EDGE_WORDS`` 64-bit words
#: (64 KiB each) and one word in every ``_SAMPLE_STRIDE`` (8 KiB) between them.
_EDGE_WORDS = 8192
_SAMPLE_STRIDE = 1024


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s memory as 64-bit words, if it is one contiguous, aligned run of them."""
    if not t.is_contiguous() or t.is_conj() or t.is_neg() or (t.numel() * t.element_size()) % 8:
        return None
    try:
        return t.detach().reshape(-1).view(torch.uint8).view(torch.int64)
    except RuntimeError:  # a storage offset not aligned to the word
        return None


def _sampled_words(t: torch.Tensor) -> torch.Tensor | None:
    """A large parameter's 64-bit words, which its fingerprint samples; ``None`` for any
    other tensor, whose fingerprint is its whole content sum.

    A decode step reads each weight once, and a full sum would read it a second time for each
    later record of it (50 - 60 % more capture time per step). The edges are where an
    overflow from a neighbouring buffer (a KV-cache write past its block) lands; a write into
    the middle of a weight that misses the sample goes unseen."""
    if not isinstance(t, torch.nn.Parameter):
        return None
    words = _words(t)
    return words if words is not None and words.numel() > 4 * _EDGE_WORDS else None


def _sampled_sum(words: torch.Tensor) -> int:
    """A parameter's words summed over its edges and one word in every ``_SAMPLE_STRIDE``."""
    edges = words[:_EDGE_WORDS].sum() + words[-_EDGE_WORDS:].sum()
    return int(edges + words[_EDGE_WORDS:-_EDGE_WORDS:_SAMPLE_STRIDE].sum())


def fingerprint(t: torch.Tensor, content: int | None = None) -> tuple[bool, int] | None:
    """Whether ``t``'s fingerprint is sampled, and its value (``None`` when it has none to
    tell): a large parameter's sampled sum, else its whole content sum (``content`` when the
    caller has it already, from the read that summarized or copied ``t``)."""
    words = _sampled_words(t)
    if words is not None:
        return True, _sampled_sum(words)
    content = content_sum(t) if content is None else content
    return None if content is None else (False, content)


def _same(t: torch.Tensor, expected: tuple[bool, int]) -> bool:
    """Whether ``t`` still has the fingerprint ``expected``, taken by the same rule."""
    sampled, value = expected
    if not sampled:
        return content_sum(t) == value
    words = _words(t)  # the same geometry as the parameter, if not the parameter itself
    return words is not None and _sampled_sum(words) == value


def _storage(t: torch.Tensor | None) -> int:
    """Where ``t``'s storage starts; 0 when it has none to tell."""
    try:
        return 0 if t is None else t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage
        return 0


class RecordedTensors:
    """Record keys of tensors by geometry, valid while their base is unchanged."""

    def __init__(self, forget: Callable[[str], None], *, any_shape: bool = False) -> None:
        #: geometry -> (the base, its version when recorded, record key, its fingerprint,
        #: the label of the record made then)
        self._entries: dict[
            Hashable, tuple[weakref.ref[torch.Tensor], int, str, tuple[bool, int], str]
        ] = {}
        #: id of a base -> (weak reference with the clean-up callback, its geometries)
        self._bases: dict[int, tuple[weakref.ref[torch.Tensor], list[Hashable]]] = {}
        self._forget = forget  # told of each key that can no longer be returned
        self._any_shape = any_shape
        #: set by :meth:`key_of`: the label of the record a tensor was expected to equal when
        #: its content changed with no version bump (a stomp); else ``None``
        self.changed_since: str | None = None

    def _geometry(self, t: torch.Tensor) -> Hashable | None:
        """Where and how ``t``'s elements lie; ``None`` for tensors without a data pointer."""
        try:
            pointer = t.data_ptr()
        except RuntimeError:  # a wrapper subclass without storage
            return None
        bits = (t.dtype, t.is_conj(), t.is_neg())
        if t.is_contiguous():
            return pointer, bits, t.numel() if self._any_shape else t.shape
        return pointer, bits, t.shape, t.stride()

    def key_of(self, t: torch.Tensor) -> str | None:
        """The key a tensor like ``t`` was recorded under, if unchanged since; else ``None``,
        with :attr:`changed_since` set when only its content changed."""
        self.changed_since = None
        geometry = self._geometry(t)
        entry = None if geometry is None else self._entries.get(geometry)
        if entry is None:
            return None
        ref, version, key, content, label = entry
        if ref() is not _base(t) or t._version != version:
            return None
        if not _same(t, content):  # written behind the version counter's back
            self.changed_since = label
            return None
        return key

    def remember(
        self, t: torch.Tensor, key: str, label: str = "", content: int | None = None
    ) -> None:
        """Note that ``t``, as it is now, was recorded under ``key`` (in the record ``label``,
        which :attr:`changed_since` gives back if its content changes unseen); ``content``
        is its content sum if the record's read computed it (else it is read here)."""
        if t.is_inference():  # no version counter: a later write would go unseen
            return
        if _writer.reduced_on_device(t):  # a fingerprint is a read back to the host per record
            return
        geometry = self._geometry(t)
        taken = None if geometry is None else fingerprint(t, content)
        if geometry is None or taken is None:
            return
        base = _base(t)
        known = self._bases.get(id(base))
        if known is None or known[0]() is not base:
            known = self._bases[id(base)] = (weakref.ref(base, self._died(id(base))), [])
        replaced = self._entries.get(geometry)
        self._entries[geometry] = (known[0], t._version, key, taken, label)
        if replaced is None or replaced[0] is not known[0]:
            known[1].append(geometry)
        if replaced is not None:  # recorded again, changed: the old key can never be returned
            self._forget(replaced[2])

    def forget(self, t: torch.Tensor) -> None:
        """``t`` was written without bumping its version counter (a ``torch.distributed``
        collective writes in place): nothing recorded of its memory is current, through any
        view of its base or any tensor sharing its storage (``.detach()`` has no base)."""
        storage = _storage(t)
        for ident, (ref, _) in list(self._bases.items()):
            base = ref()
            if base is t or base is _base(t) or (storage and _storage(base) == storage):
                self._drop(ident, ref)

    def written(self, t: torch.Tensor) -> None:
        """A recorded call wrote ``t`` without bumping its version counter (an op registered
        with an out argument, ``Tensor(a!)``, whose kernel writes the memory directly): nothing
        recorded of its base is current, and its new content is no stomp."""
        base = _base(t)
        known = self._bases.get(id(base))
        if known is not None and known[0]() is base:
            self._drop(id(base), known[0])

    def _died(self, ident: int) -> Callable[[Any], None]:
        def died(ref: Any) -> None:
            self._drop(ident, ref)

        return died

    def _drop(self, ident: int, ref: Any) -> None:
        """Forget every geometry recorded of the base ``ref`` (registered under ``ident``)."""
        known = self._bases.get(ident)
        if known is None or known[0] is not ref:
            return
        del self._bases[ident]
        for geometry in known[1]:
            entry = self._entries.get(geometry)
            if entry is not None and entry[0] is ref:
                del self._entries[geometry]
                self._forget(entry[2])

    def clear(self) -> None:
        """Forget everything, telling no one (the capture is over)."""
        self._entries.clear()
        self._bases.clear()

    def __len__(self) -> int:
        return len(self._entries)
