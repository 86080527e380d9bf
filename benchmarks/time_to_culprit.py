"""Time to culprit: ``diagnose`` of the HF Llama of ``_hf_llama.py`` (120M parameters) with a
planted bug, against the time of generating both sides' tokens on the cached path
(``model.generate``, the floor any diagnosis of a generation pays). Goal: the diagnosis within 3x
of the two generations, with the planted module named as the culprit.

Two bugs, each diagnosed in turn (``--bug`` picks one):

- ``weight``: ``model.layers.<L>.mlp.down_proj.weight`` scaled by 1.05 on the target (a wrong
  weight in one module of a late layer; default L = 5 of 8). It moves the prefill's logits.
- ``kv``: layer 1 writes zeros instead of each decode token's key and value into its KV cache
  (``tests/diagnosis/decode_bugs.py``'s ``cache_slot_not_written``): the prefill and the first
  decode step are exact, the first step that reads an unwritten slot departs. Only the cached
  path can see it, and it is localized at a decode step, replayed from the prefill.

    python benchmarks/time_to_culprit.py [--bug weight|kv|both] [--prompt 32] [--tokens 16]
        [--bug-layer 5] [--small] [--profile FILE] [--json FILE]

``--small`` builds a smaller model of the same family (hidden 256, 4 layers, vocab 2048) for
profiling on a loaded machine; ``--profile FILE`` writes a cProfile of each ``diagnose`` call
(``FILE`` with the bug's name appended) and prints its top entries by cumulative time.

On a loaded machine the two figures move apart between runs; two ratios are printed per bug:
against the generations timed before and after the diagnosis (their mean), and against
diagnose's own generation step (the same ``generate`` calls, timed inside the run, so under the
same load).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "diagnosis"))

import _hf_llama
from decode_bugs import cache_slot_not_written

from pytest_precision import diagnose
from pytest_precision.diagnosis import _sides

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "vocab_size": 2048}
#: how far the planted weight is off
BUG_SCALE = 1.05


def build(small: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(_hf_llama.SEED)
    config = {**_hf_llama.CONFIG, **(SMALL if small else {})}
    return LlamaForCausalLM(LlamaConfig(**config, attn_implementation="eager")).eval()


def planted(golden: torch.nn.Module, layer: int) -> tuple[torch.nn.Module, str]:
    """A copy of ``golden`` whose layer ``layer`` MLP down projection is off by 5 percent."""
    target = copy.deepcopy(golden)
    module = f"model.layers.{layer}.mlp.down_proj"
    with torch.no_grad():
        target.get_submodule(module).weight.mul_(BUG_SCALE)
    return target, module


def planted_in_cache(golden: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """A copy of ``golden`` whose layer 1 leaves its decode slots of the KV cache unwritten."""
    target = copy.deepcopy(golden)
    return target, cache_slot_not_written(target)


def cached_tokens(model: torch.nn.Module, ids: torch.Tensor, n: int) -> None:
    model.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, use_cache=True)


class Spent(list[float]):
    """The seconds of each call of a wrapped function, and the function it wraps."""

    def __init__(self, original: Any) -> None:
        super().__init__()
        self.original = original


def timed_generation_step() -> Spent:
    """Wrap ``Side.generation`` (diagnose's generation step) to add up its seconds; restore it
    from ``.original``."""
    generation = _sides.Side.generation
    spent = Spent(generation)

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return generation(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    _sides.Side.generation = timed  # type: ignore[method-assign]
    return spent


def culprit_of(diagnosis: Any) -> str | None:
    d = diagnosis.divergence
    if d is not None:
        return str(d.module or d.name)
    return diagnosis.weight_culprit


def diagnosed(
    golden: torch.nn.Module,
    target: torch.nn.Module,
    module: str,
    ids: torch.Tensor,
    tokens: int,
    profile: Path | None,
) -> dict[str, Any]:
    """One timed diagnosis of ``target`` against ``golden``, printed; its figures."""

    def two_generations() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            cached_tokens(golden, ids, tokens)
            cached_tokens(target, ids, tokens)
            return time.perf_counter() - start

    with torch.no_grad():
        cached_tokens(golden, ids, 2)  # warm up the kernels both measurements use
    before = two_generations()
    inside = timed_generation_step()

    profiler = cProfile.Profile() if profile is not None else None
    with tempfile.TemporaryDirectory(prefix="time-to-culprit-") as out:
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        diagnosis = diagnose(golden, target, ids, max_new_tokens=tokens, out=out)
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - start
    _sides.Side.generation = inside.original  # type: ignore[method-assign]
    generations = (before + two_generations()) / 2
    culprit = culprit_of(diagnosis)
    found = culprit is not None and culprit.startswith(module)
    ratio, own = seconds / generations, seconds / sum(inside)
    print(f"two cached generations: {generations:.2f} s (mean of before and after)")
    print(f"diagnose: {seconds:.2f} s = {ratio:.2f}x (goal <= 3x); finding {diagnosis.finding}")
    print(f"diagnose / its own generation step ({sum(inside):.2f} s): {own:.2f}x")
    print(f"culprit: {culprit} ({'the planted module' if found else 'NOT the planted module'})")
    for step in diagnosis.steps:
        print(f"  {step.name}: {step.finding[:160]}")
    if profiler is not None and profile is not None:
        profiler.dump_stats(str(profile))
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return {
        "generations_s": generations,
        "diagnose_s": seconds,
        "ratio": ratio,
        "generation_step_s": sum(inside),
        "ratio_to_own_generation_step": own,
        "culprit": culprit,
        "planted": module,
        "found": found,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", choices=("weight", "kv", "both"), default="both")
    parser.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per side")
    parser.add_argument("--bug-layer", type=int, default=None, help="default: third from last")
    parser.add_argument("--small", action="store_true", help="a smaller model, for profiles")
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    golden = build(args.small)
    layers = golden.config.num_hidden_layers
    layer = layers - 3 if args.bug_layer is None else args.bug_layer
    ids = torch.randint(
        3, golden.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0)
    )
    params = sum(p.numel() for p in golden.parameters()) / 1e6
    print(
        f"HF Llama {params:.0f}M parameters, {layers} layers, prompt {args.prompt}, "
        f"{args.tokens} tokens, {torch.get_num_threads()} threads"
    )
    plants = {
        "weight": (lambda: planted(golden, layer), f"layer {layer} down_proj x{BUG_SCALE}"),
        "kv": (
            lambda: planted_in_cache(golden),
            "layer 1 leaves its decode KV slots unwritten",
        ),
    }
    record: dict[str, Any] = {"params_m": params, "threads": torch.get_num_threads()}
    for bug in ("weight", "kv") if args.bug == "both" else (args.bug,):
        plant, what = plants[bug]
        target, module = plant()
        print(f"\n== {bug}: {what}")
        profile = (
            None if args.profile is None else args.profile.with_name(f"{args.profile.name}.{bug}")
        )
        record[bug] = diagnosed(golden, target, module, ids, args.tokens, profile)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
