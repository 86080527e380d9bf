"""diagnose on the model's cached path: bugs that live only in the KV cache (``decode_bugs.py``)
are found at the decode step that produces the first divergent token and in the layer they are
planted in; the first divergent positions are ``model.generate``'s own; the full-forward mode
(``cache=False``) stays available and is blind to them; models without ``generate`` keep the
full-forward path."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: hf_zoo

from decode_bugs import DECODE_BUGS, cache_slot_not_written  # noqa: E402
from hf_zoo import wandering_llama  # noqa: E402

from pytest_precision import PrecisionInputError  # noqa: E402
from pytest_precision.cli import main  # noqa: E402
from pytest_precision.diagnosis._generation import follow_logprobs, generate, save_run  # noqa: E402
from pytest_precision.diagnosis._workflow import diagnose  # noqa: E402

STEPS = 8
EOS = 2
#: the prompt: the 2 x 8 shape of hf_zoo.inputs, row 1 left-padded by 3 (seed 4: every bug's
#: first divergent token comes from a decode step, none from the prefill)
PAD = 3


@pytest.fixture(scope="module")
def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 128, (2, 8), generator=generator)
    ids[1, :PAD] = 0
    mask = torch.ones_like(ids)
    mask[1, :PAD] = 0
    return ids, mask


@pytest.fixture(scope="module")
def golden() -> torch.nn.Module:
    return wandering_llama(0)


def _buggy(golden: torch.nn.Module, bug: str) -> tuple[torch.nn.Module, str]:
    import copy

    target = copy.deepcopy(golden)
    return target, DECODE_BUGS[bug](target)


@torch.no_grad()
def _generate_first(
    golden: torch.nn.Module, target: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor]
) -> list[int | None]:
    """The first divergent position per row of HF's own greedy ``generate`` (with its cache)."""
    ids, mask = prompt
    rows = []
    for model in (golden, target):
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0
        )
        rows.append(out[:, ids.shape[1] :].tolist())
    for row in rows[0] + rows[1]:  # no end-of-sequence stop in the window: diagnose never stops
        assert len(row) == STEPS
        assert EOS not in row
    return [
        next((i for i, (a, b) in enumerate(zip(g, t, strict=True)) if a != b), None)
        for g, t in zip(*rows, strict=True)
    ]


#: bug -> (generate's first divergent position per row, the step diagnose localizes at)
MEASURED = {
    "decode position off by one": ([3, 2], 2),
    "keys stored in bf16": ([None, 3], 3),
    "cache slot not written": ([4, 6], 4),
    "dropped causal mask": ([None, 3], 3),
}


@pytest.mark.parametrize("bug", list(DECODE_BUGS))
def test_a_decode_bug_is_found_at_its_step_and_layer(
    bug: str,
    golden: torch.nn.Module,
    prompt: tuple[torch.Tensor, torch.Tensor],
    tmp_path: Path,
) -> None:
    target, layer = _buggy(golden, bug)
    first, step = MEASURED[bug]
    assert _generate_first(golden, target, prompt) == first
    ids, mask = prompt
    d = diagnose(
        golden,
        target,
        ids,
        attention_mask=mask,
        max_new_tokens=STEPS,
        out=tmp_path,
        devices=["cpu"],
    )
    assert d.cached
    assert list(d.first_token) == first, d.summary()
    assert d.finding == "tokens"
    assert d.step == step
    assert d.divergence is not None, d.summary()
    assert d.divergence.layer == layer, d.summary()
    assert d.divergence.step == step
    # the dump holds the decode forward of that step (of the suspect layer: every call before
    # it had the same statistics): one new token's key, joined to the cache of the prompt and
    # the step - 1 tokens before it
    assert d.comparison is not None
    records = d.comparison.target.records
    assert {r.step for r in records} == {step}
    for read in ((2, 4, 1, 16), (2, 4, ids.shape[1] + step - 1, 16)):  # (batch, kv heads, ...)
        assert any(
            r.module == f"{layer}.self_attn" and r.op == "cat" and r.shape == read for r in records
        )
    if d.divergence.cause == "source":
        assert "the KV cache that steps 0-" in d.summary()
    assert "on the cached path" in d.summary()


@pytest.mark.parametrize("bug", [b for b in DECODE_BUGS if b != "dropped causal mask"])
def test_the_full_forward_mode_cannot_see_a_cache_only_bug(
    bug: str,
    golden: torch.nn.Module,
    prompt: tuple[torch.Tensor, torch.Tensor],
    tmp_path: Path,
) -> None:
    target, _ = _buggy(golden, bug)
    ids, mask = prompt
    d = diagnose(
        golden, target, ids, attention_mask=mask, max_new_tokens=STEPS, out=tmp_path, cache=False
    )
    assert not d.cached
    assert d.finding == "no difference"
    assert "no KV cache: a bug only in the cached path is not seen" in d.summary()


