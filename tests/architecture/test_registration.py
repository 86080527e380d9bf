"""Tables are complete where they are defined: no module has to be imported first for its side
effect (each check runs in a fresh interpreter, importing only the table's own module)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_precision import cli


def _fresh(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_float8_formats_are_in_the_dtype_table_without_the_metrics_module() -> None:
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch build has no float8")
    code = (
        "import sys, torch\n"
        "from pytest_precision.numerics._dtypes import FLOAT_FORMATS\n"
        "assert 'pytest_precision.numerics._measure' not in sys.modules\n"
        "print(FLOAT_FORMATS.get(torch.float8_e4m3fn))"
    )
    assert _fresh(code) == "(4, -6)"


def test_the_standards_table_is_complete_without_compare_tensors() -> None:
    pytest.importorskip("torch")
    code = (
        "import sys\n"
        "from pytest_precision.numerics._standard_names import STANDARDS\n"
        "assert 'pytest_precision.numerics._comparison' not in sys.modules\n"
        "print(sorted(STANDARDS))"
    )
    names = "['allclose', 'exact', 'precision_checker', 'ratio', 'reference', 'ulp']"
    assert _fresh(code) == names


def test_compare_offers_every_standard_a_dump_can_be_judged_by() -> None:
    from pytest_precision.numerics._standard_names import STANDARDS

    assert set(cli.COMPARE_STANDARDS) == set(STANDARDS) - {"reference"}
