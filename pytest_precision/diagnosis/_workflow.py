"""``diagnose``: the localization workflow of ``docs/diagnose.md`` in one call.

checklist (config, weights, environment) -> greedy generation on both sides (the model's cached
path by default, ``_decode.py``) -> the first divergent token per row -> a capture of both sides
at the step that produces it, with the cache that step read (statistics of every call first,
then tensors up to the suspect layer) -> ``compare_dumps`` -> a replay of the culprit op on every
available device -> an exported regression test -> the HTML report.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from .._atomic import atomic_write
from .._errors import PrecisionError, PrecisionInputError
from ..compare._dumps import compare_dumps
from ..compare._results import DumpComparison, StatsComparison
from ..output._checklist import diff_configs
from ..output._tokens import TIE_MARGIN, compare_tokens
from ..replay._export import export_test, name_slug
from ..replay._verdict import ReplayResult, replay_op
from ..runtime._devices import available_devices
from ..runtime._environment import ChecklistDiff, diff_environment
from ._generation import Generation, as_batch, device_of
from ._noise import NoiseEstimate, estimate_noise, noise_bounds
from ._results import Diagnosis, DiagnosisStep, WeightChange
from ._sides import Side, fingerprints, generation_path, path_line
from ._stop import NOISE_FACTOR, StopDecision, decide, noise_horizon

#: A diagnosis -> the HTML page's text (``pytest_precision.report.render_html``); the caller
#: passes it, as diagnosis sits below report/.
Renderer = Callable[[Diagnosis], str]

#: Causes where the guilty call computed something wrong itself: worth replaying alone.
_REPLAYED_CAUSES = ("output", "rerun", "amplification")
#: Relative change of a weight statistic that counts as a different weight when both sides
#: hold the same dtype; across dtypes, this many epsilons of the coarser one (a bf16 port's
#: rounded weights move the checksum by about half an epsilon).
_WEIGHT_RTOL = 1e-3
_WEIGHT_EPS = 4.0


def diagnose(
    golden: Any,
    target: Any,
    input_ids: Any,
    *,
    attention_mask: Any = None,
    max_new_tokens: int = 16,
    out: str | os.PathLike[str] | None = None,
    devices: Iterable[str] | None = None,
    tie_margin: float = TIE_MARGIN,
    noise_factor: float = NOISE_FACTOR,
    cache: bool | None = None,
    render: Renderer | None = None,
) -> Diagnosis:
    """Find where ``target``'s generation departs from ``golden``'s, down to the op.

    ``golden`` and ``target`` are models (``torch.nn.Module`` returning logits, HF causal LMs
    included), or for either side a folder written by :func:`save_run` (on another machine).
    ``out`` (default: a new temporary folder) receives the dumps, the exported test and the
    report. ``devices`` to replay on: default every available one. ``render`` turns the
    diagnosis into the HTML page, written as ``report.html`` in ``out``
    (``render=pytest_precision.report.render_html``); without it no page is written.
    The logits may differ by ``noise_factor`` times the golden side's own measured error
    (``diagnosis/_noise.py``); a token flip is a tie only within that allowance and within
    ``tie_margin`` nats in the top-5. ``cache``: generate on the models' cached path
    (``model.generate``: a prefill, then one decode forward per token reading the KV cache) or,
    with False, by one full forward of the prefix per step; default: cached when both sides can
    (HF models), the path a saved run was made on when a side is one.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise PrecisionInputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not noise_factor > 0:
        raise PrecisionInputError(f"noise_factor must be a positive number, got {noise_factor!r}")
    g_side, t_side = Side("golden", golden), Side("target", target)
    cached = generation_path(g_side, t_side, cache)
    prompt, mask = as_batch(input_ids, attention_mask)
    folder = Path(tempfile.mkdtemp(prefix="precision-diagnosis-")) if out is None else Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    _clear_previous(folder)
    steps: list[DiagnosisStep] = []

    config_diff, environment_diff, weights = _checklist(g_side, t_side, steps)

    steps.append(DiagnosisStep("generation", path_line(cached, max_new_tokens)))
    g_gen = g_side.generation(prompt, mask, max_new_tokens, cached)
    t_gen = t_side.generation(prompt, mask, max_new_tokens, cached)
    tokens = compare_tokens(
        g_gen.tokens,
        t_gen.tokens,
        golden_logprobs=g_gen.logprobs,
        target_logprobs=t_gen.logprobs,
        tie_margin=tie_margin,
        logprob_tol=math.inf,  # the logprobs are judged against the measured noise instead
    )
    first = tuple(row.divergence.position for row in tokens.rows)

    def judged(noise: NoiseEstimate) -> tuple[NoiseEstimate, StopDecision | None]:
        return noise, decide(
            tokens,
            g_gen.logprobs,
            t_gen.logprobs,
            noise,
            factor=noise_factor,
            weights=weights,
            config_diff=config_diff,
            environment_diff=environment_diff,
        )

    def measured(steps: int | None) -> NoiseEstimate:
        return estimate_noise(g_side.model, g_gen, g_side.dtype, t_side.dtype, steps)

    # a decision no noise between the floor and a far ceiling changes needs no rerun; else the
    # noise of the leading steps first: the decision usually reads no further
    low, high = (judged(bound) for bound in noise_bounds(g_gen, g_side.dtype, t_side.dtype))
    noise, decided = high
    if not _same_decision(low[1], decided):
        noise, decided = judged(measured(noise_horizon(tokens, g_gen.logprobs, t_gen.logprobs)))
        if decided is None:
            noise, decided = judged(measured(None))
    assert decided is not None  # every step measured
    decision = decided
    finding, step = decision.finding, decision.step
    steps.append(DiagnosisStep("tokens", decision.tokens_line))
    if decision.stop_line is not None:
        steps.append(DiagnosisStep("stop", decision.stop_line))

    comparison = divergence = replay = None
    replays: tuple[ReplayResult, ...] = ()
    exported: Path | None = None
    weight_culprit = None
    if step is not None:
        comparison = _localize(g_side, t_side, g_gen, step, folder, steps, weights)
        divergence = comparison.first_divergence
        if divergence is None and weights:
            weight_culprit = _owner(weights[0].name)
            steps.append(
                DiagnosisStep(
                    "culprit",
                    f"{weight_culprit}: its parameter {weights[0].name} differs "
                    f"({weights[0].statistic}); the dump comparison localized no call",
                )
            )
        if divergence is not None and divergence.cause in _REPLAYED_CAUSES:
            devs = list(devices) if devices is not None else _default_devices(t_side)
            replays = _replay(comparison, divergence.name, divergence.step, devs, steps)
            replay = replays[0] if replays else None
            exported = _export(comparison, divergence, folder, steps)
        elif divergence is not None:
            steps.append(
                DiagnosisStep(
                    "replay",
                    f"not replayed: the cause is {divergence.cause!r} (an input or code one side "
                    "lacks), not an op computing wrong",
                )
            )
    diagnosis = Diagnosis(
        finding=finding,
        first_token=first,
        tokens=tokens,
        golden_tokens=tuple(tuple(r) for r in g_gen.tokens.tolist()),
        target_tokens=tuple(tuple(r) for r in t_gen.tokens.tolist()),
        step=step,
        comparison=comparison,
        divergence=divergence,
        replay=replay,
        replays=replays,
        exported_test=exported,
        report=None,
        config_diff=config_diff,
        environment_diff=environment_diff,
        weight_changes=weights,
        steps=tuple(steps),
        out=folder,
        noise=noise,
        weight_culprit=weight_culprit,
        cached=cached,
    )
    if render is None:
        return diagnosis
    page = folder / "report.html"
    with_report = _replace(diagnosis, report=page)
    atomic_write(page, render(with_report).encode())
    return _replace(with_report, steps=(*with_report.steps, DiagnosisStep("report", str(page))))


