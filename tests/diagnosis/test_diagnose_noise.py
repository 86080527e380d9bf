"""diagnose decides by measured noise: at HF's default init (0.02) a stray
bias, a norm computed in bf16 and a projection rounded to bf16 inside fp32 models move the
logits by far less than 0.1 nats but far more than fp32's noise, and each is localized to its
module; clean pairs, an honest bf16 port and bf16 runs on another thread count or reduction
order stay "no difference"; a checklist finding is never "nothing to localize"."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_bugs import norm_in_bf16, projection_rounded_to_bf16  # noqa: E402
from hf_zoo import ARCHS  # noqa: E402

from pytest_precision.diagnosis._generation import generate, save_run  # noqa: E402
from pytest_precision.diagnosis._noise import NoiseEstimate  # noqa: E402
from pytest_precision.diagnosis._stop import decide  # noqa: E402
from pytest_precision.diagnosis._workflow import diagnose  # noqa: E402
from pytest_precision.output._tokens import compare_tokens  # noqa: E402

STEPS = 6
IDS = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))


def default_init(kind: str, seed: int = 0) -> Any:
    """A 2-layer model of ``kind`` at HF's default init (``initializer_range`` 0.02)."""
    torch.manual_seed(seed)
    small = {"vocab_size": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=128, attn_pdrop=0.0, resid_pdrop=0.0,
            embd_pdrop=0.0, **small,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        shape = {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 128,
            "tie_word_embeddings": False,
            **small,
        }
        if kind == "llama":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
        else:
            config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **shape)
            model = transformers.MixtralForCausalLM(config)
    model.config._attn_implementation = "eager"
    return model.eval()


def stray_mlp_bias(model: Any) -> str:
    """GPT-2 layer 1's MLP up projection gets a bias where the checkpoint's is zero."""
    fc = model.transformer.h[1].mlp.c_fc
    with torch.no_grad():
        fc.bias.copy_(torch.randn(fc.bias.shape, generator=torch.Generator().manual_seed(7)) * 0.02)
    return "transformer.h.1.mlp.c_fc"


def _norm(model: Any) -> str:
    return norm_in_bf16(model, ARCHS["gpt2"])


def _o_proj(model: Any) -> str:
    return projection_rounded_to_bf16(model, ARCHS["llama"])


BUGS: list[tuple[str, Callable[[Any], str]]] = [
    ("gpt2", stray_mlp_bias),
    ("gpt2", _norm),
    ("llama", _o_proj),
    ("moe", _o_proj),  # no float64 grouped matmul: judged by the dtype envelope
]


@pytest.mark.parametrize(("kind", "plant"), BUGS, ids=["bias", "norm", "o_proj", "moe_o_proj"])
def test_a_slip_far_below_a_tenth_of_a_nat_is_localized_to_its_module(
    kind: str, plant: Callable[[Any], str], tmp_path: Path
) -> None:
    golden = default_init(kind)
    target = copy.deepcopy(golden)
    module = plant(target)
    d = diagnose(golden, target, IDS, max_new_tokens=STEPS, out=tmp_path, devices=["cpu"])
    assert not d.passed, d.summary()
    assert d.culprit_module == module, d.summary()
    assert "nothing to localize" not in d.summary()
    assert d.noise is not None
    envelope = kind == "moe"
    # far beyond fp32's noise: decided without a rerun, unless the rerun would have failed
    assert d.noise.method.startswith(
        "dtype envelope" if envelope else ("float64 rerun", "no float64")
    )
    assert d.finding in ("logprobs", "tokens")
    # the fixed rule (logprobs within 0.1 nats, a near tie) passes the slip: only the noise
    # rule finds it
    g, t = generate(golden, IDS, None, STEPS), generate(target, IDS, None, STEPS)
    fixed = compare_tokens(
        g.tokens, t.tokens, golden_logprobs=g.logprobs, target_logprobs=t.logprobs
    )
    assert fixed.passed


def _pin_threads(model: Any, n: int) -> Any:
    """``model`` computes on ``n`` threads (its forward only): another reduction split."""
    before: list[int] = []

    def pin(*_: Any) -> None:
        before.append(torch.get_num_threads())
        torch.set_num_threads(n)

    def unpin(*_: Any) -> None:
        torch.set_num_threads(before.pop())

    model.register_forward_pre_hook(pin)
    model.register_forward_hook(unpin)
    return model


def _split_k(model: Any) -> Any:
    """Layer 0's MLP down projection sums its two halves of the reduction separately: a
    legitimate other order of the same sum (a split-K kernel)."""
    proj = model.model.layers[0].mlp.down_proj
    half = proj.in_features // 2

    def forward(x: torch.Tensor) -> torch.Tensor:
        w = proj.weight
        return x[..., :half] @ w[:, :half].T + x[..., half:] @ w[:, half:].T

    proj.forward = forward
    return model


