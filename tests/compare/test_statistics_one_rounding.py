"""Statistics dumps judge an op with clean inputs by one rounding of its output dtype
(compare/_one_rounding.py): a single-op bug whose inputs are bit-identical to the golden's is
convicted where it runs, although its output statistics stay inside the fp32 standard's 1e-4;
another correct implementation of the op (another formula, another summation order, another
thread count) is not.

Each bug is a kernel swap: a ``TorchFunctionMode`` entered outside the capture computes the op
another way, so the capture records the golden's call (same op, same arguments) with another
output, as a kernel bug on a device does. Real tiny HF models (``tests/hf_zoo.py``), mix level.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Collection
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from compare_helpers import judged_in_shards
from hf_bugs import threads
from hf_zoo import build, inputs
from torch.overrides import TorchFunctionMode

from pytest_precision import Dump, capture, compare_dumps, load_dump, render

MSPROBE = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe"


class Kernel(TorchFunctionMode):
    """Every call of ``func`` computed by ``impl`` instead (with the same arguments)."""

    def __init__(self, func: Callable[..., Any], impl: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.func, self.impl = func, impl

    def __torch_function__(
        self,
        func: Any,
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is self.func:
            with torch._C.DisableTorchFunction():
                return self.impl(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _softmax_in_fp16(
    x: torch.Tensor, dim: int, *_: Any, dtype: Any = None, **__: Any
) -> torch.Tensor:
    """A softmax computed in fp16 inside an fp32 model (the mask's fp32 minimum saturated to
    fp16's, so that masked rows stay finite)."""
    return F.softmax(x.clamp(-65504, 65504).half(), dim=dim).to(dtype or x.dtype)


def _silu_with_beta(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """SiLU of a slightly different formula: x * sigmoid(1.00006 x)."""
    return x * torch.sigmoid(x * (1 + 2**-14))


def _silu_through_tanh(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """The same SiLU spelled another way: sigmoid(x) = (1 + tanh(x / 2)) / 2."""
    return x * (0.5 * (1 + torch.tanh(x / 2)))


def _softmax_spelled_out(
    x: torch.Tensor, dim: int, *_: Any, dtype: Any = None, **__: Any
) -> torch.Tensor:
    """The same softmax written out: another exp and another summation order."""
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(dtype or x.dtype)


def _linear_split_k(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The same linear accumulated in two halves of K (split-K): another summation order."""
    half = x.shape[-1] // 2
    out = F.linear(x[..., :half], weight[:, :half]) + F.linear(x[..., half:], weight[:, half:])
    return out if bias is None else out + bias


def _layer_norm_eps_off(
    x: torch.Tensor,
    shape: list[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """A LayerNorm kernel whose eps is 10% off the one it is passed."""
    return F.layer_norm(x, shape, weight, bias, eps * 1.1)


def _gelu_exact(model: torch.nn.Module) -> None:
    """The MLP's tanh-approximated GELU replaced by exact GELU: the target calls ``F.gelu``
    without the golden's ``approximate="tanh"``."""
    _activation(model, "gelu")


def _activation(model: torch.nn.Module, name: str) -> None:
    from transformers.activations import ACT2FN

    for mlp in model.modules():
        for attribute in ("act", "act_fn"):
            if attribute in mlp._modules:
                setattr(mlp, attribute, ACT2FN[name])


def _tanh_gpt2() -> torch.nn.Module:
    """GPT-2 with ``gelu_pytorch_tanh`` (one ``F.gelu`` call) for its ``gelu_new`` ops."""
    model = build("gpt2")
    _activation(model, "gelu_pytorch_tanh")
    return model


#: golden variant -> its model
GOLDENS: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": lambda: build("llama"),
    "qwen2": lambda: build("qwen2"),
    "gemma": lambda: build("gemma"),
    "gpt2": lambda: build("gpt2"),
    "gpt2_tanh": _tanh_gpt2,
}

#: kernel swaps: the op computed another way, recorded as the golden's call
KERNELS: dict[str, tuple[Callable[..., Any], Callable[..., torch.Tensor]]] = {
    "softmax_fp16": (F.softmax, _softmax_in_fp16),
    "silu_formula": (F.silu, _silu_with_beta),
    "silu_through_tanh": (F.silu, _silu_through_tanh),
    "softmax_spelled_out": (F.softmax, _softmax_spelled_out),
    "linear_split_k": (F.linear, _linear_split_k),
    "layer_norm_eps": (F.layer_norm, _layer_norm_eps_off),
}

#: (golden variant, bug, the op convicted, its module)
PLANTED = [
    ("llama", "softmax_fp16", "Functional.softmax.0.forward", "model.layers.0.self_attn"),
    ("qwen2", "softmax_fp16", "Functional.softmax.0.forward", "model.layers.0.self_attn"),
    ("gemma", "softmax_fp16", "Functional.softmax.0.forward", "model.layers.0.self_attn"),
    ("gpt2", "softmax_fp16", "Functional.softmax.0.forward", "transformer.h.0.attn"),
    ("llama", "silu_formula", "Functional.silu.0.forward", "model.layers.0.mlp.act_fn"),
    ("qwen2", "silu_formula", "Functional.silu.0.forward", "model.layers.0.mlp.act_fn"),
    ("gpt2", "layer_norm_eps", "Functional.layer_norm.0.forward", "transformer.h.0.ln_1"),
    ("gemma", "gelu_exact", "Functional.gelu.0.forward", "model.layers.0.mlp.act_fn"),
    ("gpt2_tanh", "gelu_exact", "Functional.gelu.0.forward", "transformer.h.0.mlp.act"),
]

#: noise: the same model computed another correct way
NOISE = [
    (golden, case)
    for golden in ("llama", "qwen2", "gemma", "gpt2")
    for case in ("self", "threads", "bf16", "softmax_spelled_out", "linear_split_k")
] + [("llama", "silu_through_tanh"), ("qwen2", "silu_through_tanh")]


def capture_forward(
    model: torch.nn.Module,
    path: Path,
    kernel: str | None = None,
    n_threads: int = 1,
) -> Path:
    """One forward of the zoo's batch in statistics mode at the mix level, with ``kernel``
    swapped in (entered outside the capture: the capture records the call as made)."""
    swap = Kernel(*KERNELS[kernel]) if kernel else nullcontext()
    with (
        threads(n_threads),
        swap,
        torch.no_grad(),
        capture(model, path, level="mix", mode="statistics"),
    ):
        model(**inputs(), use_cache=False)
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Dump]:
    made: dict[str, Dump] = {}

    def get(variant: str) -> Dump:
        if variant not in made:
            path = tmp_path_factory.mktemp(f"golden-{variant}") / "dump"
            made[variant] = load_dump(capture_forward(GOLDENS[variant](), path))
        return made[variant]

    return get


@pytest.mark.parametrize(("variant", "bug", "name", "module"), PLANTED)
def test_a_single_op_bug_with_clean_inputs_is_convicted_in_statistics(
    golden: Callable[[str], Dump],
    variant: str,
    bug: str,
    name: str,
    module: str,
    tmp_path: Path,
) -> None:
    model = GOLDENS[variant]()
    if bug == "gelu_exact":
        _gelu_exact(model)
        target = capture_forward(model, tmp_path / "target")
    else:
        target = capture_forward(model, tmp_path / "target", kernel=bug)
    result, _ = judged_in_shards(golden(variant), target)
    d = result.first_divergence
    assert d is not None, f"{bug}: no divergence\n{render(result)}"
    assert (d.name, d.module) == (name, module), f"{d.name} in {d.module} ({d.rule}): {d.reason}"
    if bug == "gelu_exact":  # the argument the target left out is what differs
        assert d.rule == "source"
        assert "kwargs.approximate" in d.reason
    else:
        assert d.rule == "clean inputs"
        assert "output statistics beyond one rounding" in d.reason


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "case"), NOISE)
def test_another_correct_implementation_is_not_convicted(
    golden: Callable[[str], Dump], variant: str, case: str, tmp_path: Path
) -> None:
    path = tmp_path / "target"
    if case == "self":
        target: Dump | Path = golden(variant)
    elif case == "threads":
        target = capture_forward(GOLDENS[variant](), path, n_threads=2)
    elif case == "bf16":
        target = capture_forward(GOLDENS[variant]().to(torch.bfloat16), path)
    else:
        target = capture_forward(GOLDENS[variant](), path, kernel=case)
    result, culprits = judged_in_shards(golden(variant), target)
    d = result.first_divergence
    assert d is None, f"{case}: false alarm at {d.name} in {d.module} ({d.rule}): {d.reason}"
    assert culprits == [], f"{case}: a shard convicts {culprits[0].name}: {culprits[0].reason}"
    if case != "bf16":  # bf16 against fp32 may end inconclusive in statistics
        assert result.passed, render(result)


