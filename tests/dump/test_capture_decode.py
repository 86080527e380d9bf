"""Decode with a KV cache: ``capture(..., step_per_forward=True)`` around ``model.generate``
records the prefill and each decode step as steps 0..N, HF caches are recorded as their
tensors, goldens store outputs that carry a cache, and the growth line says which step each
layer's row belongs to."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import hf_zoo
import pytest
import torch

from pytest_precision import Golden, Record, capture, compare_dumps, load_dump
from pytest_precision.numerics._nested import StoredCache, flatten
from pytest_precision.report import render

NEW_TOKENS = 3
PROMPT = hf_zoo.SEQ
ARCHS = ("llama", "gpt2")  # GPT-2: 4 key/value heads, its own attention and cache call
TEST_ID = "tests/test_decode.py::test_cache"


def _prompt() -> torch.Tensor:
    return hf_zoo.inputs()["input_ids"][:1]


def _generate(model: torch.nn.Module, cache_implementation: str | None = None) -> Any:
    with torch.no_grad():
        return model.generate(
            _prompt(),
            cache_implementation=cache_implementation,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            return_dict_in_generate=True,
        )


def _captured_generate(
    model: torch.nn.Module, path: Path, cache_implementation: str | None = None, **options: Any
) -> Any:
    with capture(model, path, step_per_forward=True, **options):
        return _generate(model, cache_implementation)


def _root(records: list[Record], model: torch.nn.Module) -> dict[tuple[int, str], Record]:
    """The top-level forward's records by (step, slot)."""
    name = f"Module.{type(model).__name__}.forward.0"
    return {(r.step, r.slot): r for r in records if r.name == name}