@pytest.mark.parametrize(
    ("kind", "dtype", "port"),
    [
        ("gpt2", torch.float32, None),
        ("llama", torch.float32, None),
        ("moe", torch.float32, None),
        ("gpt2", torch.bfloat16, lambda m: _pin_threads(m, 1)),
        ("llama", torch.bfloat16, _split_k),
        ("llama", torch.float32, lambda m: m.to(torch.bfloat16)),  # an honest bf16 port
    ],
    ids=["gpt2", "llama", "moe", "bf16_threads", "bf16_split_k", "bf16_port_of_fp32"],
)
def test_noise_is_no_difference(
    kind: str, dtype: torch.dtype, port: Callable[[Any], Any] | None, tmp_path: Path
) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        golden = default_init(kind).to(dtype)
        target = copy.deepcopy(golden)
        if port is not None:
            target = port(target)
        d = diagnose(golden, target, IDS, max_new_tokens=STEPS, out=tmp_path)
    finally:
        torch.set_num_threads(before)
    assert d.finding == "no difference", d.summary()
    assert d.passed
    assert d.divergence is None
    assert d.steps[-1].finding.startswith("tokens and logprobs agree within noise")
    assert not list(tmp_path.glob("*_dump"))


def test_a_weight_that_moves_no_logit_is_still_localized(tmp_path: Path) -> None:
    """An embedding row of a token no prompt or generation uses: the logits are bit-equal,
    and the checklist's difference is localized all the same."""
    golden = default_init("llama")
    target = copy.deepcopy(golden)
    with torch.no_grad():
        target.model.embed_tokens.weight[255].mul_(5.0)
    d = diagnose(golden, target, IDS[:, :3] % 200 + 3, max_new_tokens=3, out=tmp_path)
    assert 255 not in {t for row in d.golden_tokens for t in row}
    assert d.finding == "weights"
    assert not d.passed
    assert d.culprit_module == "model.embed_tokens", d.summary()
    assert "nothing to localize" not in d.summary()


def test_a_config_difference_is_a_finding_with_why_it_is_not_localized(tmp_path: Path) -> None:
    golden = default_init("gpt2")
    target = copy.deepcopy(golden)
    target.config.eos_token_id = 7
    d = diagnose(golden, target, IDS, max_new_tokens=3, out=tmp_path)
    assert d.finding == "config"
    assert not d.passed
    assert "eos_token_id" in d.steps[-1].finding
    assert "not localized" in d.steps[-1].finding
    assert d.divergence is None


@pytest.mark.slow
def test_a_golden_saved_elsewhere_is_judged_by_the_dtype_envelope(tmp_path: Path) -> None:
    golden = default_init("gpt2")
    saved = save_run(golden, IDS, tmp_path / "run", max_new_tokens=3)
    d = diagnose(saved, copy.deepcopy(golden), IDS, max_new_tokens=3, out=tmp_path / "d")
    assert d.passed, d.summary()
    assert d.noise is not None
    assert d.noise.method.startswith("no float64 rerun")  # the logits are bitwise equal
    bad = copy.deepcopy(golden)
    _norm(bad)
    d = diagnose(saved, bad, IDS, max_new_tokens=3, out=tmp_path / "e", devices=["cpu"])
    assert not d.passed
    assert d.culprit_module == "transformer.h.1.ln_1", d.summary()


def _tied(gap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row, one step: the golden picks token 1, the target token 2, ``gap`` nats apart on
    each side."""
    g = torch.full((1, 1, 8), -20.0, dtype=torch.float64)
    t = g.clone()
    g[0, 0, 1], g[0, 0, 2] = -0.5, -0.5 - gap
    t[0, 0, 2], t[0, 0, 1] = -0.5, -0.5 - gap
    return torch.tensor([[1]]), torch.tensor([[2]]), g, t


@pytest.mark.parametrize(("noise", "finding"), [(1e-6, "tokens"), (0.05, "no difference")])
def test_a_near_tie_counts_only_within_the_noise(noise: float, finding: str) -> None:
    g_ids, t_ids, g, t = _tied(0.02)
    tokens = compare_tokens(
        g_ids, t_ids, golden_logprobs=g, target_logprobs=t, logprob_tol=math.inf
    )
    assert tokens.rows[0].status == "near-tie"  # the fixed window accepts it either way
    estimate = NoiseEstimate(((noise,),), "given", torch.float32, torch.float32)
    # the two distributions differ (they are mirrored) by 0.02 nats: within 4 x 0.05 only
    decision = decide(tokens, g, t, estimate)
    assert decision.finding == finding
    assert decision.step == (0 if finding == "tokens" else None)