# -- msprobe statistics: the rule does not depend on the format -------------------------------


def _moved_silu_output(case: str, tmp: Path, relative: float) -> Path:
    """A copy of an msprobe statistics dump of the tiny Llama whose first SiLU output has its
    Mean and Norm moved by ``relative``: what a SiLU kernel of another formula records (its
    input is the golden's; the consumers' inputs keep the golden's statistics)."""
    target = tmp / case
    shutil.copytree(MSPROBE / case, target)
    (dump_json,) = target.rglob("dump.json")
    dump = json.loads(dump_json.read_text())
    (output,) = dump["data"]["Functional.silu.0.forward"]["output"]
    for key in ("Mean", "Norm"):
        output[key] = output[key] * (1 + relative)
    dump_json.write_text(json.dumps(dump))
    return target


@pytest.mark.parametrize(
    ("level", "bug", "name", "module"),
    [
        ("mix", "softmax_fp16", "Functional.softmax.0.forward", "model.layers.0.self_attn"),
        ("l1", "silu_formula", "Functional.silu.0.forward", None),  # L1 records no modules
    ],
)
def test_real_msprobe_statistics_convict_a_single_op_kernel_bug(
    level: str, bug: str, name: str, module: str | None
) -> None:
    """msprobe 26.2's own dumps (fixtures/msprobe/make_dumps.py) of the tiny Llama, clean and
    with a kernel bug msprobe records as the golden's call: before, the softmax in fp16 ended
    inconclusive and the SiLU formula passed."""
    golden = MSPROBE / f"single_op_golden_{level}_statistics"
    result, _ = judged_in_shards(golden, MSPROBE / f"single_op_{bug}_{level}_statistics")
    d = result.first_divergence
    assert d is not None, render(result)
    assert (d.name, d.module, d.rule) == (name, module, "clean inputs"), d.reason
    assert "output statistics beyond one rounding" in d.reason
    assert compare_dumps(golden, golden).passed


@pytest.mark.parametrize("case", ["hf_llama_mix_statistics", "hf_llama_l1_statistics"])
def test_msprobe_statistics_convict_a_single_op_bug(case: str, tmp_path: Path) -> None:
    """msprobe computes its statistics in float32: a 3e-5 move of the SiLU's output norm,
    inside the standard, is beyond one rounding plus the statistics' own summation."""
    result, _ = judged_in_shards(MSPROBE / case, _moved_silu_output(case, tmp_path, 3e-5))
    d = result.first_divergence
    assert d is not None, render(result)
    assert (d.name, d.rule) == ("Functional.silu.0.forward", "clean inputs"), d.reason
    assert "beyond one rounding" in d.reason


@pytest.mark.parametrize("case", ["hf_llama_mix_statistics", "hf_llama_l1_statistics"])
def test_msprobe_statistics_within_their_own_summation_pass(case: str, tmp_path: Path) -> None:
    """A move of a few float32 roundings (what msprobe's float32 sums of another correct
    SiLU differ by) is within the bound."""
    result, _ = judged_in_shards(MSPROBE / case, _moved_silu_output(case, tmp_path, 2e-7))
    assert result.first_divergence is None, render(result)