@pytest.fixture(scope="module", params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_one_step_per_forward_prefill_then_one_token_each(arch: str, tmp_path: Path) -> None:
    model = hf_zoo.build(arch)
    _captured_generate(model, tmp_path / "d")
    dump = load_dump(tmp_path / "d")
    assert sorted(Counter(r.step for r in dump.records)) == list(range(NEW_TOKENS))
    root = _root(dump.records, model)
    assert root[(0, "kwargs.input_ids")].shape == (1, PROMPT)
    for step in range(1, NEW_TOKENS):
        assert root[(step, "kwargs.input_ids")].shape == (1, 1)
    # each step's forward is a fresh call: counters restart, so the steps line up
    assert all(r.name.endswith(".0") for r in root.values())


def test_without_the_option_generate_stays_in_one_step(tmp_path: Path) -> None:
    """The default: forwards belong to the step the caller is in (only it knows)."""
    model = hf_zoo.build("llama")
    with capture(model, tmp_path / "d", level="module"):
        _generate(model)
    assert {r.step for r in load_dump(tmp_path / "d").records} == {0}


def test_steps_pick_among_the_forwards(tmp_path: Path) -> None:
    model = hf_zoo.build("llama")
    _captured_generate(model, tmp_path / "d", steps=[2], level="module")
    records = load_dump(tmp_path / "d").records
    assert records
    assert {r.step for r in records} == {2}
    assert _root(records, model)[(2, "kwargs.input_ids")].shape == (1, 1)


def test_the_cache_is_recorded_as_its_tensors(arch: str, tmp_path: Path) -> None:
    model = hf_zoo.build(arch)
    generated = _captured_generate(model, tmp_path / "d")
    root = _root(load_dump(tmp_path / "d").records, model)
    final = generated.past_key_values
    layers = len(final.layers)
    assert layers == hf_zoo.LAYERS
    kv_heads = final.layers[0].keys.shape[1]
    for step in range(NEW_TOKENS):
        for layer in range(layers):
            for field in ("keys", "values"):
                # the cache the step wrote: the prompt plus one slot per decode step so far
                out = root[(step, f"output.0.cache.layers.{layer}.{field}")]
                assert out.shape == (1, kv_heads, PROMPT + step, hf_zoo.HEAD_DIM)
                if step:  # the cache the step read: what the step before wrote
                    read = root[(step, f"kwargs.cache.layers.{layer}.{field}")]
                    assert read.shape == (1, kv_heads, PROMPT + step - 1, hf_zoo.HEAD_DIM)
                    before = root[(step - 1, f"output.0.cache.layers.{layer}.{field}")]
                    assert torch.equal(read.load(), before.load())
    last = NEW_TOKENS - 1
    for layer in range(layers):
        # the last step's cache holds every token but the last generated one
        recorded = root[(last, f"output.0.cache.layers.{layer}.keys")].load()
        assert torch.equal(recorded, final.layers[layer].keys[:, :, : PROMPT + last])
    # the prefill read an empty cache: its slots are there, without tensors
    assert not root[(0, "kwargs.cache.layers.0.keys")].is_tensor
    assert not any(isinstance(r.value, str) and "Cache" in r.value for r in root.values())
    assert not any(isinstance(r.value, str) and "Layer" in r.value for r in root.values())


def test_a_layer_records_only_its_own_cache_layer(arch: str, tmp_path: Path) -> None:
    """Every decoder layer is handed the whole cache but reads only its own layer: recording
    the others would make each layer's input differ when one layer's cache does."""
    model = hf_zoo.build(arch)
    _captured_generate(model, tmp_path / "d")
    records = load_dump(tmp_path / "d").records
    cache_slots: dict[str, set[str]] = {}
    for r in records:
        if r.kind == "Module" and r.step == 1 and ".cache.layers." in r.slot:
            layer = r.slot.split(".cache.layers.")[1].split(".")[0]
            cache_slots.setdefault(r.module or "", set()).add(layer)
    inside_a_layer = {m: re.search(r"\.(\d+)(\.|$)", m) for m in cache_slots}
    blocks = {m: found.group(1) for m, found in inside_a_layer.items() if found}
    assert set(blocks.values()) == {str(i) for i in range(hf_zoo.LAYERS)}
    for module, index in blocks.items():
        assert cache_slots[module] == {index}, module
    everything = {str(i) for i in range(hf_zoo.LAYERS)}
    assert all(cache_slots[m] == everything for m, found in inside_a_layer.items() if not found)


def test_a_static_cache_is_recorded_at_its_full_length_as_each_step_wrote_it(
    tmp_path: Path,
) -> None:
    model = hf_zoo.build("llama")
    _captured_generate(model, tmp_path / "d", level="module", cache_implementation="static")
    root = _root(load_dump(tmp_path / "d").records, model)
    length = PROMPT + NEW_TOKENS - 1  # the static cache holds what generate will need
    for step in range(1, NEW_TOKENS):
        read = root[(step, "kwargs.cache.layers.1.keys")]
        wrote = root[(step, "output.0.cache.layers.1.keys")]
        assert read.shape == wrote.shape == (1, hf_zoo.KV_HEADS, length, hf_zoo.HEAD_DIM)
        before, after = read.load(), wrote.load()
        written = PROMPT + step - 1  # the slot this step wrote in place
        assert torch.equal(before, root[(step - 1, "output.0.cache.layers.1.keys")].load())
        assert not torch.equal(before[:, :, written], after[:, :, written])
        assert torch.equal(before[:, :, :written], after[:, :, :written])


def test_two_clean_captures_of_generate_compare_clean(arch: str, tmp_path: Path) -> None:
    model = hf_zoo.build(arch)
    _captured_generate(model, tmp_path / "golden")
    _captured_generate(hf_zoo.build(arch), tmp_path / "target")
    result = compare_dumps(tmp_path / "golden", tmp_path / "target")
    assert result.passed, render(result)
    assert {r.step for r in result.records} == set(range(NEW_TOKENS))
    assert any(".cache.layers.1.values" in r.slot for r in result.records)


def test_a_golden_of_an_output_with_a_cache_round_trips(tmp_path: Path) -> None:
    model = hf_zoo.build("llama")
    with torch.no_grad():
        output = model(_prompt(), use_cache=True)
    assert Golden(tmp_path, TEST_ID, update=True)(output, "out") is None
    stored = Golden(tmp_path, TEST_ID).load("out")
    assert isinstance(stored["cache"], StoredCache)
    assert stored["cache"].kind == type(output.cache).__name__
    paths = dict(flatten(output))
    assert "['cache'].layers[1].values" in paths
    for path, leaf in flatten(stored):
        assert torch.equal(leaf, paths[path]), path
    comparison = Golden(tmp_path, TEST_ID)(output, "out")
    assert comparison is not None
    assert comparison.verdict == "pass"
    assert any(item.path == "['cache'].layers[0].keys" for item in comparison.items)
    output.cache.layers[1].values.mul_(1.01)  # a cache slot written wrong fails the golden
    with pytest.raises(AssertionError, match=r"out\['cache'\]\.layers\[1\]\.values"):
        Golden(tmp_path, TEST_ID)(output, "out")


def test_growth_rows_name_their_step_and_the_model_row_is_its_logits(tmp_path: Path) -> None:
    golden = hf_zoo.build("llama")
    _captured_generate(golden, tmp_path / "golden", level="module")
    target = hf_zoo.build("llama")
    with torch.no_grad():
        target.lm_head.weight[3] += 0.05  # a bug at the very end: the logits carry it
    _captured_generate(target, tmp_path / "target", level="module")
    result = compare_dumps(tmp_path / "golden", tmp_path / "target")
    d = result.first_divergence
    assert d is not None
    assert d.growth is not None
    rows = {(x.step, x.layer): x.error_level for x in d.growth.layers}
    assert {step for step, _ in rows} == set(range(NEW_TOKENS))
    for step in range(NEW_TOKENS):
        assert rows[(step, "(top level)")] > 0  # was the cache's repr string, at 0
        assert rows[(step, "(top level)")] >= rows[(step, "lm_head")]
    text = render(result)
    assert "lm_head (step 0)" in text
    assert "(step 1)" in text
