"""assert_close on nested values: paths, input errors, and the failure message."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from pytest_precision import PrecisionInputError, PrecisionWarning, assert_close, compare_tensors
from pytest_precision.numerics._assertions import compare, to_tensor

GEN = torch.Generator().manual_seed(7)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


class ModelOutput(OrderedDict):  # the shape of transformers.utils.ModelOutput: a dict subclass
    pass


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: tuple[torch.Tensor, ...]


def test_nested_structures_pass_and_name_the_failing_path() -> None:
    kv = [(randn(2, 3), randn(2, 3)) for _ in range(2)]
    expected = ModelOutput(logits=randn(4), past_key_values=kv)
    actual = ModelOutput(logits=expected["logits"].clone(), past_key_values=[list(p) for p in kv])
    assert_close(actual, expected)
    actual["past_key_values"][1][0] = kv[1][0] * 1.1
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, name="out")
    assert str(info.value).startswith("out['past_key_values'][1][0]: FAIL under the ratio")


def test_dataclass_fields_are_paths() -> None:
    expected = Out(randn(3), (randn(2), randn(2)))
    actual = Out(expected.logits, (expected.hidden[0], expected.hidden[1] + 1))
    with pytest.raises(AssertionError, match=r"^\.hidden\[1\]: FAIL"):
        assert_close(actual, expected)


def test_numbers_arrays_and_tensors_mix() -> None:
    assert_close(
        {"a": 1.0, "b": np.float32(2.0), "c": np.arange(3)},
        {"a": 1.0, "b": 2.0, "c": torch.arange(3)},
    )
    with pytest.raises(AssertionError, match="exact"):
        assert_close(3, 4)


def test_ml_dtypes_bfloat16_arrays_convert_bitwise() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = randn(100).bfloat16()
    array = t.float().numpy().astype(ml_dtypes.bfloat16)
    converted = to_tensor(array)
    assert converted.dtype == torch.bfloat16
    assert torch.equal(converted.view(torch.int16), t.view(torch.int16))


def test_mixed_precision_uses_the_lower_dtype_standard() -> None:
    golden = randn(256, 64)
    result = assert_close(golden.bfloat16(), golden)
    item = result.items[0].comparison
    assert item.dtype == torch.bfloat16
    assert item.verdict == "pass"


@pytest.mark.parametrize(
    ("actual", "expected", "message"),
    [
        (
            torch.zeros(3),
            torch.zeros(3, device="meta"),
            "expected is on the meta device and holds no values",
        ),
        (torch.zeros(3), torch.zeros(3, dtype=torch.int64), "dtype mismatch"),
        (torch.zeros(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.complex64), "complex"),
        ("abc", "abc", "cannot compare a value of type str"),
        (None, torch.zeros(1), "structure mismatch: actual is NoneType, expected is Tensor"),
        ([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)], "list of length 1"),
        ({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, "missing in actual: \\['b'\\]"),
        ([[1.0, 2.0], [3.0]], [[1.0, 2.0], [3.0, 4.0]], r"\[1\]: structure mismatch"),
        (np.array(["x"]), np.array(["x"]), "numpy dtype <U1 cannot be compared"),
        (np.ones(2, np.longdouble), np.ones(2), "numpy dtype float128 cannot be compared"),
        (2**70, 2**70, "does not fit in int64"),
        ([torch.zeros(1)], {0: torch.zeros(1)}, "structure mismatch: actual is list"),
        (torch.zeros(3).to_sparse(), torch.zeros(3), "actual is a torch.sparse_coo tensor"),
        (
            torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.quint8),
            torch.zeros(3),
            "actual is quantized",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(actual: object, expected: object, message: str) -> None:
    with pytest.raises(PrecisionInputError, match=message):
        assert_close(actual, expected)


def test_a_result_of_the_wrong_shape_is_an_assertion_failure() -> None:
    """As in torch.testing: a wrong shape is a wrong result, not a usage error (compare_tensors
    still raises PrecisionInputError: it cannot measure the pair)."""
    with pytest.raises(
        AssertionError, match=r"shape mismatch: actual \(2, 3\) vs expected \(3, 2\)"
    ):
        assert_close(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(PrecisionInputError, match="shape mismatch"):
        compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_is_reported() -> None:
    with pytest.raises(PrecisionInputError, match="device mismatch: actual on cpu"):
        assert_close(torch.zeros(3), torch.zeros(3, device="cuda"))


def test_message_contents_and_length() -> None:
    expected = randn(1000, 100)
    actual = expected.clone()
    actual[10, 20] = 100.0
    actual[999, 0] = math.nan
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, name="layer3")
    text = str(info.value)
    lines = text.splitlines()
    assert len(lines) <= 25, text
    assert lines[0] == "layer3: FAIL under the ratio standard (shape (1000, 100), float32)"
    assert "non-finite value(s) differ" in lines[1]
    assert "mismatched elements: 2 / 100000 (0.002 %)" in text
    assert "greatest abs error:" in text
    assert "at (10, 20) (actual 100," in text
    assert "would pass elementwise with atol >=" in text
    assert "first mismatches: (10, 20)" in text
    assert "(999, 0)" in text
    assert "relative error histogram:" in text
    assert "positions differ at 1 element(s)" in text


def test_warn_verdict_warns() -> None:
    expected = randn(10_000).abs() + 1
    actual = expected.clone()
    actual[:50] *= 1.009
    with pytest.warns(PrecisionWarning, match="WARN under the ratio standard"):
        assert_close(actual.bfloat16(), expected)


def test_reference_structures_walk_in_parallel() -> None:
    a, b = randn(32, 32), randn(32, 32)
    reference = {"y": a.double() @ b.double()}
    result = compare({"y": a @ b}, {"y": a @ b}, reference=reference, standard="reference")
    assert result.verdict == "pass"


def test_traceback_points_at_the_caller(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_precision import assert_close

        def test_it():
            assert_close(torch.ones(3) * 2, torch.ones(3))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*assert_close(torch.ones(3) * 2, torch.ones(3))*", "E   *FAIL under the ratio standard*"]
    )
    assert "_assertions.py" not in result.stdout.str()


def test_cyclic_structures_are_refused() -> None:
    cyclic: list[object] = [torch.zeros(1)]
    cyclic.append(cyclic)
    with pytest.raises(PrecisionInputError, match=r"\[1\]: the actual structure contains itself"):
        assert_close(cyclic, cyclic)


def test_reference_structure_mismatch_names_expected_and_reference() -> None:
    with pytest.raises(PrecisionInputError, match=r"expected is Tensor.*reference is list"):
        assert_close(torch.zeros(2), torch.zeros(2), reference=[torch.zeros(2)])


def test_numpy_byte_order_and_read_only_arrays(recwarn: pytest.WarningsRecorder) -> None:
    big_endian = np.arange(4, dtype=">f4")
    read_only = np.arange(4, dtype=np.float32)
    read_only.flags.writeable = False
    assert_close(big_endian, read_only)
    assert not recwarn.list


def test_empty_values_pass_under_every_standard() -> None:
    for standard in ("ratio", "ulp", "allclose", "exact"):
        assert assert_close(torch.empty(0, 3), torch.empty(0, 3), standard=standard).passed
