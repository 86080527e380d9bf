"""diagnose on tiny random-init HF models (Llama, GPT-2, Gemma2, Mixtral-style MoE) with
planted bugs: the first divergent token matches a brute-force greedy scan, the culprit is the
planted module, logits that move without flipping a token are localized at the prefill, and
clean pairs say 'no difference'."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planted import PLANT, KernelBug, brute_force_first_tokens, build, twin  # noqa: E402

from pytest_precision import PrecisionInputError  # noqa: E402
from pytest_precision.diagnosis._generation import save_run  # noqa: E402
from pytest_precision.diagnosis._workflow import diagnose  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, 256, (2, 6), generator=generator)


#: (model kind, planted module, broken function, skew size, what the tokens show)
FLIPS = [
    ("llama", *PLANT["llama"], 0.5, "tokens"),
    ("gpt2", *PLANT["gpt2"], 0.5, "tokens"),
    ("gemma2", "model.layers.1.mlp.down_proj", "linear", 4.0, "tokens"),
    # a peaked Gemma2: this bug moves the logits and flips no token
    ("gemma2", *PLANT["gemma2"], 4.0, "logprobs"),
    pytest.param("moe", *PLANT["moe"], 2.0, "tokens", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("kind", "module", "func", "size", "finding"), FLIPS)
def test_a_planted_kernel_bug_is_found_in_its_module(
    kind: str,
    module: str,
    func: str,
    size: float,
    finding: str,
    ids: torch.Tensor,
    tmp_path: Path,
) -> None:
    golden = build(kind)
    target = twin(golden)
    with KernelBug(target, module, func, size):
        d = diagnose(golden, target, ids, max_new_tokens=STEPS, out=tmp_path, devices=["cpu"])
    expected = brute_force_first_tokens(
        golden, target, ids, STEPS, bug=lambda: KernelBug(target, module, func, size)
    )
    assert list(d.first_token) == expected
    assert d.finding == finding
    if finding == "tokens":
        assert d.step == min(p for p in expected if p is not None)
    else:
        assert expected == [None, None]
        assert d.step == 0  # localized at the prefill
    assert d.divergence is not None, d.summary()
    assert d.divergence.module == module, d.summary()
    assert d.divergence.name.split(".")[1] == func
    # the op computes right alone: the skew came from around it
    assert d.replay is not None
    assert d.replay.verdict == "context"
    assert d.exported_test is not None
    assert d.exported_test.is_file()
    assert [s.name for s in d.steps][:4] == ["config", "weights", "generation", "tokens"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_logits_that_move_without_flipping_a_token_are_still_a_finding(
    kind: str, ids: torch.Tensor, tmp_path: Path
) -> None:
    golden = build(kind)
    target = twin(golden)
    module, func = PLANT[kind]
    with KernelBug(target, module, func, 0.1):
        d = diagnose(golden, target, ids, max_new_tokens=STEPS, out=tmp_path, devices=["cpu"])
    assert d.first_token == (None, None)
    assert d.finding == "logprobs"
    assert d.step == 0
    assert d.divergence is not None
    assert d.divergence.module == module


@pytest.mark.parametrize(
    "kind", ["llama", "gpt2", "gemma2", pytest.param("moe", marks=pytest.mark.slow)]
)
def test_a_clean_pair_says_no_difference(kind: str, ids: torch.Tensor, tmp_path: Path) -> None:
    golden = build(kind)
    d = diagnose(golden, twin(golden), ids, max_new_tokens=STEPS, out=tmp_path)
    assert d.finding == "no difference"
    assert d.passed
    assert d.first_token == (None, None)
    assert d.divergence is None
    assert d.replay is None
    assert d.exported_test is None
    assert d.steps[-1].finding == "tokens and logprobs agree within noise: nothing to localize"
    assert not list(tmp_path.glob("*_dump"))  # stopped before any capture


def test_a_corrupted_weight_is_the_source_and_the_checklist_names_it(
    ids: torch.Tensor, tmp_path: Path
) -> None:
    golden = build("llama")
    target = twin(golden)
    with torch.no_grad():
        target.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    d = diagnose(golden, target, ids, max_new_tokens=STEPS, out=tmp_path)
    assert [w.name for w in d.weight_changes] == ["model.layers.0.mlp.down_proj.weight"]
    assert d.divergence is not None
    assert d.divergence.cause == "source"
    assert d.divergence.module == "model.layers.0.mlp.down_proj"
    assert d.replay is None  # nothing to replay: the input is wrong, not an op
    assert "not replayed" in d.summary()


@pytest.mark.slow
def test_a_golden_saved_on_another_machine(ids: torch.Tensor, tmp_path: Path) -> None:
    golden = build("llama")
    target = twin(golden)
    saved = save_run(golden, ids, tmp_path / "gpu_run", max_new_tokens=STEPS)
    module, func = PLANT["llama"]
    with KernelBug(target, module, func, 0.5):
        d = diagnose(saved, target, ids, max_new_tokens=STEPS, out=tmp_path / "d")
    assert list(d.first_token) == [5, 3]
    assert d.divergence is not None
    assert d.divergence.module == module
    assert d.environment_diff is not None
    assert not d.environment_diff
    with pytest.raises(PrecisionInputError, match="other input_ids"):
        diagnose(saved, target, ids[:, :3], max_new_tokens=STEPS, out=tmp_path / "e")


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    model = build("llama")
    with pytest.raises(PrecisionInputError, match=r"torch\.nn\.Module or a folder"):
        diagnose("nowhere", model, [[5, 6]], out=tmp_path)
    with pytest.raises(PrecisionInputError, match="integer ids"):
        diagnose(model, model, [[0.5, 1.0]], out=tmp_path)
    with pytest.raises(PrecisionInputError, match="max_new_tokens"):
        diagnose(model, model, [[5, 6]], max_new_tokens=0, out=tmp_path)


@pytest.mark.slow
def test_a_left_padded_batch_with_its_mask(tmp_path: Path) -> None:
    """Rows of different lengths, left-padded: the first divergent token per row matches HF's
    own greedy ``generate`` on both models (which uses the KV cache)."""
    golden = build("llama")
    target = twin(golden)
    ids = torch.tensor([[0, 0, 17, 200, 45, 3], [8, 77, 31, 150, 64, 12]])
    mask = (ids != 0).long()
    module, func = PLANT["llama"]
    with KernelBug(target, module, func, 0.5):
        d = diagnose(
            golden,
            target,
            ids,
            attention_mask=mask,
            max_new_tokens=STEPS,
            out=tmp_path,
            devices=["cpu"],
        )
        with torch.no_grad():
            t = target.generate(
                ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0
            )
    with torch.no_grad():
        g = golden.generate(
            ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0
        )
    assert [list(r) for r in d.golden_tokens] == g[:, ids.shape[1] :].tolist()
    assert [list(r) for r in d.target_tokens] == t[:, ids.shape[1] :].tolist()
    assert d.divergence is not None
    assert d.divergence.module == module
