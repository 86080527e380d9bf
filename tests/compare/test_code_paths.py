"""Two runs of one model that run different code are judged by the values, not the spelling.

Real tiny HF ``transformers`` models (``hf_zoo``): eager against SDPA attention in two
grouped-query architectures (the SDPA path reshapes with ``-1`` where eager's ``repeat_kv``
spells the head count, and returns no attention weights), a dynamic against a static KV cache
(the static cache attends over its padded length), and dumps of two different models. The
noise pairs name no culprit; bugs planted inside the code only one run has, or in an argument
that changes values (an eps, a softmax scale), are still convicted where they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from compare_helpers import judged_in_shards
from hf_bugs import WRONG_SCALE, threads
from hf_zoo import ARCHS, SEED, inputs

from pytest_precision import Divergence, DumpComparison, capture, compare_dumps, render
from pytest_precision.cli import main
from pytest_precision.compare._results import ModelMismatch, ParameterDifference
from pytest_precision.report import write_json
from pytest_precision.report._html import dump_comparison_html

#: two grouped-query architectures (4 query heads, 2 key/value heads)
GQA = ("llama", "qwen2")
LEVELS = ("mix", "module")
MODES = ("tensor", "statistics")
#: the static cache's length: twice the prompt's
CACHE_LEN = 16


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with threads(1):
        yield


def _model(arch: str, attention: str = "eager", **config: Any) -> torch.nn.Module:
    """The zoo's tiny ``arch`` with ``attention`` and config overrides, same seeded weights."""
    from transformers import AutoModelForCausalLM

    built = ARCHS[arch].config()
    for key, value in config.items():
        setattr(built, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(built, attn_implementation=attention)
    model.requires_grad_(False)
    return model.eval()


def _capture(
    model: torch.nn.Module, path: Path, mode: str = "tensor", level: str = "mix", **kw: Any
) -> Path:
    """One forward of the zoo's token ids (no padding mask: every position is real)."""
    with torch.no_grad(), capture(model, path, level=level, mode=mode):
        model(inputs()["input_ids"], **kw)
    return path


def _cache(model: torch.nn.Module, static: bool) -> dict[str, Any]:
    from transformers import DynamicCache, StaticCache

    cache = (
        StaticCache(config=model.config, max_cache_len=CACHE_LEN)
        if static
        else DynamicCache(config=model.config)
    )
    return {"past_key_values": cache, "use_cache": True}


def _no_culprit(result: DumpComparison, culprits: list[Divergence], level: str) -> None:
    assert result.first_divergence is None, render(result)
    assert not culprits, [c.reason for c in culprits]
    # every module pairs with its own: what leaves it is where the other code is judged
    assert not [u.name for u in result.unmatched if u.name.startswith("Module.")]
    if level == "mix":  # with ops, every drifting call is rerun: noise, not inconclusive
        assert result.verdict == "pass", render(result)


def _convicted_in(result: DumpComparison, module: str) -> Divergence:
    d = result.first_divergence
    assert d is not None, render(result)
    where = d.module or ""
    assert where == module or where.startswith(module + "."), (
        f"convicted {d.name} in {d.module} ({d.rule}): {d.reason}"
    )
    return d


# -- eager against SDPA attention ----------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", GQA)
def test_eager_against_sdpa_attention_names_no_culprit(
    arch: str, mode: str, level: str, tmp_path: Path
) -> None:
    golden = _capture(_model(arch), tmp_path / "eager", mode, level, use_cache=False)
    target = _capture(_model(arch, "sdpa"), tmp_path / "sdpa", mode, level, use_cache=False)
    _no_culprit(*judged_in_shards(golden, target), level)


def test_a_reshape_spelled_with_minus_one_only_warns(tmp_path: Path) -> None:
    """The SDPA output's reshape spells the head count ``-1``; it pairs with no call of the
    eager run (another input), and arguments that differ where the outputs carry only their
    inputs' drift are another spelling: ``warn``, never a source."""
    golden = _capture(_model("llama"), tmp_path / "eager", use_cache=False)
    target = _capture(_model("llama", "sdpa"), tmp_path / "sdpa", use_cache=False)
    result = compare_dumps(golden, target)
    warned = [r for r in result.records if "(the outputs match: the same call)" in r.reason]
    assert warned
    assert not [r for r in result.records if r.failed and r.op == "reshape"]


def test_a_bug_inside_the_sdpa_attention_is_convicted_at_its_layer(tmp_path: Path) -> None:
    """A softmax scale off in layer 1's SDPA attention: code only the target runs, judged by
    what leaves layer 1's attention."""
    golden = _capture(_model("llama"), tmp_path / "eager", use_cache=False)
    model = _model("llama", "sdpa")
    attention = model.get_submodule("model.layers.1.self_attn")
    attention.scaling = attention.scaling * WRONG_SCALE
    target = _capture(model, tmp_path / "sdpa", use_cache=False)
    result, culprits = judged_in_shards(golden, target)
    d = _convicted_in(result, "model.layers.1.self_attn")
    assert d.layer == "model.layers.1"
    assert all(c.layer == "model.layers.1" for c in culprits)


@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_eps_is_still_a_source_across_attention_implementations(
    mode: str, tmp_path: Path
) -> None:
    """An eps of 1e-5 for 1e-6 in layer 1's input norm changes the values a little, after the
    SDPA drift of layer 0: an argument that changes values, not a spelling."""
    golden = _capture(_model("llama"), tmp_path / "eager", mode, use_cache=False)
    model = _model("llama", "sdpa")
    model.get_submodule("model.layers.1.input_layernorm").variance_epsilon = 1e-5
    target = _capture(model, tmp_path / "sdpa", mode, use_cache=False)
    d = _convicted_in(compare_dumps(golden, target), "model.layers.1.input_layernorm")
    assert d.rule == "source"
    assert "1e-05 vs 1e-06" in d.reason


# -- a dynamic against a static cache ------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_dynamic_against_static_cache_names_no_culprit(
    mode: str, level: str, tmp_path: Path
) -> None:
    model = _model("llama")
    golden = _capture(model, tmp_path / "dynamic", mode, level, **_cache(model, static=False))
    target = _capture(model, tmp_path / "static", mode, level, **_cache(model, static=True))
    _no_culprit(*judged_in_shards(golden, target), level)


