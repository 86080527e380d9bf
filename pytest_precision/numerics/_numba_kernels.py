"""The numba kernels behind :mod:`._kernels` (imported on first use: numba is optional).

Each kernel reads a chunk once, in blocks (``BLOCK_NUMEL`` elements): a branch-free loop
accumulates every sum and maximum of a block, assuming it finite; a block that proves otherwise
is redone element by element with the non-finite values counted and left out. Counting
elements above limits takes a second look at a block, only where its maxima say some element
can count. Per-element values are computed exactly as the torch pipeline computes them.

Element loops index with unsigned integers: numba's wraparound check for negative indices
would otherwise keep them from vectorizing (4-5x more instructions per element).

The constants imported from ``_kernels`` are frozen into the compiled code, and numba's disk
cache only notices changes to this file: after changing one of them there, touch this file (or
delete ``__pycache__/_numba_kernels.*.nb*``) or the cached kernels keep the old value.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._kernel_layout import (
    ABS_ERR,
    EXPONENT_BITS,
    FIVE_THOUSANDTH,
    FLOORED_REL_ERR,
    LOC_ABS,
    LOC_REL,
    LOC_ULP,
    MAX_ABS,
    MAX_REL,
    MAX_ULP,
    NONFINITE,
    OVER_FIVE_THOUSANDTH,
    OVER_THOUSANDTH,
    REL_ERR,
    RULES_START,
    THOUSANDTH,
    ULP_ERR,
)


@intrinsic
def _bits_of(typingctx: Any, x: Any) -> Any:
    """The IEEE bit pattern of a float64, as int64 (no conversion)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _float_of(typingctx: Any, x: Any) -> Any:
    """The float64 whose IEEE bit pattern is the int64 ``x``."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _as_type_of(typingctx: Any, like: Any, value: Any) -> Any:
    """The integer ``value`` as an integer of ``like``'s type (wrapping), so that arithmetic
    numba would widen to 64 bits stays in the lanes of a narrower type."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return context.cast(builder, args[1], signature.args[1], signature.return_type)

    return like(like, value), codegen


#: the element types a bfloat16 tensor is read as (its bit patterns)
_HALF_WORDS = (types.int16, types.uint16)


def _widened_bfloat16(builder: Any, bits: Any) -> Any:
    """The float32 bit pattern (an i32) of the bfloat16 whose bit pattern is ``bits``: its
    upper half."""
    return builder.shl(builder.zext(bits, ir.IntType(32)), ir.IntType(32)(16))


