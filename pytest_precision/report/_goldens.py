"""How the session's golden comparisons read: the terminal summary and the JSON report.

The goldens plugin collects one record (a JSON-ready dict) per comparison, from this process or
from xdist workers; these functions render them. Torch-free: the plugin imports it in every run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from .._text import shown, shown_text
from ..golden._active import STATUSES, UPDATED
from ..golden._layout import SCHEMA_VERSION


def record_order(record: dict[str, Any]) -> tuple[Any, ...]:
    """Worst first: by status, then the share of mismatched elements, then cosine, then test;
    a stable sort keeps a test's goldens in the order the test checked them (forward order for
    a model's layers, not alphabetical: ``logits`` last)."""
    worst = record.get("worst", {})
    cosine = worst.get("cosine", 1.0)
    numel = worst.get("numel") or 1
    return (
        STATUSES.index(record["status"]),
        -worst.get("mismatch_count", 0) / numel,
        cosine if isinstance(cosine, float) else -1.0,
        record["test"],
    )


def golden_report_document(
    records: list[dict[str, Any]],
    *,
    golden_dir: Path | None,
    update: bool,
    unused: list[PurePosixPath] | None,
    pruned: list[str],
    left_alone: Sequence[PurePosixPath] = (),
) -> str:
    """The ``--precision-report`` JSON file's text. A value whose write failed is a record
    with status ``error`` and ``"unwritten": true``."""
    content = {
        "schema": SCHEMA_VERSION,
        "golden_dir": None if golden_dir is None else str(golden_dir),
        "update": update,
        "comparisons": records,
        "unused_goldens": None if unused is None else [str(p) for p in unused],
        "pruned": pruned,
        "left_alone": [str(p) for p in left_alone],
        "unwritten": sum(bool(r.get("unwritten")) for r in records),
    }
    return json.dumps(content, indent=2, sort_keys=True) + "\n"


def golden_summary_lines(
    records: list[dict[str, Any]],
    *,
    golden_dir: Path | None,
    unused: list[PurePosixPath] | None,
    pruned: list[str],
    prune_skipped_because: str | None,
    report_path: Path | None,
    left_alone: Sequence[PurePosixPath] = (),
    legacy: Sequence[PurePosixPath] = (),
    missing_dir: bool = False,
) -> list[str]:
    """The terminal summary: one line per comparison (worst first), updates, unused goldens."""
    lines = [_summary_line(record) for record in records]
    if missing_dir:
        lines.append(
            f"the golden directory {golden_dir} does not exist: record the goldens with "
            "--golden-update (or fix --golden-dir / golden_dir)"
        )
    updated = [r for r in records if r["status"] in UPDATED]
    unwritten = sum(bool(r.get("unwritten")) for r in records)
    if updated or unwritten:
        remeasured = sum(r["status"] == "remeasured" for r in updated)
        lines.append(
            f"golden update: recorded {sum(r['status'] == 'recorded' for r in updated)}, "
            f"rewrote {sum(r['status'] == 'rewritten' for r in updated)} value(s) "
            f"in {golden_dir}"
            + (f"; re-measured the envelope of {remeasured} kept value(s)" if remeasured else "")
            + (f"; FAILED to write {unwritten} value(s) (see the errors)" if unwritten else "")
        )
    if legacy:
        lines.append(
            f"{len(legacy)} golden(s) read at the older layout's path (the test file without .py); "
            "--golden-update moves them to their current path:"
        )
        lines += [f"  {path}" for path in legacy]
    if unused:
        verb = "deleted" if pruned else "delete them with --golden-prune"
        lines.append(f"unused goldens (no collected test uses them; {verb}):")
        lines += [f"  {path}" for path in unused]
    if left_alone:
        lines.append(
            "left alone (no collected test uses them, but they are not provably goldens: no "
            "pytest-precision metadata; never deleted):"
        )
        lines += [f"  {path}" for path in left_alone]
    if prune_skipped_because is not None:
        lines.append(
            "--golden-prune deleted nothing: unused goldens need a full run of a golden "
            f"directory ({prune_skipped_because})"
        )
    if report_path is not None:
        lines.append(f"precision report written to {report_path}")
    return [shown_text(line) for line in lines]


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _summary_line(record: dict[str, Any]) -> str:
    head = f"{record['status'].upper():<9} {shown(record['test'])} {shown(record['name'])}"
    masked = record.get("masked")
    if masked:
        head += f" ({masked['left_out']}/{masked['positions']} masked positions left out)"
    worst = record.get("worst")
    if worst is None or record.get("unwritten"):
        return f"{head}: {shown(record['message'].splitlines()[0]) if record['message'] else ''}"
    where = f"{shown(worst['path'])} " if worst["path"] else ""
    return (
        f"{head} [{record['standard']}] {where}cosine {_number(worst['cosine'])} "
        f"max abs {_number(worst['max_abs_err'])} max rel {_number(worst['max_rel_err'])} "
        f"mismatched {worst['mismatch_count']}/{worst['numel']}"
    )
