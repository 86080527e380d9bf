"""The issue's bar, on a real tiny HF model (random init, greedy or seeded sampling)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from pytest_precision import (  # noqa: E402
    assert_close,
    assert_tokens_close,
    check_weights_loaded,
    compare_tokens,
    detect_symptoms,
    fingerprint_weights,
    first_divergent_token,
)
from pytest_precision.output._tokens import TokensDiverged  # noqa: E402

PAD = 0


def _prompts(rows: int = 8, length: int = 8) -> tuple[Any, Any]:
    """Left-padded prompts: row i has i % 4 pad tokens."""
    ids = torch.randint(3, 256, (rows, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for i in range(rows):
        ids[i, : i % 4] = PAD
        mask[i, : i % 4] = 0
    return ids, mask


def _generate(model: Any, processors: Any = None, **kwargs: Any) -> Any:
    ids, mask = _prompts()
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=24,
            logits_processor=processors,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )


def _brute_force(golden: list[int], target: list[int]) -> tuple[int | None, Any, Any]:
    def strip(row: list[int]) -> list[int]:
        while row and row[0] == PAD:
            row = row[1:]
        while row and row[-1] == PAD:
            row = row[:-1]
        return row

    g, t = strip(golden), strip(target)
    for i in range(max(len(g), len(t))):
        a = g[i] if i < len(g) else None
        b = t[i] if i < len(t) else None
        if a != b:
            return i, a, b
    return None, None, None


def test_first_divergent_token_of_a_perturbed_model_matches_a_brute_force_scan(
    tiny_llama: Any,
) -> None:
    perturbed = copy.deepcopy(tiny_llama)
    weight = perturbed.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(0.01 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(2)))
    golden, target = _generate(tiny_llama), _generate(perturbed)
    rows = first_divergent_token(golden.sequences, target.sequences, pad_id=PAD)
    assert len(rows) == 8
    for row, g, t in zip(rows, golden.sequences.tolist(), target.sequences.tolist(), strict=True):
        assert (row.position, row.golden_token, row.target_token) == _brute_force(g, t)
        if row.position is not None:  # the column indexes the padded batch as given
            assert g[row.golden_column] == row.golden_token
    diverged = [row for row in rows if row.diverged]
    assert 2 <= len(diverged) < 8  # the perturbation parts some rows, not all
    # with logits, each divergence is judged: a near tie or a real divergence
    result = compare_tokens(
        golden.sequences,
        target.sequences,
        golden_logprobs=golden.logits,
        target_logprobs=target.logits,
        pad_id=PAD,
    )
    for verdict, row in zip(result.rows, rows, strict=True):
        assert verdict.divergence == row
        if row.diverged:
            assert verdict.status in ("near-tie", "diverged", "logprobs")
            assert len(verdict.golden_top) == len(verdict.target_top) == 5
    # the same model twice passes, logprobs included
    assert_tokens_close(
        golden.sequences,
        _generate(tiny_llama).sequences,
        golden_logprobs=golden.logits,
        target_logprobs=golden.logits,
        pad_id=PAD,
    )


class _Temperature(transformers.LogitsProcessor):
    """Temperature scaling, right (divide) or with the bug this test plants (multiply)."""

    def __init__(self, temperature: float, *, bug: bool = False) -> None:
        self.temperature, self.bug = temperature, bug

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores * self.temperature if self.bug else scores / self.temperature


def _run(model: Any, *, bug: bool, sample: bool) -> Any:
    processors = transformers.LogitsProcessorList([_Temperature(0.5, bug=bug)])
    torch.manual_seed(1234)
    options = {"do_sample": True, "top_k": None, "top_p": None} if sample else {}
    return _generate(model, processors, **({"do_sample": False} | options))


def test_a_temperature_bug_passes_greedy_and_is_caught_when_sampling(tiny_llama: Any) -> None:
    greedy_golden = _run(tiny_llama, bug=False, sample=False)
    greedy_target = _run(tiny_llama, bug=True, sample=False)
    assert_tokens_close(greedy_golden.sequences, greedy_target.sequences, pad_id=PAD)

    golden = _run(tiny_llama, bug=False, sample=True)
    target = _run(tiny_llama, bug=True, sample=True)
    with pytest.raises(TokensDiverged) as failure:
        assert_tokens_close(
            golden.sequences,
            target.sequences,
            golden_logprobs=golden.scores,  # the processed scores the tokens were sampled from
            target_logprobs=target.scores,
            pad_id=PAD,
        )
    result = failure.value.result
    assert not result.passed
    message = str(failure.value)
    assert "diverge at position" in message or "logprobs differ" in message
    assert "top-5" in message
    # the same seed and the right temperature reproduce the golden exactly
    assert_tokens_close(golden.sequences, _run(tiny_llama, bug=False, sample=True).sequences)


def _split_qkv(fused: Any, heads: int, *, swap_first_head: bool) -> tuple[Any, Any, Any]:
    q, k, v = fused.chunk(3, dim=0)
    if swap_first_head:  # the bug: the first head's rows of q and k trade places
        rows = q.shape[0] // heads
        q, k = q.clone(), k.clone()
        q[:rows], k[:rows] = k[:rows].clone(), q[:rows].clone()
    return q, k, v


def test_a_q_k_row_swap_loads_every_key_but_the_fingerprint_names_it(
    tiny_llama: Any, tmp_path: Path
) -> None:
    # A checkpoint with fused qkv weights, converted by a loader with a wrong split.
    state = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    fused = {}
    for key in list(state):
        if key.endswith("self_attn.q_proj.weight"):
            base = key.removesuffix("q_proj.weight")
            parts = [state.pop(f"{base}{n}_proj.weight") for n in "qkv"]
            fused[f"{base}qkv_proj.weight"] = torch.cat(parts)
    path = tmp_path / "fused.safetensors"
    safetensors_torch.save_file({**state, **fused}, path)
    loaded = safetensors_torch.load_file(path)
    converted = {}
    for key, value in loaded.items():
        if key.endswith("qkv_proj.weight"):
            base = key.removesuffix("qkv_proj.weight")
            bug = "layers.1." in key
            q, k, v = _split_qkv(value, 4, swap_first_head=bug)
            converted |= {f"{base}q_proj.weight": q, f"{base}k_proj.weight": k}
            converted[f"{base}v_proj.weight"] = v
        else:
            converted[key] = value
    target = copy.deepcopy(tiny_llama)
    info = target.load_state_dict(converted, strict=True)
    assert not info.missing_keys
    assert not info.unexpected_keys
    assert check_weights_loaded(target, converted).passed  # every key loaded as given

    with pytest.raises(AssertionError) as failure:
        assert_close(fingerprint_weights(target), fingerprint_weights(tiny_llama))
    message = str(failure.value)
    assert "model.layers.1.self_attn.q_proj.weight" in message
    assert "model.layers.1.self_attn.k_proj.weight" in message
    assert "layers.0." not in message
    assert "v_proj" not in message


def test_a_missing_and_an_unexpected_key_appear_in_the_two_lists(
    tiny_llama: Any, tmp_path: Path
) -> None:
    tiny_llama.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    state = safetensors_torch.load_file(path)
    del state["model.norm.weight"]
    state["model.layers.0.mlp.gate_up_proj.weight"] = torch.zeros(256, 64)
    safetensors_torch.save_file(state, path, metadata={"format": "pt"})
    model, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    report = check_weights_loaded(model, path)
    assert report.missing == ("model.norm.weight",)
    assert report.unexpected == ("model.layers.0.mlp.gate_up_proj.weight",)
    assert set(report.missing) == set(info["missing_keys"])
    assert set(report.unexpected) == set(info["unexpected_keys"])
    assert report.loaded == len(state) - 1
    assert not report.shape_mismatches
    assert not report.not_loaded
    # the folder form reads the same shards
    assert check_weights_loaded(model, tmp_path).missing == ("model.norm.weight",)


def test_detectors_stay_silent_on_a_tiny_models_normal_output(tiny_llama: Any) -> None:
    out = _generate(tiny_llama)
    for row in out.sequences[:, 8:].tolist():
        assert detect_symptoms(row, pad_id=PAD) == []
