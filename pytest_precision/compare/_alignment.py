"""Which call of the target is which call of the golden.

Calls are aligned by what they are, not by their names: one extra op in the target shifts every
later call counter (``Functional.linear.7`` becomes ``.8``), which must not turn into dozens of
false differences. A call's signature is its kind, its op (dunders stripped: ``x @ w`` is
``Tensor.matmul`` in our captures and ``Tensor.__matmul__`` in msprobe's), its module when both
dumps record one (so that neighbouring ops of the same kind in different modules do not pair),
the shapes of its outputs (a fused QKV projection does not pair with ``q_proj``'s) and, for an
op, the shapes of its tensor inputs (a reshape of the keys does not pair with a reshape of the
attention's output). Independent calls of one signature that the two runs made in another order
are then re-paired by content (:mod:`._permutations`).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Iterator, Sequence

from ..dump._records import Call
from ._permutations import repair
from ._results import PermutedCall

#: target calls in the order they finished, each with its golden partner (None: unmatched),
#: and the golden calls without a partner
Segment = tuple[list[tuple[Call | None, Call]], list[Call]]


def align(
    golden: Sequence[Call], target: Sequence[Call], *, with_dtypes: bool = False
) -> tuple[dict[tuple[int, int], Segment], list[PermutedCall]]:
    """Each (step, rank)'s aligned walk, in step then rank order, and the calls paired by
    content against their order. A (step, rank) that only one side has is a segment whose
    calls all lack a partner. ``with_dtypes`` (for runs that keep their dtypes) adds the
    output dtype to the signature of casts, so that a cast to float32 never pairs with a cast
    back to bfloat16."""
    with_module = all(c.module is not None for c in (*golden, *target) if c.kind != "Module")
    by_key: dict[tuple[int, int], tuple[list[Call], list[Call]]] = {}
    for side, calls in ((0, golden), (1, target)):
        for call in calls:
            by_key.setdefault((call.step, call.rank), ([], []))[side].append(call)
    segments: dict[tuple[int, int], Segment] = {}
    permuted: list[PermutedCall] = []
    for key in sorted(by_key):
        segments[key] = _align(*by_key[key], with_module, with_dtypes, permuted)
    return segments, permuted


def signature(call: Call, with_module: bool, with_dtypes: bool = False) -> Hashable:
    op = call.op[2:-2] if call.op.startswith("__") and call.op.endswith("__") else call.op
    module = call.module if call.kind == "Module" or with_module else None
    # a module is its path: what it returns may differ (attention weights an SDPA kernel
    # does not return, a static cache's keys over its padded length)
    shapes = () if call.kind == "Module" else tuple(r.shape for r in call.outputs if r.is_tensor)
    casts = with_dtypes and op in _CASTS
    dtypes = tuple(r.dtype for r in call.outputs if r.is_tensor) if casts else ()
    return call.kind, op, module, shapes, dtypes, _input_shapes(call)


def _input_shapes(call: Call) -> tuple[tuple[int, ...], ...]:
    """An op's tensor input shapes, in any order (a keyword on one side may be positional on
    the other): a matmul over a static cache's padded length, or a reshape of another tensor,
    is another computation whose output has the same shape. A module is its path: its
    inputs may differ too (a mask one attention implementation does not take). A mask
    argument is left out for ops too: one side passing it and the other ``None`` (or
    ``is_causal``) is the same attention, and the mask's values are judged as an argument."""
    if call.kind == "Module":
        return ()
    return tuple(sorted(r.shape or () for r in call.inputs if r.is_tensor and "mask" not in r.slot))


#: Ops that change a dtype: with ``with_dtypes`` their output dtype is part of what they are.
_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as"})


def _align(
    golden: list[Call],
    target: list[Call],
    with_module: bool,
    with_dtypes: bool,
    permuted: list[PermutedCall],
) -> Segment:
    # msprobe lists a module after its ops, our captures before them: align in one order
    golden, target = completion_order(golden), completion_order(target)
    g_sigs = [signature(c, with_module, with_dtypes) for c in golden]
    t_sigs = [signature(c, with_module, with_dtypes) for c in target]
    pairs, moved = repair(golden, target, g_sigs, _matching_blocks(g_sigs, t_sigs))
    permuted.extend(
        PermutedCall(
            golden[g].name, target[t].name, target[t].module, target[t].rank, target[t].step
        )
        for g, t in moved
    )
    partner = {id(target[t]): golden[g] for g, t in pairs}
    matched_golden = {g for g, _ in pairs}
    golden_only = [c for i, c in enumerate(golden) if i not in matched_golden]
    return [(partner.get(id(t)), t) for t in target], golden_only