def test_generate_with_a_static_cache_names_no_culprit(tmp_path: Path) -> None:
    """Three new tokens (the prefill and two decode steps), one step per forward."""
    model = _model("llama")
    model.generation_config.use_cache = True
    ids = inputs()["input_ids"]
    tokens, dumps = [], []
    for static in (False, True):
        path = tmp_path / ("static" if static else "dynamic")
        with torch.no_grad(), capture(model, path, step_per_forward=True):
            tokens.append(
                model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=3,
                    do_sample=False,
                    **_cache(model, static),
                )
            )
        dumps.append(path)
    assert torch.equal(*tokens)
    result, culprits = judged_in_shards(*dumps)
    assert len({r.step for r in result.records}) == 3  # the third token needs no forward
    _no_culprit(result, culprits, "mix")


def test_a_bug_with_a_static_cache_is_convicted_at_its_layer(tmp_path: Path) -> None:
    """The padded attention of a static cache is code only one run has; a softmax scale off
    in layer 1 is still found there."""
    model = _model("llama")
    golden = _capture(model, tmp_path / "dynamic", **_cache(model, static=False))
    attention = model.get_submodule("model.layers.1.self_attn")
    attention.scaling = attention.scaling * WRONG_SCALE
    target = _capture(model, tmp_path / "static", **_cache(model, static=True))
    result, _ = judged_in_shards(golden, target)
    assert _convicted_in(result, "model.layers.1.self_attn").layer == "model.layers.1"


# -- dumps of different models -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "example"),
    [
        (lambda: _model("qwen2"), "model.layers.0.self_attn.q_proj.bias only in the target"),
        (
            lambda: _model("llama", intermediate_size=96),
            "model.layers.0.mlp.down_proj.weight (64, 96) vs (64, 128)",
        ),
    ],
    ids=["llama-vs-qwen2", "another-mlp-width"],
)
def test_dumps_of_different_models_get_one_verdict(
    other: Callable[[], torch.nn.Module],
    example: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    golden = _capture(_model("llama"), tmp_path / "llama", use_cache=False)
    target = _capture(other(), tmp_path / "other", use_cache=False)
    result, culprits = judged_in_shards(golden, target)
    assert result.verdict == "different-models"
    assert not result.passed
    assert result.first_divergence is None
    assert not culprits
    assert result.different_models is not None
    report = render(result)
    assert "not the same model: 6 of " in report
    assert example in report
    assert "first divergence" not in report
    write_json(result, tmp_path / "result.json")
    document = json.loads((tmp_path / "result.json").read_text())
    assert document["verdict"] == "different-models"
    assert len(document["different_models"]["differing"]) == 6
    assert main(["compare", str(golden), str(target)]) == 1
    assert "not the same model" in capsys.readouterr().out


def test_a_few_parameters_of_another_shape_are_left_to_the_walk(tmp_path: Path) -> None:
    """One weight of another shape is a bug of one model, convicted at its module."""
    golden = _capture(_model("llama"), tmp_path / "golden", use_cache=False)
    model = _model("llama")
    proj = model.get_submodule("model.layers.1.self_attn.o_proj")
    proj.bias = torch.nn.Parameter(torch.full((proj.out_features,), 0.1))
    target = _capture(model, tmp_path / "target", use_cache=False)
    result = compare_dumps(golden, target)
    assert result.different_models is None
    _convicted_in(result, "model.layers.1.self_attn.o_proj")


def test_differing_parameter_names_are_shown_escaped(tmp_path: Path) -> None:
    """A name from a dump is data: its control characters are escaped in the report."""
    path = _capture(_model("llama"), tmp_path / "dump", use_cache=False)
    result = compare_dumps(path, path)
    name = "model.layers.0.\x1b[2Jevil.weight"
    result.different_models = ModelMismatch((ParameterDifference(name, 0, None, (4,)),), 20)
    report = render(result)
    assert "\x1b" not in report
    assert "\\x1b[2Jevil.weight only in the target" in report


def test_the_html_page_says_not_the_same_model(tmp_path: Path) -> None:
    """The page carries the differing parameters as data (escaped JSON, shown as text)."""
    path = _capture(_model("llama"), tmp_path / "dump", use_cache=False)
    result = compare_dumps(path, path)
    name = "model.</script><script>alert(1)</script>.weight"
    result.different_models = ModelMismatch((ParameterDifference(name, 0, (4,), None),), 20)
    page = dump_comparison_html(result)
    assert "Not the same model" in page
    assert "<script>alert(1)" not in page
    assert "alert(1)" in page
