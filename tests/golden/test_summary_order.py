"""The golden summary lists a test's goldens in the order the test checked them (a model's
layers in forward order, the logits last), worst tests first."""

from __future__ import annotations

from typing import Any

from pytest_precision.report._goldens import record_order


def _record(test: str, name: str, status: str = "recorded") -> dict[str, Any]:
    return {"test": test, "name": name, "status": status, "message": ""}


def test_recorded_goldens_keep_the_order_of_the_test() -> None:
    checked = ["model.layers.0", "model.layers.1", "model.norm", "logits"]
    records = [_record("t.py::test_b", n) for n in checked] + [_record("t.py::test_a", "x")]
    ordered = sorted(records, key=record_order)
    assert [r["name"] for r in ordered] == ["x", *checked]


def test_a_failure_still_comes_first() -> None:
    records = [_record("t.py::test", "model.layers.0"), _record("t.py::test", "logits", "fail")]
    assert [r["name"] for r in sorted(records, key=record_order)] == ["logits", "model.layers.0"]