def test_a_clean_pair_says_no_difference_on_the_cached_path(
    golden: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor], tmp_path: Path
) -> None:
    import copy

    ids, mask = prompt
    d = diagnose(
        golden, copy.deepcopy(golden), ids, attention_mask=mask, max_new_tokens=STEPS, out=tmp_path
    )
    assert d.cached
    assert d.finding == "no difference"
    assert d.first_token == (None, None)
    assert d.noise is not None
    assert d.noise.method.startswith("no float64 rerun")  # bitwise equal: no noise can matter
    assert not list(tmp_path.glob("*_dump"))


def test_the_cached_generation_is_generates_own_and_replays_exactly(
    golden: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor]
) -> None:
    ids, mask = prompt
    g = generate(golden, ids, mask, STEPS, cache=True)
    with torch.no_grad():
        out = golden.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert g.tokens.tolist() == out.sequences[:, ids.shape[1] :].tolist()
    logits = torch.stack(out.logits, 1)
    assert torch.equal(g.logprobs, torch.log_softmax(logits.double(), -1))
    # following the tokens (the noise rerun, the capture's replay) is the same computation
    assert torch.equal(follow_logprobs(golden, g), g.logprobs)
    # and not the full-forward one: the paths round differently
    full = generate(golden, ids, mask, STEPS, cache=False)
    assert not torch.equal(follow_logprobs(golden, full), g.logprobs)


class _Plain(torch.nn.Module):
    """A causal LM without HF ``generate``: embedding, a causal running mean, logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).cumsum(1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]
        return self.head(x) * 4


def test_a_module_without_generate_keeps_the_full_forward_path(tmp_path: Path) -> None:
    import copy

    golden = _Plain().eval()
    target = copy.deepcopy(golden)
    with torch.no_grad():
        target.head.weight[:, :4].mul_(3.0)
    d = diagnose(golden, target, [[5, 6, 7]], max_new_tokens=4, out=tmp_path / "a")
    assert not d.cached
    assert d.divergence is not None
    assert d.divergence.module == "head"
    with pytest.raises(PrecisionInputError, match="cache=True needs a decoder-only model"):
        diagnose(golden, target, [[5, 6, 7]], max_new_tokens=4, out=tmp_path / "b", cache=True)


def test_a_saved_run_keeps_its_path(
    golden: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor], tmp_path: Path
) -> None:
    ids, mask = prompt
    saved = save_run(golden, ids, tmp_path / "gpu", attention_mask=mask, max_new_tokens=5)
    assert json.loads((saved / "run.json").read_text())["cache"] is True
    target, layer = _buggy(golden, "cache slot not written")
    d = diagnose(saved, target, ids, attention_mask=mask, max_new_tokens=5, out=tmp_path / "d")
    assert d.cached
    assert list(d.first_token) == [4, None]
    assert d.step == 4
    assert d.divergence is not None
    assert d.divergence.layer == layer
    with pytest.raises(PrecisionInputError, match="saved with cache=True"):
        diagnose(saved, target, ids, attention_mask=mask, out=tmp_path / "e", cache=False)
    # a run saved before the cached path existed has no "cache" key: full forwards
    record = json.loads((saved / "run.json").read_text())
    del record["cache"]
    (saved / "run.json").write_text(json.dumps(record))
    with pytest.raises(PrecisionInputError, match="saved with cache=False"):
        diagnose(saved, target, ids, attention_mask=mask, out=tmp_path / "f", cache=True)


def test_cli_no_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = tmp_path / "models.py"
    entry.write_text(
        textwrap.dedent(f"""
        import copy, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parent.parent)!r}]
        from decode_bugs import cache_slot_not_written
        from hf_zoo import wandering_llama

        def pair():
            golden = wandering_llama(0)
            target = copy.deepcopy(golden)
            cache_slot_not_written(target)
            return {{"golden": golden, "target": target, "input_ids": [[17, 99, 45, 3, 120, 7]]}}
    """)
    )
    base = ["diagnose", "--entry", f"{entry}:pair", "--max-new-tokens", "8"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out
    assert "layer model.layers.1" in out
    assert "on the cached path" in out
    assert main([*base, "--out", str(tmp_path / "b"), "--no-cache"]) == 0
    assert "tokens: no difference" in capsys.readouterr().out


def test_the_plant_changes_only_the_cached_path(
    golden: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """The control for the bugs above: a full forward of the buggy model is bitwise the
    golden's (the prefill reads no cache), so only decode steps can show the bug."""
    import copy

    target = copy.deepcopy(golden)
    cache_slot_not_written(target)
    ids, mask = prompt
    with torch.no_grad():
        a = golden(ids, attention_mask=mask, use_cache=False).logits
        b = target(ids, attention_mask=mask, use_cache=False).logits
        c = target(ids, attention_mask=mask, use_cache=True).logits
    assert torch.equal(a, b)
    assert torch.equal(a, c)
