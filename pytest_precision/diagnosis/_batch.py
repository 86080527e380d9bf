"""Batch invariance, judged: the same prompt alone and inside batches of other prompts.

Serving stacks answer a prompt differently alone and in a batch. Most of the time that is
reduction-order noise (a kernel tiles its reduction by batch size); sometimes it is a bug (a
padding mask ignored, a row that reads its neighbour, state shared across rows). Each prompt is
run alone and as one row of batches of the other prompts (padded to the longest), both captured;
the prompt's rows are cut out of the batched dump (:mod:`..dump._rows`) and compared with the
alone run by :func:`compare_dumps`, the same judge as two devices. A case is

* ``invariant``: every record of the prompt's rows is bitwise what it was alone;
* ``noise``: records differ, but no call is guilty; the first batch-variant call (its inputs
  bitwise equal, its output not: the kernel whose reduction order follows the batch) is named;
* ``bug``: a call is guilty, with its module and cause;
* ``inconclusive``: the comparison could not clear every drifting call.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from .._errors import PrecisionInputError
from .._text import shown
from ..compare._dumps import compare_dumps
from ..compare._results import Divergence, DumpComparison, RecordComparison
from ..dump._capture import capture
from ..dump._load import load_dump
from ..dump._rows import PaddingSide, RowLayout, row_view
from ..numerics._standards import Standard, StandardName
from ..output._common import OutputCheckFailed, as_int_list

BatchVerdict = Literal["invariant", "noise", "bug", "inconclusive"]
#: worst first: the verdict of several cases is the worst of theirs
_SEVERITY: tuple[BatchVerdict, ...] = ("bug", "inconclusive", "noise", "invariant")

Forward = Callable[[torch.nn.Module, dict[str, torch.Tensor]], object]


@dataclass(frozen=True)
class BatchCase:
    """One prompt (``prompt``: its index) as row ``row`` of a batch of ``batch_size``,
    padded by ``padding`` tokens, against the same prompt alone."""

    prompt: int
    batch_size: int
    row: int
    padding: int
    verdict: BatchVerdict
    #: the first call whose inputs were bitwise what they were alone and whose output was not
    first_variant: RecordComparison | None
    comparison: DumpComparison
    #: modules whose calls mix rows (an MoE dispatch), judged by their inputs and outputs only
    opaque: tuple[str, ...] = ()

    @property
    def divergence(self) -> Divergence | None:
        return self.comparison.first_divergence


@dataclass(frozen=True)
class BatchInvariance:
    """Every case of :func:`check_batch_invariance`; ``verdict`` is the worst of them."""

    cases: tuple[BatchCase, ...]

    @property
    def verdict(self) -> BatchVerdict:
        return worst(case.verdict for case in self.cases)

    @property
    def first_bug(self) -> BatchCase | None:
        return next((case for case in self.cases if case.verdict == "bug"), None)


class BatchVariant(OutputCheckFailed):
    """:func:`assert_batch_invariant` failed; ``result`` is the :class:`BatchInvariance`."""


def check_batch_invariance(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    *,
    batch_sizes: Sequence[int] = (2, 4),
    needles: Sequence[int] | None = None,
    padding_side: PaddingSide = "left",
    pad_token_id: int | None = None,
    standard: Standard | StandardName | None = None,
    forward: Forward | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> BatchInvariance:
    """Run each prompt of ``needles`` (indices into ``prompts``; all by default) alone and as
    a row of a batch of each size in ``batch_sizes`` (its neighbours: the next prompts, in
    turn), and judge its rows against the alone run (see the module docstring).

    ``forward(model, inputs)`` runs one batch (default: ``model(**inputs, use_cache=False)``
    with ``input_ids``, ``attention_mask`` and, where the model takes them, ``position_ids``
    counted from each row's first real token, as ``generate`` does). Dumps are written under
    ``out`` and kept, or in a temporary folder removed at the end.
    """
    rows = [as_int_list(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    chosen = _needles(needles, len(rows))
    sizes = _batch_sizes(batch_sizes)
    if len(rows) < 2:
        raise PrecisionInputError("prompts: batch invariance needs at least two prompts")
    if any(not row for row in rows):
        raise PrecisionInputError("prompts: every prompt needs at least one token")
    pad = _pad_id(model, pad_token_id)
    run = forward or _default_forward(model)
    folder = Path(tempfile.mkdtemp(prefix="precision-batch-")) if out is None else Path(out)
    try:
        cases = []
        for needle in chosen:
            alone = _captured(model, run, [rows[needle]], pad, padding_side, folder / f"p{needle}")
            for size in sizes:
                batch, row = _batch_of(rows, needle, size)
                dump = _captured(
                    model, run, batch, pad, padding_side, folder / f"p{needle}-b{size}"
                )
                layout = RowLayout(size, row, len(rows[needle]), max(map(len, batch)), padding_side)
                case = _judge(needle, layout, alone, dump, standard)
                cases.append(case)
                if progress is not None:
                    progress(case_line(case))
        return BatchInvariance(tuple(cases))
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)


def assert_batch_invariant(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    *,
    allow_noise: bool = True,
    **options: Any,
) -> BatchInvariance:
    """:func:`check_batch_invariance`, raising :class:`BatchVariant` on a bug or an
    inconclusive case (and on noise, with ``allow_noise=False``: bitwise batch invariance)."""
    result = check_batch_invariance(model, prompts, **options)
    allowed = {"invariant", "noise"} if allow_noise else {"invariant"}
    failing = [case for case in result.cases if case.verdict not in allowed]
    if failing:
        raise BatchVariant(batch_message(result, failing), result)
    return result


def batch_message(result: BatchInvariance, cases: Sequence[BatchCase] | None = None) -> str:
    """The verdict and one line per case (``cases``: those to list, all by default)."""
    listed = result.cases if cases is None else cases
    head = f"batch invariance: {result.verdict} in {len(listed)} of {len(result.cases)} cases"
    if cases is None:
        head = f"batch invariance: {result.verdict} ({len(result.cases)} cases)"
    return "\n".join([head, *(f"  {case_line(case)}" for case in listed)])


def _judge(
    needle: int,
    layout: RowLayout,
    alone: Path,
    batched: Path,
    standard: Standard | StandardName | None,
) -> BatchCase:
    view = row_view(load_dump(alone), load_dump(batched), layout)
    comparison = compare_dumps(view.alone, view.batched, standard=standard)
    verdict, variant = judged(comparison)
    return BatchCase(
        prompt=needle,
        batch_size=layout.batch,
        row=layout.row,
        padding=layout.padded - layout.length,
        verdict=verdict,
        first_variant=variant,
        comparison=comparison,
        opaque=view.opaque,
    )


def worst(verdicts: Iterable[BatchVerdict]) -> BatchVerdict:
    """The worst of ``verdicts`` (``invariant`` for none)."""
    seen = set(verdicts)
    return next((v for v in _SEVERITY if v in seen), "invariant")


def judged(comparison: DumpComparison) -> tuple[BatchVerdict, RecordComparison | None]:
    """The verdict of one comparison of the same request run two ways, and its first
    variant call (see the module docstring)."""
    variant = _first_variant(comparison.records)
    if comparison.verdict == "divergence":
        return "bug", variant
    if comparison.verdict != "pass":
        return "inconclusive", variant
    if variant is None and all(r.error_level == 0.0 for r in comparison.records):
        return "invariant", None
    return "noise", variant


def _first_variant(records: Sequence[RecordComparison]) -> RecordComparison | None:
    """The first output record, in execution order, of an op whose inputs are bitwise equal
    and whose output is not: where the batch changed the arithmetic."""
    calls: dict[tuple[int, int, str], list[RecordComparison]] = {}
    for record in records:
        if record.kind != "Module":
            calls.setdefault((record.step, record.rank, record.name), []).append(record)
    for members in calls.values():
        inputs = [r for r in members if r.slot.startswith(("input", "kwargs"))]
        if any(r.error_level != 0.0 for r in inputs):
            continue
        changed = [r for r in members if r.slot.startswith("output") and r.error_level != 0.0]
        if changed:
            return changed[0]
    return None


def case_line(case: BatchCase) -> str:
    where = f"prompt {case.prompt} as row {case.row} of {case.batch_size}"
    if case.padding:
        where += f" ({case.padding} pad tokens)"
    return verdict_line(where, case, "first batch-variant call")


class _Judged(Protocol):
    @property
    def verdict(self) -> BatchVerdict: ...
    @property
    def first_variant(self) -> RecordComparison | None: ...
    @property
    def comparison(self) -> DumpComparison: ...


def verdict_line(where: str, case: _Judged, variant_call: str) -> str:
    """``where``, then the case's verdict with the call it names (the guilty one of a bug, the
    first that varies of noise; ``variant_call`` says what the latter is called)."""
    d = case.comparison.first_divergence
    if case.verdict == "bug" and d is not None:
        return f"{where}: bug at {shown(d.module or '(root)')} ({shown(d.name)}): {shown(d.reason)}"
    if case.verdict == "inconclusive":
        return f"{where}: inconclusive ({case.comparison.verdict})"
    if case.first_variant is not None:
        v = case.first_variant
        call = f"{shown(v.name)} in {shown(v.module or '(root)')}"
        return f"{where}: {case.verdict}, {variant_call} {call}"
    return f"{where}: {case.verdict}"


def _captured(
    model: torch.nn.Module,
    run: Forward,
    rows: list[list[int]],
    pad: int,
    side: PaddingSide,
    path: Path,
) -> Path:
    inputs = _padded_batch(rows, pad, side)
    with torch.no_grad(), capture(model, path, level="mix", mode="tensor"):
        run(model, inputs)
    return path


def _padded_batch(
    rows: Sequence[Sequence[int]], pad: int, side: PaddingSide
) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` of ``rows`` padded to the longest
    on ``side``; positions count from each row's first real token, as ``generate`` does."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        start = length - len(row) if side == "left" else 0
        ids[i, start : start + len(row)] = torch.tensor(row)
        mask[i, start : start + len(row)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def _default_forward(model: torch.nn.Module) -> Forward:
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters

    def run(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> object:
        given = (
            dict(inputs)
            if takes_positions
            else {k: v for k, v in inputs.items() if k != "position_ids"}
        )
        return module(**given, use_cache=False)

    return run


def _batch_of(rows: list[list[int]], needle: int, size: int) -> tuple[list[list[int]], int]:
    """A batch of ``size`` rows with the needle in the middle row and the prompts after it,
    in turn, around it."""
    others = [rows[(needle + k) % len(rows)] for k in range(1, size)]
    row = (size - 1) // 2
    return [*others[:row], rows[needle], *others[row:]], row


def _needles(needles: Sequence[int] | None, count: int) -> list[int]:
    if needles is None:
        return list(range(count))
    chosen = list(needles)
    bad = [n for n in chosen if not isinstance(n, int) or not 0 <= n < count]
    if bad or not chosen:
        raise PrecisionInputError(f"needles: indices into the {count} prompts, got {needles!r}")
    return chosen


def _batch_sizes(sizes: Sequence[int]) -> list[int]:
    chosen = list(sizes)
    if not chosen or any(isinstance(s, bool) or not isinstance(s, int) or s < 2 for s in chosen):
        raise PrecisionInputError(f"batch_sizes: whole numbers of at least 2, got {sizes!r}")
    return chosen


def _pad_id(model: torch.nn.Module, pad_token_id: int | None) -> int:
    """The pad token: ``pad_token_id``, else the config's pad or end-of-text token where the
    embedding has it (a config can name an id its tiny vocabulary lacks), else 0. Padded
    positions are masked, so any id the embedding holds serves a correct model."""
    if pad_token_id is not None:
        return pad_token_id
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int) and (not isinstance(vocab, int) or 0 <= value < vocab):
            return value
    return 0