#: The dump folders a diagnosis writes into ``out``.
_DUMPS = ("golden_statistics", "target_statistics", "golden_dump", "target_dump")


def _clear_previous(folder: Path) -> None:
    """Remove the dumps of an earlier diagnosis in ``folder`` (only folders holding a native
    dump under the names diagnose uses); anything else there is left alone."""
    for name in _DUMPS:
        dump = folder / name
        if dump.is_dir():
            if not (dump / "manifest.json").is_file():
                raise PrecisionInputError(
                    f"{dump}: exists and is not a dump from an earlier diagnosis; choose "
                    "another out folder"
                )
            shutil.rmtree(dump)


def _replace(d: Diagnosis, **changes: Any) -> Diagnosis:
    import dataclasses

    return dataclasses.replace(d, **changes)


def _checklist(
    g: Side, t: Side, steps: list[DiagnosisStep]
) -> tuple[ChecklistDiff | None, ChecklistDiff | None, tuple[WeightChange, ...]]:
    g_config, t_config = g.config, t.config
    config_diff = None
    if g_config is not None and t_config is not None:
        config_diff = diff_configs(g_config, t_config)
        keys = ", ".join(c.key for c in config_diff.changes[:5])
        steps.append(
            DiagnosisStep(
                "config",
                f"{len(config_diff.changes)} key(s) differ: {keys}" if config_diff else "equal",
            )
        )
    environment_diff = None
    saved = g.saved or t.saved
    if saved is not None:
        other = t.saved if saved is g.saved else g.saved
        environment_diff = diff_environment(
            saved.environment, None if other is None else other.environment
        )
        keys = ", ".join(c.key for c in environment_diff.changes[:5])
        steps.append(
            DiagnosisStep(
                "environment",
                f"{len(environment_diff.changes)} difference(s): {keys}"
                if environment_diff
                else "equal",
            )
        )
    rtol = _WEIGHT_RTOL
    if g.dtype != t.dtype:
        coarser = max(torch.finfo(g.dtype).eps, torch.finfo(t.dtype).eps)
        rtol = max(rtol, _WEIGHT_EPS * coarser)
    weights = _weight_changes(*fingerprints(g, t), rtol)
    names = ", ".join(w.name for w in weights[:5])
    steps.append(
        DiagnosisStep(
            "weights",
            f"{len(weights)} parameter(s) differ: {names}" if weights else "fingerprints agree",
        )
    )
    return config_diff, environment_diff, weights


