"""Buffers filled after their allocation (issue #23 item 3): DeepSeek's latent attention
allocates ``key_states = kv.new_empty(...)`` and fills it slice by slice. A view of the unwritten
buffer, or the buffer while partly written, is recorded without data; once every byte was
written it is data, and not taken for a weight by the comparison."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from hf_bugs import threads
from hf_zoo import SEED, _common, inputs

from pytest_precision import capture, compare_dumps, load_dump
from pytest_precision.dump._uninitialized import UninitializedMemory
from pytest_precision.report import render

K = 3


class _Concat(torch.nn.Module):
    """``torch.cat`` spelled as DeepSeek-V3's ``expand_kv`` does: slices of a ``new_empty``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        buf = a.new_empty(*a.shape[:-1], a.shape[-1] + b.shape[-1])
        buf[..., :K].copy_(a)
        buf[..., K:].copy_(b)
        return buf * 2.0


def _records(path: Path) -> list[dict[str, object]]:
    lines = (path / "rank0" / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _allocated(memory: UninitializedMemory, shape: tuple[int, ...]) -> torch.Tensor:
    buf = torch.empty(shape)
    memory.after_call("Torch.empty", (shape,), {}, buf)
    return buf


def test_a_slice_is_written_only_when_all_its_bytes_were() -> None:
    memory = UninitializedMemory()
    buf = _allocated(memory, (2, 5))
    assert memory.state(buf[:, :K]) == "unwritten"
    memory.after_call("Tensor.__getitem__", (buf, (Ellipsis, slice(None, K))), {}, buf[:, :K])
    assert memory.state(buf) == "unwritten"  # reading a view writes nothing
    left = buf[:, :K]
    memory.after_call("Tensor.copy_", (left, torch.ones(2, K)), {}, left)
    assert memory.state(left) is None
    assert memory.state(buf[:, K:]) == "unwritten"
    assert memory.state(buf) == "partly written"
    assert memory.state(buf[0, K - 1 : K + 1]) == "partly written"
    right = buf[:, K:]
    memory.after_call("Tensor.copy_", (right, torch.ones(2, 5 - K)), {}, right)
    assert memory.state(buf) == "filled"
    assert not memory.holds(buf)


def test_setitem_and_index_put_write_only_what_they_address() -> None:
    memory = UninitializedMemory()
    buf = _allocated(memory, (4, 2))
    memory.after_call("Tensor.__setitem__", (buf, 1, torch.zeros(2)), {}, None)
    assert memory.state(buf[1]) is None
    assert memory.state(buf[0]) == "unwritten"
    index = (torch.tensor([0, 2]),)
    memory.after_call("Tensor.index_put_", (buf, index, torch.zeros(2, 2)), {}, buf)
    assert memory.state(buf[2]) is None
    assert memory.state(buf[3]) == "unwritten"
    memory.after_call("Tensor.fill_", (buf[3], 0.0), {}, buf[3])
    assert memory.state(buf) == "filled"


def test_one_write_of_the_whole_buffer_leaves_nothing_to_note() -> None:
    memory = UninitializedMemory()
    buf = _allocated(memory, (3,))
    memory.after_call("Tensor.copy_", (buf, torch.ones(3)), {}, buf)
    assert memory.state(buf) is None


def test_a_byte_view_of_another_dtype_follows_the_bytes() -> None:
    memory = UninitializedMemory()
    buf = _allocated(memory, (2,))  # float32: 8 bytes
    raw = buf.view(torch.uint8)
    memory.after_call("Tensor.fill_", (raw[:4], 0), {}, raw[:4])
    assert memory.state(buf[0]) is None
    assert memory.state(buf[1]) == "unwritten"


def test_memory_is_tracked_while_its_allocation_lives() -> None:
    """Once what ``empty`` returned is gone, its memory may be handed out again by calls
    capture does not see: a tensor found there is not taken for garbage."""
    memory = UninitializedMemory()
    buf = _allocated(memory, (4,))
    alias = buf.detach()  # shares the storage, keeps no reference to ``buf``
    assert memory.state(alias) == "unwritten"
    del buf
    gc.collect()
    assert memory.state(alias) is None


class _ViewedOutput(torch.nn.Module):
    """vLLM's attention: ``out = torch.empty(...)``, then ``out = out.view(...)`` (the tensor the
    ``empty`` op returned is gone, its view holds the memory), then a kernel fills the view."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], x.shape[1] * x.shape[2])
        out = out.view(x.shape)
        return out.copy_(x * 2)


def test_a_view_keeps_its_buffer_tracked_after_the_allocation_is_dropped(
    tmp_path: Path,
) -> None:
    model = _ViewedOutput()
    with torch.no_grad(), capture(model, tmp_path / "dump", level="mix"):
        model(torch.randn(3, 2, 4))
    memory = {(r["name"], r["slot"]): r.get("memory") for r in _records(tmp_path / "dump")}
    assert memory[("Tensor.copy_.0.forward", "input.0")] == "unwritten"


def _capture(path: Path, a: torch.Tensor, b: torch.Tensor) -> Path:
    model = _Concat()
    with torch.no_grad(), capture(model, path, level="mix"):
        model(a, b)
    return path


def test_capture_records_unwritten_views_without_data(tmp_path: Path) -> None:
    a, b = torch.randn(2, 4, K), torch.randn(2, 4, 2)
    records = _records(_capture(tmp_path / "dump", a, b))
    memory = {(r["name"], r["slot"]): r.get("memory") for r in records}
    assert memory[("Tensor.__getitem__.0.forward", "output.0")] == "unwritten"
    assert memory[("Tensor.__getitem__.1.forward", "input.0")] == "partly written"
    assert memory[("Tensor.__getitem__.1.forward", "output.0")] == "unwritten"
    assert memory[("Tensor.copy_.1.forward", "output.0")] == "filled"
    assert memory[("Tensor.mul.0.forward", "input.0")] == "filled"
    for r in records:
        if r.get("memory") in ("unwritten", "partly written"):
            assert r["data"] is None, r
            assert r["stats"] is None, r
    loaded = load_dump(tmp_path / "dump")
    mul = next(r for r in loaded if r.name == "Tensor.mul.0.forward" and r.slot == "input.0")
    assert mul.memory == "filled"
    expected = torch.cat((a, b), dim=-1)
    assert torch.equal(mul.load(), expected)


def test_two_captures_of_a_buffer_filled_by_slices_agree(tmp_path: Path) -> None:
    a, b = torch.randn(2, 4, K), torch.randn(2, 4, 2)
    golden = _capture(tmp_path / "golden", a, b)
    garbage = torch.full((4096,), float("nan"))  # the allocator may hand this memory out
    del garbage
    result = compare_dumps(golden, _capture(tmp_path / "target", a, b))
    assert result.first_divergence is None, render(result)


def test_a_wrong_slice_is_found_where_it_is_written(tmp_path: Path) -> None:
    a, b = torch.randn(2, 4, K), torch.randn(2, 4, 2)
    golden = _capture(tmp_path / "golden", a, b)
    d = compare_dumps(golden, _capture(tmp_path / "target", a, b * 1.5)).first_divergence
    assert d is not None
    assert d.name == "Tensor.copy_.1.forward", (d.name, d.rule, d.reason)


# -- DeepSeek-V3: latent attention, MoE with shared experts --------------------------------------


def _deepseek_v3(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    common = _common()
    common.pop("head_dim")
    common["num_key_value_heads"] = common["num_attention_heads"]  # MLA expands k per head
    config = DeepseekV3Config(
        **common,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        rope_interleave=True,
        norm_topk_prob=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


def _capture_model(model: torch.nn.Module, path: Path, mode: str) -> Path:
    with threads(1), torch.no_grad(), capture(model, path, level="mix", mode=mode):
        model(**inputs(), use_cache=False)
    return path


def _kv_b_not_loaded(model: torch.nn.Module) -> str:
    weight = model.model.layers[1].self_attn.kv_b_proj.weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(99)) * 0.1)
    return "model.layers.1.self_attn.kv_b_proj"


def _shared_expert_not_loaded(model: torch.nn.Module) -> str:
    weight = model.model.layers[1].mlp.shared_experts.down_proj.weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(99)) * 0.1)
    return "model.layers.1.mlp.shared_experts.down_proj"


def _rope_cos_sin_swapped(model: torch.nn.Module) -> str:
    attn = model.model.layers[1].self_attn
    forward = attn.forward

    def patched(*args: object, **kwargs: object) -> object:
        cos, sin = kwargs["position_embeddings"]  # type: ignore[misc]
        kwargs["position_embeddings"] = (sin, cos)
        return forward(*args, **kwargs)

    attn.forward = patched  # type: ignore[method-assign]
    return "model.layers.1.self_attn"


def _kv_norm_eps(model: torch.nn.Module) -> str:
    model.model.layers[1].self_attn.kv_a_layernorm.variance_epsilon = 0.1
    return "model.layers.1.self_attn.kv_a_layernorm"


_BUGS = {
    "kv_b_not_loaded": _kv_b_not_loaded,
    "shared_expert_not_loaded": _shared_expert_not_loaded,
    "rope_cos_sin_swapped": _rope_cos_sin_swapped,
    "kv_norm_eps": _kv_norm_eps,
}


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_deepseek_v3_noise_names_no_culprit(tmp_path: Path, mode: str) -> None:
    golden = _capture_model(_deepseek_v3(), tmp_path / "golden", mode)
    again = _capture_model(_deepseek_v3(), tmp_path / "again", mode)
    result = compare_dumps(golden, again)
    assert result.first_divergence is None, render(result)
    assert result.passed, render(result)
    bf16 = _capture_model(_deepseek_v3(torch.bfloat16), tmp_path / "bf16", mode)
    d = compare_dumps(golden, bf16).first_divergence
    assert d is None, f"{d.name} in {d.module} ({d.rule}): {d.reason}"


@pytest.mark.parametrize("bug", list(_BUGS))
def test_deepseek_v3_planted_bug_is_found_at_its_module(tmp_path: Path, bug: str) -> None:
    golden = _capture_model(_deepseek_v3(), tmp_path / "golden", "tensor")
    model = _deepseek_v3()
    planted = _BUGS[bug](model)
    d = compare_dumps(golden, _capture_model(model, tmp_path / "target", "tensor")).first_divergence
    assert d is not None, f"{bug}: no divergence"
    assert d.module == planted or (d.module or "").startswith(planted + "."), (
        f"{bug} in {planted}: convicted {d.name} in {d.module} ({d.rule}): {d.reason}"
    )
