"""assert_deterministic on HF models, whose outputs carry a KV cache object (DynamicCache)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_zoo import wandering_llama  # noqa: E402

from pytest_precision import assert_deterministic  # noqa: E402

IDS = torch.tensor([[5, 17, 99, 3, 42]])


def test_a_model_whose_output_holds_a_kv_cache_is_deterministic() -> None:
    model = wandering_llama()
    output = model(IDS)
    assert type(output.past_key_values).__name__ == "DynamicCache"  # the premise
    assert_deterministic(model, IDS)


def test_a_cache_that_changes_between_runs_is_named() -> None:
    model = wandering_llama()
    noise = torch.Generator().manual_seed(0)  # not reseeded by the runs: differs each time

    def forward(ids: Any) -> Any:
        output = model(ids)
        values = output.past_key_values.layers[1].values
        values.add_(1e-6 * torch.randn(values.shape, generator=noise))
        return output

    # transformers 5.24 names the output field "cache", earlier versions "past_key_values"
    cache_values = r"\['(past_key_values|cache)'\]\.layers\[1\]\.values: "
    with pytest.raises(AssertionError, match=cache_values):
        assert_deterministic(forward, IDS)