def _weight_changes(g: dict[str, Any], t: dict[str, Any], rtol: float) -> tuple[WeightChange, ...]:
    changes = []
    for name in sorted(set(g) | set(t)):
        a, b = g.get(name), t.get(name)
        if a is None or b is None:
            changes.append(WeightChange(name, "missing", a is not None, b is not None))
            continue
        if list(a["shape"]) != list(b["shape"]):
            changes.append(WeightChange(name, "shape", a["shape"], b["shape"]))
            continue
        n = max(math.prod(a["shape"]), 1)
        scale = max(abs(float(a["abs_mean"])), 1e-30)
        for key, size in (("mean", scale), ("abs_mean", scale), ("std", scale)):
            if _differs(a[key], b[key], rtol * size):
                changes.append(WeightChange(name, key, a[key], b[key]))
                break
        else:
            if _differs(a["checksum"], b["checksum"], rtol * scale * n**0.5):
                changes.append(WeightChange(name, "checksum", a["checksum"], b["checksum"]))
    return tuple(changes)


def _differs(golden: object, target: object, tolerance: float) -> bool:
    """Beyond ``tolerance``, or finite on one side only: a NaN or an infinity that one side's
    parameter holds makes its statistics non-finite, and a non-finite value compares False
    against any bound, so it must be asked for, not measured."""
    a, b = float(golden), float(target)  # type: ignore[arg-type]
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b) > tolerance
    return not (a == b or (math.isnan(a) and math.isnan(b)))


def _same_decision(a: StopDecision | None, b: StopDecision | None) -> bool:
    """Whether two decisions find the same thing at the same step."""
    return a is not None and b is not None and (a.finding, a.step) == (b.finding, b.step)


def _owner(parameter: str) -> str:
    """The module path owning a parameter (``a.b.weight`` -> ``a.b``)."""
    return parameter.rpartition(".")[0] or parameter


def _localize(
    g: Side,
    t: Side,
    generation: Generation,
    step: int,
    folder: Path,
    steps: list[DiagnosisStep],
    weights: tuple[WeightChange, ...],
) -> DumpComparison:
    """Statistics of every call first (live models), then tensors of the suspect layer alone
    when every record before it has bitwise the same statistics on both sides (its inputs are
    then the same, so nothing before it can explain it), else of every call up to it.

    When the differing weights all lie in numbered layers, the statistics stop at the first
    of those layers: the first divergence is there or before it. Only when nothing diverges up
    to it are the statistics of every call captured."""
    what = "prefill" if step == 0 else f"decode step {step}"
    if generation.cached and step > 0:
        what += f" (replayed from the prefill; it reads the cache steps 0-{step - 1} wrote)"
    include: list[str] | None = None
    exclude: list[str] = []
    scope = "every call"
    if g.model is not None and t.model is not None:
        bound = _first_weight_layer(weights)
        stats = None
        if bound is not None:
            stats = _statistics(g, t, generation, step, folder, _later_layers(t.model, bound))
            if stats.first_divergence is None:
                stats = None  # the weight changed nothing up to its layer: look at every call
        if stats is None:
            bound, stats = None, _statistics(g, t, generation, step, folder, [])
        upto = (
            "" if bound is None else f", calls up to {bound} (the first layer whose weights differ)"
        )
        d = stats.first_divergence
        steps.append(
            DiagnosisStep(
                "capture (statistics)",
                f"{what}{upto}: "
                + (
                    f"suspect layer {d.layer or d.module or d.name} ({d.name})"
                    if d is not None
                    else f"no divergence in statistics (verdict {stats.verdict}); capturing "
                    "every tensor"
                ),
            )
        )
        if d is not None and d.layer is not None:
            if _same_before(stats, d.layer):
                include, scope = [d.layer, f"{d.layer}.*"], "the suspect layer"
            else:
                exclude, scope = _later_layers(t.model, d.layer), "up to the suspect layer"
    comparison = compare_dumps(
        g.dump(generation, step, folder / "golden_dump", "tensor", include, exclude),
        t.dump(generation, step, folder / "target_dump", "tensor", include, exclude),
    )
    d = comparison.first_divergence
    steps.append(
        DiagnosisStep(
            "compare",
            f"{what}, tensors of {scope}: "
            + (
                f"{d.name} in {d.module or '-'} (layer {d.layer or '-'}), cause {d.cause}: "
                f"{d.reason}"
                if d is not None
                else f"no guilty call (verdict {comparison.verdict})"
            )
            + _cache_hint(generation, step, d),
        )
    )
    return comparison


