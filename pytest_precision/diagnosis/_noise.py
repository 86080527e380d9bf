"""The golden's own error on its logits: the yardstick the target's logits are held to.

A fixed tolerance cannot serve every dtype: fp32 logits round at ~1e-6, bf16 ones at ~1e-2, so
a dtype slip inside an fp32 model moves them far beyond fp32's noise and far below any tolerance
that would also pass an honest bf16 port. So the noise is measured on the golden side: the
golden deep-copied to float64 reruns the golden's own tokens on the path the golden generated
on (with a KV cache when the golden did, so the rerun's cache is float64 too), and its error is
how far the golden's log-probabilities are from that rerun, per row and decode step. When the
target runs in another dtype, the golden cast to the target's dtype is measured the same way, so
the noise of both precisions counts. The rerun covers the leading steps asked for (the stop rule
reads the noise only up to each row's divergence, :mod:`._stop`), so a generation that departs
at its prefill pays for a float64 prefill, not for every step. Where no float64 rerun can run
(a golden saved on another machine, an op with no float64 kernel) the noise is a documented
dtype envelope instead (:data:`ENVELOPE_EPS`).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from ._generation import Generation, follow_logprobs

#: Where no float64 rerun runs: the logits' error is taken as this many epsilons of the coarser
#: side's dtype, times the step's largest finite |logprob| (the spread of its logits). Loose on
#: purpose: on the tiny models of the tests the measured noise is 1/20 - 1/50 of it in fp32 and
#: about 1/75 in bf16 (docs/diagnose.md), the price of judging without a rerun.
ENVELOPE_EPS = 8.0
#: The float64 rerun's own rounding, the floor of any noise (in epsilons of float64, times the
#: spread of the logits): a float64 golden against itself has no other error.
FLOOR_EPS = 64.0

#: A ceiling no measured noise reaches: this many dtype envelopes (512 epsilons of the coarser
#: dtype times the logits' spread; the tests' models measure 1/20 - 1/75 of one envelope). A
#: decision that is the same at the floor and at this ceiling needs no float64 rerun.
CEILING_ENVELOPES = 64.0


@dataclass(frozen=True)
class NoiseEstimate:
    """Per row and decode step, the golden side's own error on its logprobs (nats, the largest
    over the vocabulary), and how it was measured; a float64 rerun may cover only the leading
    :attr:`steps` of the generation."""

    #: ``noise[row][step]``, for the first :attr:`steps` steps
    noise: tuple[tuple[float, ...], ...]
    #: one line: "float64 rerun of the golden (...)" or "dtype envelope (...): why"
    method: str
    golden_dtype: torch.dtype
    target_dtype: torch.dtype

    def at(self, row: int, step: int) -> float:
        return self.noise[row][step]

    @property
    def steps(self) -> int:
        """How many leading decode steps were measured."""
        return len(self.noise[0]) if self.noise else 0


def model_dtype(model: torch.nn.Module | None, config: dict[str, Any] | None) -> torch.dtype:
    """The floating dtype a side computes in: its first floating parameter's, else its config's
    ``dtype`` / ``torch_dtype``, else float32."""
    if model is not None:
        for p in model.parameters():
            if p.is_floating_point():
                return p.dtype
    for key in ("dtype", "torch_dtype"):
        name = str((config or {}).get(key) or "").removeprefix("torch.")
        dtype = getattr(torch, name, None) if name else None
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            return dtype
    return torch.float32


def _coarser(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


def _spread(logprobs: torch.Tensor) -> torch.Tensor:
    """Per row and step, the largest finite |logprob| (at least 1): the scale of the logits."""
    finite = torch.where(logprobs.isfinite(), logprobs.abs(), torch.zeros_like(logprobs))
    return finite.amax(-1).clamp(min=1.0)


def logprob_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row and step, the largest |a - b| over the vocabulary; equal entries (two ``-inf``
    of a masked token) count 0, a non-finite difference counts infinite."""
    diff = (a - b).abs()
    diff = torch.where(a == b, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    return diff.amax(-1)


def _rerun(model: torch.nn.Module, generation: Generation, dtype: torch.dtype) -> torch.Tensor:
    """``model`` deep-copied to ``dtype``, run on the golden's own tokens on the path that made
    them (the cached one: a prefill and decode steps reading the twin's own cache): the float64
    log-softmax of each step's logits, ``(batch, steps, vocab)``."""
    return follow_logprobs(_twin(model, dtype), generation)


def _twin(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of ``model`` computing in ``dtype``. Its floating parameters and buffers are
    converted straight into the copy (the memo hands them to ``deepcopy``): one pass over the
    weights instead of a copy in the model's dtype and then a conversion of it."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_floating_point() and id(tensor) not in memo:
            converted = tensor.detach().to(dtype, copy=True)
            if isinstance(tensor, torch.nn.Parameter):
                converted = torch.nn.Parameter(converted, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = converted
    return copy.deepcopy(model, memo).to(dtype).eval()


def estimate_noise(
    golden: torch.nn.Module | None,
    generation: Generation,
    golden_dtype: torch.dtype,
    target_dtype: torch.dtype,
    steps: int | None = None,
) -> NoiseEstimate:
    """The golden side's own error per row and step (see the module docstring).

    ``golden`` is the live golden model (None: a saved run, judged by the dtype envelope);
    ``generation`` its greedy run, whose prefixes are rerun; ``steps``: rerun only its first
    ``steps`` steps (default: all; the envelope costs nothing and covers every step).
    """
    logprobs = generation.logprobs
    floor = FLOOR_EPS * torch.finfo(torch.float64).eps * _spread(logprobs)
    why = "the golden is a saved run (no model to rerun)"
    if golden is not None:
        rerun = generation if steps is None else generation.head(max(1, steps))
        try:
            reference = _rerun(golden, rerun, torch.float64)
            noise = logprob_distance(rerun.logprobs, reference)
            how = f"float64 rerun of the golden ({golden_dtype})"
            if target_dtype != golden_dtype:
                port = _rerun(golden, rerun, target_dtype)
                noise = torch.maximum(noise, logprob_distance(port, reference))
                how += f" and of the golden in the target's {target_dtype}"
            noise = torch.maximum(noise, floor[:, : noise.shape[1]])
            return _estimate(noise, how, golden_dtype, target_dtype)
        except (RuntimeError, NotImplementedError, TypeError) as exc:  # no float64 kernel
            why = f"no float64 rerun of the golden ({str(exc).splitlines()[0][:120]})"
    dtype = _coarser(golden_dtype, target_dtype)
    envelope = ENVELOPE_EPS * torch.finfo(dtype).eps * _spread(logprobs)
    how = f"dtype envelope: {ENVELOPE_EPS:g} eps of {dtype} times the logits' spread; {why}"
    return _estimate(torch.maximum(envelope, floor), how, golden_dtype, target_dtype)


def noise_bounds(
    generation: Generation, golden_dtype: torch.dtype, target_dtype: torch.dtype
) -> tuple[NoiseEstimate, NoiseEstimate]:
    """The least and the most noise the golden side can have at every step, without a rerun:
    the float64 floor, and :data:`CEILING_ENVELOPES` dtype envelopes. When the stop rule
    decides alike at both, no measured noise between them changes its decision."""
    spread = _spread(generation.logprobs)
    floor = FLOOR_EPS * torch.finfo(torch.float64).eps * spread
    dtype = _coarser(golden_dtype, target_dtype)
    ceiling = CEILING_ENVELOPES * ENVELOPE_EPS * torch.finfo(dtype).eps * spread
    return (
        _estimate(floor, "float64 floor", golden_dtype, target_dtype),
        _estimate(
            torch.maximum(ceiling, floor),
            f"no float64 rerun: the decision is the same at the float64 floor and at "
            f"{CEILING_ENVELOPES:g} dtype envelopes ({CEILING_ENVELOPES * ENVELOPE_EPS:g} eps of "
            f"{dtype} times the logits' spread), the most noise this bound allows",
            golden_dtype,
            target_dtype,
        ),
    )


def _estimate(
    noise: torch.Tensor, method: str, golden_dtype: torch.dtype, target_dtype: torch.dtype
) -> NoiseEstimate:
    rows = tuple(tuple(float(v) for v in row) for row in noise.tolist())
    return NoiseEstimate(rows, method, golden_dtype, target_dtype)