@intrinsic
def _value(typingctx: Any, x: Any) -> Any:
    """An element as float64: a float widened; an int16, the bfloat16 whose bit pattern it
    is (float32's upper half), so that a bfloat16 tensor is read in place, never widened into
    a buffer first. Both exact."""
    if isinstance(x, types.Float):

        def widen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return context.cast(builder, args[0], x, types.float64)

        return types.float64(x), widen
    if x in _HALF_WORDS:

        def decode(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            bits = _widened_bfloat16(builder, args[0])
            return builder.fpext(builder.bitcast(bits, ir.FloatType()), ir.DoubleType())

        return types.float64(x), decode
    return None


@intrinsic
def _key_bits(typingctx: Any, b: Any) -> Any:
    """An element's bit pattern as the integer its key is made from: a bfloat16's (an int16)
    as the float32 it widens to, any other as it is."""
    if b in _HALF_WORDS:

        def widen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return _widened_bfloat16(builder, args[0])

        return types.int32(b), widen
    if isinstance(b, types.Integer):
        return b(b), lambda context, builder, signature, args: args[0]
    return None


@intrinsic
def _prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """Ask the CPU to bring the cache line holding ``array[index]`` closer: a hint, which
    loads nothing into a register and never faults."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        hint = builder.module.declare_intrinsic(
            "llvm.prefetch",
            [byte_pointer],
            ir.FunctionType(ir.VoidType(), [byte_pointer] + [i32] * 3),
        )
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_pointer)
        # read, keep in all cache levels, data cache
        builder.call(hint, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


# IEEE division (x / 0 is inf, not an exception) and only reassociation: sums vectorize, while
# every per-element value (and NaN / inf handling) stays bit-for-bit what torch computes.
_jit = numba.njit(nogil=True, cache=True, fastmath={"reassoc"}, error_model="numpy")


@_jit
def _inverse_ulp(e_abs, ulp):
    # ulp(e) = 2 ** (exponent(e) - bits + 1), floored at the subnormal spacing; its inverse
    # is again a power of two (exponent field 2046 - E), so d * inverse == d / ulp exactly.
    ulp_bits = max((_bits_of(e_abs) & EXPONENT_BITS) - ulp[0], ulp[1])
    return _float_of((2046 << 52) - ulp_bits)


@_jit
def _element_errors(x, y, ulp):
    """|x - y|, |y|, the relative error (0 where both are 0) and the error in ULPs of one
    pair, exactly as the torch pipeline computes them."""
    d = abs(x - y)
    y_abs = abs(y)
    rel = d / y_abs if d != 0.0 else 0.0
    return d, y_abs, rel, d * _inverse_ulp(y_abs, ulp)


@_jit
def _pick(kind, d, rel, floored, ulp_err, excess):
    if kind == ABS_ERR:
        return d
    if kind == REL_ERR:
        return rel
    if kind == FLOORED_REL_ERR:
        return floored
    if kind == ULP_ERR:
        return ulp_err
    return excess  # ALLCLOSE_EXCESS


@_jit
def _compare_chunk(a, e, block, ulp, params, kinds, limits, acc, counts, locs, base):
    """Accumulate one chunk into ``acc`` / ``counts`` / ``locs`` (layouts in ``_kernels``).

    ``ulp`` holds the ULP's (offset, floor) bit patterns, ``params`` (small_value, rtol,
    1 / small_value), ``kinds`` / ``limits`` the rule.
    """
    n = a.size
    rtol = params[1]
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        ae, aa, ee, dd, sd, sr, su, md, mr, mu, mc = _block_sums(a, e, lo, hi, ulp, rtol, False)
        any_finite = True
        if not math.isfinite(aa + ee):  # a non-finite value (or a float64 overflow)
            any_finite = _count_non_finite(a, e, lo, hi, counts) < hi - lo
            ae, aa, ee, dd, sd, sr, su, md, mr, mu, mc = _block_sums(a, e, lo, hi, ulp, rtol, True)
        acc[0] += ae
        acc[1] += aa
        acc[2] += ee
        acc[3] += dd
        acc[4] += sd
        acc[5] += sr
        acc[6] += su
        if any_finite:
            # Blocks arrive in order, so a strict ">" keeps the first block of each maximum.
            if md > acc[MAX_ABS]:
                acc[MAX_ABS] = md
                locs[LOC_ABS] = base + lo
            if mr > acc[MAX_REL]:
                acc[MAX_REL] = mr
                locs[LOC_REL] = base + lo
            if mu > acc[MAX_ULP]:
                acc[MAX_ULP] = mu
                locs[LOC_ULP] = base + lo
        # Counting looks at every element again: only where the maxima say one can count
        # (the floored error is at most the relative one).
        needed = mr > THOUSANDTH
        for r in range(kinds.size):
            needed = needed or _pick(kinds[r], md, mr, mr, mu, mc) > limits[r]
        if needed:
            _count_block(a, e, lo, hi, ulp, params, kinds, limits, counts)


@_jit
def _block_sums(a, e, lo, hi, ulp, rtol, masked):
    """Sums and maxima of one block. ``masked`` reads pairs with a non-finite side as zero on
    both sides (left out of every numeric metric, as in the torch pipeline); it is constant
    in the loop, which LLVM then compiles twice, so the unmasked loop pays nothing for it.

    Maxima of values >= 0 are taken as maxima of their bit patterns (the same order), which
    vectorize where float max (with its NaN rules) does not; the excess is floored at 0."""
    ae = aa = ee = dd = sd = sr = su = 0.0
    kd = kr = ku = kc = 0
    for i in range(np.uint64(lo), np.uint64(hi)):
        x = np.float64(a[i])
        y = np.float64(e[i])
        if masked:
            finite = (abs(x) < math.inf) & (abs(y) < math.inf)
            x = x if finite else 0.0
            y = y if finite else 0.0
        d, y_abs, rel, u = _element_errors(x, y, ulp)
        ae += x * y
        aa += x * x
        ee += y * y
        dd += d * d
        sd += d
        sr += rel
        su += u
        kr = max(kr, _bits_of(rel))
        ku = max(ku, _bits_of(u))
        kd = max(kd, _bits_of(d))
        kc = max(kc, _bits_of(d - rtol * y_abs))
    md, mr, mu, mc = _float_of(kd), _float_of(kr), _float_of(ku), _float_of(kc)
    return ae, aa, ee, dd, sd, sr, su, md, mr, mu, mc


@_jit
def _first_at(a, e, ulp, column, best):
    """The first index, among pairs finite on both sides, whose absolute (``column`` 0) or
    relative (1) error is ``best`` (any such pair when ``best`` is 0), or -1: where in the
    block the comparison kernel located a maximum that maximum lies."""
    for i in range(a.size):
        x = np.float64(a[i])
        y = np.float64(e[i])
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        d, _, rel, _ = _element_errors(x, y, ulp)
        if best == 0.0 or (d if column == 0 else rel) == best:
            return i
    return -1


@_jit
def _count_non_finite(a, e, lo, hi, counts):
    """Count the non-finite values of a block per side and kind, the pairs where they differ
    (NaN and NaN, or the same infinity, agree), and return how many pairs have one."""
    pairs = 0
    for i in range(np.uint64(lo), np.uint64(hi)):
        x = np.float64(a[i])
        y = np.float64(e[i])
        if math.isfinite(x) and math.isfinite(y):
            continue
        _count_special(x, counts, NONFINITE.start)
        _count_special(y, counts, NONFINITE.start + 3)
        same = x == y or (math.isnan(x) and math.isnan(y))
        counts[NONFINITE.start + 6] += not same
        counts[NONFINITE.start + 7] += 1
        pairs += 1
    return pairs


@_jit
def _count_special(v, counts, at):
    """Count a non-finite ``v`` in ``counts[at]`` (NaN), ``[at + 1]`` (+inf) or ``[at + 2]``
    (-inf)."""
    if math.isnan(v):
        counts[at] += 1
    elif v == math.inf:
        counts[at + 1] += 1
    elif v == -math.inf:
        counts[at + 2] += 1


@_jit
def _count_block(a, e, lo, hi, ulp, params, kinds, limits, counts):
    """Count elements above 1e-3 / 5e-3 relative error and above each rule limit (the rule
    has ``RULE_SLOTS`` slots; unused ones have an infinite limit). Elements non-finite on
    either side are read as zero, as in the torch pipeline. Branch-free, so it vectorizes."""
    small, rtol, inv_small = params[0], params[1], params[2]
    k0, k1, k2, k3 = kinds[0], kinds[1], kinds[2], kinds[3]
    l0, l1, l2, l3 = limits[0], limits[1], limits[2], limits[3]
    over_thousandth = over_five_thousandth = c0 = c1 = c2 = c3 = 0
    for i in range(np.uint64(lo), np.uint64(hi)):
        x = np.float64(a[i])
        y = np.float64(e[i])
        finite = (abs(x) < math.inf) & (abs(y) < math.inf)
        x = x if finite else 0.0
        y = y if finite else 0.0
        d, y_abs, rel, u = _element_errors(x, y, ulp)
        floored = rel if y_abs >= small else d * inv_small  # exact: a power of two
        excess = d - rtol * y_abs
        over_thousandth += np.int64(rel > THOUSANDTH)
        over_five_thousandth += np.int64(rel > FIVE_THOUSANDTH)
        c0 += np.int64(_pick(k0, d, rel, floored, u, excess) > l0)
        c1 += np.int64(_pick(k1, d, rel, floored, u, excess) > l1)
        c2 += np.int64(_pick(k2, d, rel, floored, u, excess) > l2)
        c3 += np.int64(_pick(k3, d, rel, floored, u, excess) > l3)
    counts[OVER_THOUSANDTH] += over_thousandth
    counts[OVER_FIVE_THOUSANDTH] += over_five_thousandth
    counts[RULES_START] += c0
    counts[RULES_START + 1] += c1
    counts[RULES_START + 2] += c2
    counts[RULES_START + 3] += c3


@_jit
def _stats_chunk(x, bits, content_bits, sign_mask, block, acc, state, block_sums, with_content):
    """Sum and sum of squares (float64) of the finite elements into ``acc``; into ``state``
    their min and max as order-preserving integer keys of ``bits`` (``x`` viewed as integers;
    ``sign_mask`` flips the magnitude bits of negative values), the counts of NaN, +inf and
    -inf, then, ``with_content``, the sum of ``content_bits`` over every element (the tensor's
    own bit patterns: ``bits``, or a narrower float's before widening; the same modulo the
    content sum's width whatever the blocks), the content sum capture verifies reuse with, made
    here so that a tensor is read once for both (in the keys' integer lanes it costs 1 - 3 %
    of the pass; without it, LLVM compiles the loop without it).

    With rows in ``block_sums`` (one per block of ``x``), each block's two sums go to its row
    instead of ``acc``: threads that share a tensor's blocks leave the adding up to
    :func:`_add_block_sums`, in block order, so the result does not depend on the sharing.

    Integer keys keep the min / max exact and let them vectorize, which float min / max
    (with their NaN rules) do not. The next block is prefetched while one is summed: the loop
    does enough work per element that the memory would otherwise wait for it (measured: 15 -
    30 % faster on data not in cache; the sums are unchanged, the hint changes no value)."""
    n = x.size
    line = max(64 // x.itemsize, 1)
    for lo in range(0, n, block):
        for ahead in range(lo + block, min(lo + 2 * block, n), line):
            _prefetch(x, ahead)
        hi = min(lo + block, n)
        _block_into(x, bits, content_bits, sign_mask, lo, hi, lo // block, acc, state, block_sums,
                    with_content)  # fmt: skip


@_jit
def _stats_strided(base, shape, strides, sign_mask, block, lo, hi, acc, state, block_sums,
                   scratch, scratch_bits, with_content):  # fmt: skip
    """:func:`_stats_chunk` over elements ``lo:hi`` (``lo`` on a block boundary), in row-major
    order, of the view (``shape``, ``strides``) of the flat ``base``: each block is gathered into
    ``scratch`` (a block's worth, in cache; ``scratch_bits`` is it viewed as integers) and
    summed there exactly as in a contiguous tensor."""
    ndim = shape.size
    index = np.zeros(ndim, dtype=np.int64)
    rest = lo
    pos = 0
    for d in range(ndim - 1, -1, -1):
        index[d] = rest % shape[d]
        rest //= shape[d]
        pos += index[d] * strides[d]
    row, step = shape[ndim - 1], strides[ndim - 1]
    for start in range(lo, hi, block):
        n = min(block, hi - start)
        k = 0
        while k < n:
            take = min(row - index[ndim - 1], n - k)
            if step == 1:
                for i in range(np.uint64(take)):
                    scratch[np.uint64(k) + i] = base[np.uint64(pos) + i]
            else:
                for i in range(np.uint64(take)):
                    scratch[np.uint64(k) + i] = base[np.uint64(pos) + i * np.uint64(step)]
            k += take
            pos += take * step
            index[ndim - 1] += take
            d = ndim - 1
            while d > 0 and index[d] == shape[d]:  # carry into the dimensions before
                pos += strides[d - 1] - shape[d] * strides[d]
                index[d] = 0
                index[d - 1] += 1
                d -= 1
        row_of_block = (start - lo) // block
        _block_into(scratch, scratch_bits, scratch_bits, sign_mask, 0, n, row_of_block, acc,
                    state, block_sums, with_content)  # fmt: skip


@_jit
def _block_into(x, bits, content_bits, sign_mask, lo, hi, row, acc, state, block_sums,
                with_content):  # fmt: skip
    """One block of :func:`_stats_chunk`: its sums into ``acc``, or into row ``row`` of
    ``block_sums`` when it has rows."""
    total, squares, low, high, content = _stats_block(x, bits, content_bits, sign_mask, lo, hi,
                                                      state, False, with_content)  # fmt: skip
    state[5] += content  # over every element: the masked pass below leaves some out
    if not math.isfinite(total):  # a non-finite value (or a float64 overflow)
        for i in range(np.uint64(lo), np.uint64(hi)):
            _count_special(_value(x[i]), state, 2)
        total, squares, low, high, _ = _stats_block(x, bits, content_bits, sign_mask, lo, hi,
                                                    state, True, False)  # fmt: skip
    if block_sums.shape[0] > 0:
        block_sums[row, 0] = total
        block_sums[row, 1] = squares
    else:
        acc[0] += total
        acc[1] += squares
    state[0] = low
    state[1] = high


@numba.njit(nogil=True, cache=True)  # no fastmath: the additions stay in this order
def _add_block_sums(block_sums, acc):
    """Add the rows of ``block_sums`` to ``acc`` one by one, in order: the sums
    :func:`_stats_chunk` makes when it adds its blocks itself."""
    for j in range(block_sums.shape[0]):
        acc[0] += block_sums[j, 0]
        acc[1] += block_sums[j, 1]


@_jit
def _stats_block(x, bits, content_bits, sign_mask, lo, hi, keys, masked, with_content):
    """Sum, sum of squares and the min / max keys (from ``keys``) of one block, and the sum
    of its elements' ``content_bits`` (all of them) if ``with_content``; ``masked`` leaves
    non-finite values out of the rest (both constant in the loop: LLVM compiles a loop for each
    value, so a loop pays nothing for what it does not do).

    Keys and content are summed in the integer type of ``sign_mask`` (that of ``bits``): a
    float32 block's in int32 lanes, twice as many to a vector as int64 ones (the pass is a
    third faster). The content sum of components of up to 4 bytes wraps modulo 2**32 anyway,
    and the keys are the same numbers in either width."""
    total = squares = 0.0
    zero = _as_type_of(sign_mask, 0)
    low = sign_mask  # the largest key of its type
    high = _as_type_of(sign_mask, ~sign_mask)  # the smallest
    content = zero
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = _value(x[i])
        if with_content:
            content = _as_type_of(sign_mask, content + content_bits[i])
        if masked and not abs(v) < math.inf:
            continue
        total += v
        squares += v * v
        b = _key_bits(bits[i])
        key = _as_type_of(sign_mask, b ^ (sign_mask if b < zero else zero))
        low = min(low, key)
        high = max(high, key)
    low_key = min(keys[0], np.int64(low))
    return total, squares, low_key, max(keys[1], np.int64(high)), np.int64(content)


@_jit
def _content_sum(bits, start):
    """``start`` plus the integers ``bits`` (a tensor's components' bit patterns), wrapping in
    ``start``'s type: int32 for components of up to 4 bytes, whose content sum wraps modulo
    2**32 (int32 lanes hold twice as many as int64 ones: bf16 is summed twice as fast)."""
    content = start
    for i in range(np.uint64(bits.size)):
        content = _as_type_of(start, content + bits[i])
    return np.int64(content)


@_jit
def _copy_content_sum(bits, out, start):
    """Copy the integers ``bits`` into ``out`` and return :func:`_content_sum` of them: a
    tensor's private copy and its content sum from one read."""
    content = start
    for i in range(np.uint64(bits.size)):
        b = bits[i]
        out[i] = b
        content = _as_type_of(start, content + b)
    return np.int64(content)