def _cache_hint(generation: Generation, step: int, d: Any) -> str:
    """On the cached path, a decode step's input that none of its calls produced is, unless a
    weight differs, what an earlier step left in the KV cache: say where to look."""
    if not generation.cached or step == 0 or d is None or d.cause != "source":
        return ""
    where = d.layer or d.module or "this module"
    return (
        f"; on the cached path such an input is, unless a weight differs, the KV cache that "
        f"steps 0-{step - 1} wrote: what {where} stores in its cache differs"
    )


def _statistics(
    g: Side, t: Side, generation: Generation, step: int, folder: Path, exclude: list[str]
) -> DumpComparison:
    """Both sides' statistics of ``step`` (without the calls ``exclude`` names), compared; an
    earlier pass of this diagnosis in the same folders is replaced."""
    for name in ("golden_statistics", "target_statistics"):
        shutil.rmtree(folder / name, ignore_errors=True)
    return compare_dumps(
        g.dump(generation, step, folder / "golden_statistics", "statistics", exclude=exclude),
        t.dump(generation, step, folder / "target_statistics", "statistics", exclude=exclude),
    )


def _first_weight_layer(weights: tuple[WeightChange, ...]) -> str | None:
    """The first numbered layer (``model.layers.3``) holding a differing weight, when every
    differing weight lies in a layer of the same list; else None."""
    layers = [re.match(r"(.*?\.)(\d+)(?:\.|$)", w.name) for w in weights]
    if not layers or any(m is None for m in layers):
        return None
    prefixes = {m.group(1) for m in layers if m is not None}
    if len(prefixes) != 1:
        return None
    (prefix,) = prefixes
    return f"{prefix}{min(int(m.group(2)) for m in layers if m is not None)}"


def _same_before(stats: DumpComparison, layer: str) -> bool:
    """Whether every record of the statistics comparison before ``layer``'s first one has the
    same statistics on both sides (what a tensor bitwise equal on both has)."""
    inside = f"{layer}."
    for record in stats.records:
        module = record.module or ""
        if module == layer or module.startswith(inside):
            return True
        metrics = record.metrics
        if record.incomparable or (
            metrics is not None
            and not (isinstance(metrics, StatsComparison) and metrics.largest_difference == 0)
        ):
            return False
    return False


def _later_layers(model: torch.nn.Module | None, layer: str) -> list[str]:
    """Exclude patterns for the layers after ``layer`` (``model.layers.3``)."""
    match = re.fullmatch(r"(.*\.)?(\w+)\.(\d+)", layer)
    if model is None or match is None:
        return []
    prefix = layer[: -len(match.group(3))]
    later = []
    for name, _ in model.named_modules():
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if rest.isdigit() and int(rest) > int(match.group(3)):
            later += [name, f"{name}.*"]
    return later


def _default_devices(target: Side) -> list[str]:
    names = [b.name for b in available_devices()]
    if target.model is not None:
        own = device_of(target.model).type
        names = [own] + [n for n in names if n != own]
    return names


def _replay(
    comparison: DumpComparison,
    name: str,
    step: int,
    devices: list[str],
    steps: list[DiagnosisStep],
) -> tuple[ReplayResult, ...]:
    results = []
    for device in devices:
        try:
            results.append(
                replay_op(comparison.target, name, device, golden=comparison.golden, step=step)
            )
        except PrecisionError as exc:
            steps.append(DiagnosisStep(f"replay on {device}", f"not replayed: {exc}"))
            continue
        r = results[-1]
        steps.append(DiagnosisStep(f"replay on {device}", f"{r.verdict}: {r.reason}"))
    return tuple(results)


def _export(
    comparison: DumpComparison, divergence: Any, folder: Path, steps: list[DiagnosisStep]
) -> Path | None:
    file = folder / f"test_replay_{name_slug(divergence.name)}.py"
    try:
        export_test(
            comparison.target,
            divergence.name,
            file,
            golden=comparison.golden,
            step=divergence.step,
            rank=divergence.rank,
            force=True,
        )
    except (PrecisionError, OSError) as exc:  # the diagnosis stands without its export
        steps.append(DiagnosisStep("export", f"no test exported: {exc}"))
        return None
    steps.append(DiagnosisStep("export", str(file)))
    return file
