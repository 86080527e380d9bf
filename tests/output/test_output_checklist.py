"""Config and environment diffs, most likely culprit first."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_precision import (
    PrecisionInputError,
    assert_same_config,
    diff_configs,
    diff_environment,
    precision_environment,
)
from pytest_precision.output._checklist import ChecklistDiffers
from pytest_precision.runtime._devices import flat_fingerprint


def test_dict_diffs_are_ordered_by_how_often_they_cause_trouble() -> None:
    golden = {
        "hidden_size": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "eos_token_id": 2,
        "temperature": 1.0,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0",
        "extra": {"flag": True},
    }
    target = golden | {
        "hidden_size": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "eos_token_id": [2, 7],
        "temperature": 0.7,
        "torch_dtype": "float16",
        "transformers_version": "5.0.0",
        "extra": {"flag": False},
    }
    result = diff_configs(golden, target)
    assert [c.key for c in result.changes] == [
        "eos_token_id",
        "temperature",
        "torch_dtype",
        "rope_theta",
        "rms_norm_eps",
        "hidden_size",
        "extra.flag",
    ]
    assert result.changes[0].category == "special tokens and padding"
    assert result.changes[0].target == [2, 7]
    assert diff_configs(golden, golden).passed


def test_dataclasses_hf_configs_and_generation_configs() -> None:
    transformers = pytest.importorskip("transformers")

    @dataclasses.dataclass
    class Sampling:
        temperature: float = 1.0
        top_p: float = 1.0

    assert [c.key for c in diff_configs(Sampling(), Sampling(top_p=0.9)).changes] == ["top_p"]
    a = transformers.LlamaConfig(num_hidden_layers=2, rope_theta=10000.0)
    b = transformers.LlamaConfig(num_hidden_layers=2, rope_theta=500000.0, pad_token_id=0)
    changes = diff_configs(a, b).changes
    assert [c.category for c in changes] == ["special tokens and padding", "rotary embedding"]
    assert changes[0].key == "pad_token_id"
    assert changes[1].key.endswith("rope_theta")
    g1 = transformers.GenerationConfig(do_sample=False)
    g2 = transformers.GenerationConfig(do_sample=True, temperature=0.7)
    changes = diff_configs(g1, g2).changes
    assert {c.key for c in changes} >= {"do_sample", "temperature"}
    assert all(c.category == "sampling" for c in changes)
    with pytest.raises(ChecklistDiffers, match=r"\[sampling\] do_sample: False"):
        assert_same_config(g1, g2)


def test_a_value_that_cannot_be_diffed_is_named() -> None:
    with pytest.raises(PrecisionInputError, match="cannot diff a int"):
        diff_configs(3, {})


def test_environment_of_this_process_against_itself_is_empty() -> None:
    record = precision_environment()
    assert "libraries" in record
    assert "precision" in record
    assert "cpu" in record
    assert diff_environment(record, record).passed
    assert not diff_environment(record)  # b defaults to this process


def test_a_golden_flat_record_diffs_against_a_nested_one() -> None:
    recorded = flat_fingerprint()  # what a golden stores
    recorded["torch"] = "2.0.0"
    recorded["env.HCCL_DETERMINISTIC"] = "TRUE"
    current = precision_environment()
    result = diff_environment(recorded, current)
    keys = [c.key for c in result.changes]
    assert keys == ["torch", "env.HCCL_DETERMINISTIC"]  # versions first; libraries/cpu ignored
    assert result.changes[0].category == "library versions"
    assert result.changes[1].only == "golden"


def test_environment_changes_are_ordered() -> None:
    golden = {
        "libraries": {"transformers": "4.45.0"},
        "env": {"OMP_NUM_THREADS": "4", "CUBLAS_WORKSPACE_CONFIG": None},
        "precision": {"float32_matmul_precision": "highest"},
        "cpu": {"flags": {"avx512f": True}},
        "machine": "x86_64",
    }
    target = {
        "libraries": {"transformers": "5.0.0"},
        "env": {"OMP_NUM_THREADS": "8", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
        "precision": {"float32_matmul_precision": "high"},
        "cpu": {"flags": {"avx2": True}},
        "machine": "aarch64",
    }
    keys = [c.key for c in diff_environment(golden, target).changes]
    assert keys == [
        "libraries.transformers",
        "machine",
        "precision.float32_matmul_precision",
        "env.CUBLAS_WORKSPACE_CONFIG",
        "env.OMP_NUM_THREADS",
        "cpu.flags.avx2",
        "cpu.flags.avx512f",
    ]
