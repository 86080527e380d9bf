"""How a dump comparison (:class:`DumpComparison`) reads: in a terminal, JSON, CSV."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from .._atomic import atomic_write
from .._text import shown, shown_text, spreadsheet_cell
from ..numerics._comparison import TensorComparison

if TYPE_CHECKING:
    from ..compare._results import (
        Divergence,
        DumpComparison,
        ErrorGrowth,
        LayerError,
        ModelMismatch,
        ParameterDifference,
        RecordComparison,
    )

#: How many unmatched call names the summary spells out.
_SHOWN_UNMATCHED = 3

#: How many layers of the error growth the summary spells out.
_SHOWN_LAYERS = 8


def dump_comparison_text(result: DumpComparison, *, worst: int = 5) -> str:
    """What was compared, the first divergence (or why there is none), the worst records.
    Every name from the dumps is shown with its control characters escaped (:func:`shown`)."""
    golden, target = result.golden, result.target
    lines = [
        f"golden:  {shown(golden.path)} ({golden.format}, {len(golden.calls)} calls)",
        f"target:  {shown(target.path)} ({target.format}, {len(target.calls)} calls)",
        f"aligned: {result.matched_calls} calls{_unmatched(result)}",
        f"records: {len(result.records)} compared: "
        + ", ".join(f"{n} {status}" for status, n in result.counts().items()),
    ]
    if result.different_models is not None:
        return shown_text("\n".join([*lines, _different_models(result.different_models)]))
    lines += _incomplete(result)
    lines += _permuted(result)
    lines += _derived(result)

    lines += _layouts(result)
    if result.padding is not None:
        lines.append(result.padding.line)
    divergence = result.first_divergence
    lines += _divergence_lines(divergence) if divergence else [_no_divergence(result)]
    if result.inputs_diverged is not None:
        d = result.inputs_diverged
        lines.append(f"inputs diverged: {_clip(shown(d.reason))}")
    failing = worst_calls(result.records)
    if failing and worst > 0:
        lines.append(f"worst calls ({min(worst, len(failing))} of {len(failing)} with failures):")
        lines += [f"  {_record_line(r)}" for r in failing[:worst]]
    return shown_text("\n".join(lines))


def _different_models(mismatch: ModelMismatch) -> str:
    """One line: the dumps are of different models, and a few parameters that say so."""
    shown_ones = [_parameter(d) for d in mismatch.differing[:_SHOWN_UNMATCHED]]
    more = len(mismatch.differing) - len(shown_ones)
    examples = "; ".join(shown_ones) + (f"; +{more} more" if more > 0 else "")
    return (
        f"not the same model: {len(mismatch.differing)} of {mismatch.compared} parameters "
        f"differ in name or shape ({examples}); no call was judged"
    )


def _parameter(d: ParameterDifference) -> str:
    rank = f" (rank {d.rank})" if d.rank else ""
    if d.golden_shape is None:
        return f"{shown(d.name)}{rank} only in the target"
    if d.target_shape is None:
        return f"{shown(d.name)}{rank} only in the golden"
    return f"{shown(d.name)}{rank} {d.target_shape} vs {d.golden_shape}"


def _incomplete(result: DumpComparison) -> list[str]:
    if result.matched_calls == 0:
        return ["incomplete: no call of one dump matches a call of the other"]
    return [
        f"incomplete: step {step} rank {rank} is only in the {side} ({calls} calls not compared)"
        for side, step, rank, calls in result.one_sided[:_SHOWN_UNMATCHED]
    ]


def _permuted(result: DumpComparison) -> list[str]:
    """Independent calls the runs made in another order, said once (information)."""
    if not result.permuted:
        return []
    shown_pairs = ", ".join(
        f"{shown(p.golden)} = {shown(p.target)}" for p in result.permuted[:_SHOWN_UNMATCHED]
    )
    extra = len(result.permuted) - _SHOWN_UNMATCHED
    more = f", +{extra} more" if extra > 0 else ""
    return [
        f"reordered: {len(result.permuted)} independent calls made in another order, paired "
        f"by content (golden = target: {shown_pairs}{more})"
    ]


def _derived(result: DumpComparison) -> list[str]:
    """Differing inputs with no recorded producer that were matched to a recorded output."""
    if not result.derived:
        return []
    first = result.derived[0]
    return [
        f"derived: {len(result.derived)} differing inputs without a recorded producer inherit "
        f"a recorded output's error (first: {shown(first.name)} {shown(first.slot)}, "
        f"{_clip(shown(first.derived))})"
    ]


def worst_calls(records: list[RecordComparison]) -> list[RecordComparison]:
    """The worst failing record of each call (one tensor is often one call's output and the
    next call's input: listing both says nothing new), worst first."""
    by_call: dict[tuple[int, int, str], RecordComparison] = {}
    for r in records:
        if not r.failed:
            continue
        key = (r.rank, r.step, r.name)
        kept = by_call.get(key)
        if kept is None or (r.error_level, r.slot.startswith("output")) > (
            kept.error_level,
            kept.slot.startswith("output"),
        ):
            by_call[key] = r
    return sorted(by_call.values(), key=lambda r: r.error_level, reverse=True)


def shard_failure_text(
    where: str, culprits: list[Divergence], records: list[RecordComparison], *, limit: int = 5
) -> str:
    """Why a shard of a distributed comparison fails: the calls its own records prove guilty.
    The first divergence is judged across every shard, once all are measured."""
    failing = sum(r.failed for r in records)
    calls = "call is guilty on its" if len(culprits) == 1 else "calls are guilty on their"
    lines = [
        f"{where}: {len(culprits)} {calls} own records "
        f"({failing} of {len(records)} records fail the standard)"
    ]
    for d in culprits[:limit]:
        lines.append(f"  {shown(d.name)} [{shown(d.module or '(top level)')}]: {shown(d.rule)}")
        lines.append(f"    {_clip(shown(d.reason), 400)}")
    if len(culprits) > limit:
        lines.append(f"  ... {len(culprits) - limit} more guilty calls")
    lines.append(
        "the first divergence (which may lie in an earlier shard) is judged across all shards "
        "in the session's summary"
    )
    return shown_text("\n".join(lines))


def _unmatched(result: DumpComparison) -> str:
    if not result.unmatched:
        return ""
    parts = []
    for side in ("golden", "target"):
        names = [shown(u.name) for u in result.unmatched if u.side == side]
        if names:
            listed = ", ".join(names[:_SHOWN_UNMATCHED])
            extra = len(names) - _SHOWN_UNMATCHED
            more = f", +{extra} more" if extra > 0 else ""
            parts.append(f"{len(names)} only in the {side} ({listed}{more})")
    return "; " + "; ".join(parts)


def _layouts(result: DumpComparison) -> list[str]:
    merged = result.layouts
    if merged is None:
        return []
    line = (
        f"layouts: golden {merged.golden_ranks} rank(s), target {merged.target_ranks}: each "
        "merged into one logical run (shards concatenated, partial sums added)"
    )
    if merged.placed:
        line += f"; {merged.placed} record(s) placed by the layouts capture recorded"
    if merged.left_out:
        listed = ", ".join(shown(k) for k in merged.left_out[:_SHOWN_UNMATCHED])
        line += (
            f"; {len(merged.left_out)} partial sum(s) or overlapping pieces without data "
            f"left out ({listed})"
        )
    return [line]


def _divergence_lines(d: Divergence) -> list[str]:
    where = f"step {d.step} rank {d.rank}"
    if d.ranks:
        where = f"step {d.step}, target rank(s) {', '.join(map(str, d.ranks))}"
    renamed = "" if d.golden_name == d.name else f" (golden: {shown(d.golden_name)})"
    lines = [
        f"first divergence: {shown(d.name)}{renamed}, {where}",
        f"  module: {shown(d.module or '(top level)')}    layer: {shown(d.layer or '(none)')}",
        f"  cause:  {d.cause}: {_clip(shown(d.reason), 400)}",
        f"  rule:   {shown(d.rule)}",
    ]
    if isinstance(d.metrics, TensorComparison):
        lines.append(f"  metrics: {tensor_metrics(d.metrics)}")
    if d.growth is not None and d.growth.layers:
        lines.append(f"  growth: {_growth(d.growth)}")
    return lines


def _growth(growth: ErrorGrowth) -> str:
    """Each layer's output error after the culprit, and where it passes the gross limit."""
    steps = len({x.step for x in growth.layers}) > 1

    def label(x: LayerError) -> str:  # decode steps repeat the layers: say which step each is
        return f"{shown(x.layer)} (step {x.step})" if steps else shown(x.layer)

    layers = [f"{label(x)} {x.error_level:.3g}" for x in growth.layers[:_SHOWN_LAYERS]]
    more = len(growth.layers) - _SHOWN_LAYERS
    path = " -> ".join(layers) + (f" -> ... ({more} more)" if more > 0 else "")
    explodes = growth.explodes
    where = (
        f"exceeds the gross limit {growth.gross:.3g} at {label(explodes)}"
        if explodes is not None
        else f"stays below the gross limit {growth.gross:.3g}"
    )
    return f"{path}; {where}"


def _no_divergence(result: DumpComparison) -> str:
    failing = result.counts()["fail"]
    if not failing:
        return "no divergence: every compared record is within the standard"
    if result.verdict == "inconclusive":
        return (
            f"inconclusive: {failing} record(s) differ beyond the standard and no call is proven "
            f"guilty, but {len(result.unverified)} drifting call(s) could not be rerun (first: "
            f"{shown(result.unverified[0])}); they were cleared only because they did not amplify "
            f"their inputs' error 100x. {_remedy(result)}"
        )
    return (
        f"no divergence: {failing} record(s) differ beyond the standard, but no call is guilty: "
        "each carried the drift of its inputs without adding error of its own (noise)"
    )


def _remedy(result: DumpComparison) -> str:
    """What capture would let every call be rerun."""
    target = result.target
    op_level = any(c.kind != "Module" for c in target.calls)
    has_data = any(r.loader is not None for r in target.records)
    if not has_data:
        return "Capture tensors (mode='tensor') so that they can be rerun"
    if not op_level:
        return "Capture at the op or mix level: modules are not rerun, their ops are"
    return "Those ops cannot be rerun here (see the unverified list)"


def tensor_metrics(m: TensorComparison) -> str:
    index = "" if m.max_abs_index is None else f" at {tuple(m.max_abs_index)}"
    return (
        f"cosine {m.cosine:.6g}, max abs err {m.max_abs_err:.3g}{index}, "
        f"max rel err {m.max_rel_err:.3g}, RMSE {m.rmse:.3g}, SQNR {m.sqnr_db:.3g} dB"
    )


def _record_line(r: RecordComparison) -> str:
    module = f" [{shown(r.module)}]" if r.module else ""
    return _clip(f"{shown(r.name)}.{shown(r.slot)}{module}: {shown(r.reason)}")


def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def write_dump_comparison_json(result: DumpComparison, path: Path) -> None:
    """The whole comparison as one JSON document, written atomically."""
    document = {
        "golden": str(result.golden.path),
        "target": str(result.target.path),
        "verdict": result.verdict,
        "passed": result.passed,
        "complete": result.complete,
        "counts": result.counts(),
        "matched_calls": result.matched_calls,
        "first_divergence": _divergence_dict(result.first_divergence),
        "inputs_diverged": _divergence_dict(result.inputs_diverged),
        "different_models": (
            None if result.different_models is None else result.different_models.to_dict()
        ),
        "one_sided": [
            {"side": side, "step": step, "rank": rank, "calls": calls}
            for side, step, rank, calls in result.one_sided
        ],
        "unmatched": [vars(u) for u in result.unmatched],
        "permuted": [vars(p) for p in result.permuted],
        "derived": [vars(d) for d in result.derived],
        "unverified": result.unverified,
        "padding": None if result.padding is None else vars(result.padding),
        "records": [r.to_dict() for r in result.records],
    }
    atomic_write(path, (json.dumps(document, indent=1) + "\n").encode())


def _divergence_dict(d: Divergence | None) -> dict[str, object] | None:
    if d is None:
        return None
    return {
        "name": d.name,
        "golden_name": d.golden_name,
        "module": d.module,
        "layer": d.layer,
        "rank": d.rank,
        "ranks": list(d.ranks),
        "step": d.step,
        "cause": d.cause,
        "rule": d.rule,
        "reason": d.reason,
        "record": d.record.to_dict(),
        "growth": None if d.growth is None else d.growth.to_dict(),
    }


def write_dump_comparison_csv(result: DumpComparison, path: Path) -> None:
    """One row per compared record (spreadsheet-ready), written atomically. A name from the
    dump that starts like a formula is written as text (see :func:`spreadsheet_cell`); rows
    end in CRLF (RFC 4180), so that a cell holding a CR or LF is quoted and splits no row."""
    rows = [{k: spreadsheet_cell(v) for k, v in r.to_dict().items()} for r in result.records]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, buffer.getvalue().encode())