def _matching_blocks(golden: list[Hashable], target: list[Hashable]) -> list[tuple[int, int]]:
    """Index pairs of an order-preserving alignment of equal signatures. The common head and
    tail are paired directly: difflib's cost grows with the square of what it is given."""
    head = 0
    while head < min(len(golden), len(target)) and golden[head] == target[head]:
        head += 1
    tail = 0
    while tail < min(len(golden), len(target)) - head and golden[-1 - tail] == target[-1 - tail]:
        tail += 1
    pairs = [(i, i) for i in range(head)]
    g_mid, t_mid = golden[head : len(golden) - tail], target[head : len(target) - tail]
    if g_mid and t_mid:
        matcher = difflib.SequenceMatcher(None, g_mid, t_mid, autojunk=False)
        for block in matcher.get_matching_blocks():
            pairs.extend((head + block.a + k, head + block.b + k) for k in range(block.size))
    pairs.extend((len(golden) - tail + k, len(target) - tail + k) for k in range(tail))
    return pairs


def completion_order(calls: list[Call]) -> list[Call]:
    """A module call finishes when every call inside it did; ops finish where they start.
    Works for calls listed by start (our captures) and by completion (msprobe's modules).

    "Inside" is the recorded nesting where the dump has it (each call's parent call): a module
    shared between layers (vLLM's one rotary embedding, named by its first owner's path) runs
    inside the layer that called it. Without it (msprobe), module paths decide."""
    parents = {c.name: c.records[0].parent for c in calls if c.records}
    nested = any(parent is not None for parent in parents.values())
    out: list[Call] = []
    open_modules: list[Call] = []
    for call in calls:
        while open_modules and not _inside(call, open_modules[-1], parents if nested else None):
            out.append(open_modules.pop())
        if call.kind == "Module":
            open_modules.append(call)
        else:
            out.append(call)
    out.extend(reversed(open_modules))
    return out


def _inside(call: Call, module_call: Call, parents: dict[str, str | None] | None) -> bool:
    if parents is not None:
        parent = parents.get(call.name)
        seen: set[str] = set()
        while parent is not None and parent not in seen:
            if parent == module_call.name:
                return True
            seen.add(parent)
            parent = parents.get(parent)
        return False
    path, module = call.module, module_call.module
    if path is None or module is None:
        return False
    if call.kind == "Module":  # the same module called again is a sibling, not a child
        return path.startswith(module + ".") or (module == "" and path != "")
    return module == "" or path == module or path.startswith(module + ".")


def lockstep(walks: list[list[tuple[Call | None, Call]]]) -> Iterator[tuple[WalkPart, bool]]:
    """The aligned walks of one step's ranks, in judging order: every rank's calls up to its
    next collective (``False``), then that collective on every rank together (``True``).
    A collective spreads one rank's error to all: the calls that fed it, on every rank, are
    judged before any rank's output of it."""
    epochs = [_epochs(walk) for walk in walks]
    for k in range(max((len(e) for e in epochs), default=0)):
        for e in epochs:
            if k < len(e) and e[k][0]:
                yield e[k][0], False
        together: WalkPart = [pair for e in epochs if k < len(e) and (pair := e[k][1]) is not None]
        if together:
            yield together, True


#: aligned pairs of a walk, in order
WalkPart = list[tuple[Call | None, Call]]


def _epochs(walk: WalkPart) -> list[tuple[WalkPart, tuple[Call, Call] | None]]:
    """A rank's walk cut at each matched collective: (the calls before it, the collective)."""
    out: list[tuple[WalkPart, tuple[Call, Call] | None]] = []
    before: WalkPart = []
    for g, t in walk:
        if g is not None and t.collective:
            out.append((before, (g, t)))
            before = []
        else:
            before.append((g, t))
    out.append((before, None))
    return out
