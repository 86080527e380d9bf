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
exactly. It is made once per *moment* (:meth:`RecordedTensors.begin_moment`): the records of
one call, between which nothing runs that could write memory; any other code may (a kernel
no capture sees, called from the forward's Python), so each call that reads a tensor checks it.

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

import itertools
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


#: A large parameter's sample reads its first and last ``_EDGE_WORDS`` 64-bit words (64 KiB
#: each) and one word in every ``_SAMPLE_STRIDE`` (8 KiB) between them.
_EDGE_WORDS = 8192
_SAMPLE_STRIDE = 1024

#: How a fingerprint was taken: the whole content sum, or a large parameter's sample.
_WHOLE, _SAMPLED = range(2)
Fingerprint = tuple[int, int]


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s memory as 64-bit words, if it is one contiguous, aligned run of them."""
    if not t.is_contiguous() or t.is_conj() or t.is_neg() or (t.numel() * t.element_size()) % 8:
        return None
    try:
        return t.detach().reshape(-1).view(torch.uint8).view(torch.int64)
    except RuntimeError:  # a storage offset not aligned to the word
        return None


def _is_large_parameter(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter its fingerprint samples (a plain tensor is never one: the
    test of its type comes first, since ``Parameter``'s own ``isinstance`` runs Python)."""
    return (
        type(t) is not torch.Tensor
        and isinstance(t, torch.nn.Parameter)
        and t.numel() * t.element_size() > 32 * _EDGE_WORDS
    )


def _sampled_sum(words: torch.Tensor) -> int:
    """A parameter's words summed over its edges and one word in every ``_SAMPLE_STRIDE``
    (by numpy, whose calls cost less than torch's: 8 instead of 15 us in cache)."""
    w = words.numpy()
    edges = int(w[:_EDGE_WORDS].sum()) + int(w[-_EDGE_WORDS:].sum())
    return edges + int(w[_EDGE_WORDS:-_EDGE_WORDS:_SAMPLE_STRIDE].sum())


def wants_content(t: torch.Tensor) -> bool:
    """Whether :meth:`RecordedTensors.remember` takes ``t``'s content sum: not for a tensor
    it never reuses (an inference tensor) nor for a large parameter, which it samples. The
    read that records ``t`` sums it only where it is wanted."""
    return not t.is_inference() and not _is_large_parameter(t)


def fingerprint(t: torch.Tensor, content: int | None = None) -> Fingerprint | None:
    """How ``t``'s fingerprint is taken, and its value (``None`` when it has none to tell):
    a large parameter's sample, else its whole content sum (``content`` when the caller has
    it already, from the read that summarized or copied ``t``).

    A decode step reads each weight once, and a whole sum would read it a second time for
    each later record of it (50 - 60 % more capture time per step; at the mix level a weight
    is recorded by its module and again by its op in every forward). The edges are where an
    overflow from a neighbouring buffer (a KV-cache write past its block) lands; a write into
    the middle of a weight that misses the sample goes unseen."""
    if _is_large_parameter(t) and (words := _words(t)) is not None:
        return _SAMPLED, _sampled_sum(words)
    content = content_sum(t) if content is None else content
    return None if content is None else (_WHOLE, content)


class _Entry:
    """What is known of the record of one geometry."""

    __slots__ = ("base", "fingerprint", "key", "label", "moment", "version")

    def __init__(
        self,
        base: weakref.ref[torch.Tensor],
        version: int,
        key: str,
        fingerprint: Fingerprint,
        label: str,
        moment: int,
    ) -> None:
        self.base = base  # the base, weakly: the entry goes with it
        self.version = version  # the base's version counter when recorded
        self.key = key  # the record key a tensor of this geometry reuses
        self.fingerprint = fingerprint
        self.label = label  # the record made then, for :attr:`RecordedTensors.changed_since`
        self.moment = moment  # the moment it was last verified in (0: none)

    def unchanged(self, t: torch.Tensor) -> bool:
        """Whether ``t`` still has this entry's fingerprint, taken by the same rule."""
        rule, value = self.fingerprint
        if rule == _WHOLE:
            return content_sum(t) == value
        words = _words(t)  # the parameter's geometry, if not the parameter itself
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
        self._entries: dict[Hashable, _Entry] = {}
        #: id of a base -> (weak reference with the clean-up callback, its geometries)
        self._bases: dict[int, tuple[weakref.ref[torch.Tensor], list[Hashable]]] = {}
        self._forget = forget  # told of each key that can no longer be returned
        self._any_shape = any_shape
        #: set by :meth:`key_of`: the label of the record a tensor was expected to equal when
        #: its content changed with no version bump (a stomp); else ``None``
        self.changed_since: str | None = None
        self._moment = 0  # the moment open (see :meth:`begin_moment`); 0: none
        self._depth = 0
        self._moments = itertools.count(1)

    def begin_moment(self) -> None:
        """Records from now until :meth:`end_moment` see the same memory: nothing that could
        write it runs between them (the slots of one call; the inputs and outputs of a view
        or copy, ``numerics``' :data:`~._op_names.OpInfo.writes_nothing`), so a tensor
        verified once among them is not read again. Nested moments are one."""
        if not self._depth:
            self._moment = next(self._moments)
        self._depth += 1

    def end_moment(self) -> None:
        self._depth -= 1
        if not self._depth:
            self._moment = 0

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
        if entry is None or entry.base() is not _base(t) or t._version != entry.version:
            return None
        moment = self._moment
        if moment and entry.moment == moment:  # verified in this moment already
            return entry.key
        if not entry.unchanged(t):  # written behind the version counter's back
            self.changed_since = entry.label
            return None
        entry.moment = moment
        return entry.key

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
        self._entries[geometry] = _Entry(known[0], t._version, key, taken, label, self._moment)
        if replaced is None or replaced.base is not known[0]:
            known[1].append(geometry)
        if replaced is not None:  # recorded again, changed: the old key can never be returned
            self._forget(replaced.key)

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
            if entry is not None and entry.base is ref:
                del self._entries[geometry]
                self._forget(entry.key)

    def clear(self) -> None:
        """Forget everything, telling no one (the capture is over)."""
        self._entries.clear()
        self._bases.clear()

    def __len__(self) -> int:
        return len(self._entries)
