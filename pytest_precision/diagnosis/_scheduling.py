"""Cache and scheduling invariance on vLLM: the same requests with prefix caching on and off,
chunked prefill on and off, or in another order, judged per request.

"Prompt logprobs change with prefix caching" was once a real bug (a block read before it was
written) and once benign noise. The same requests run twice on one engine, captured both times:

* ``prefix_caching``: the reference runs each request in turn with
  ``SamplingParams(skip_reading_prefix_cache=True)`` (vLLM's own per-request switch: every
  token is computed); the variant runs them in turn reading the cache, so a request that shares
  a prefix with an earlier one takes that prefix's blocks from the cache;
* ``chunked_prefill``: all requests at once, the reference under the engine's token budget, the
  variant under a budget of ``chunk_tokens`` per step (the scheduler's
  ``max_num_scheduled_tokens``, restored afterwards): prompts are computed in chunks, beside
  other requests' chunks and decodes;
* ``order``: all requests at once, the variant in reverse order.

Each request is cut out of both dumps at the positions both computed and fed the same tokens
(:mod:`..integrations._vllm_requests`) and judged by :func:`compare_dumps`, with the verdicts of
:mod:`._batch`: invariant, noise (with the first call whose output moved while its inputs did
not), bug (the guilty call), inconclusive.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from .._errors import PrecisionInputError
from ..compare._dumps import compare_dumps
from ..compare._results import Divergence, DumpComparison, RecordComparison
from ..dump._load import load_dump
from ..integrations._vllm import capture_vllm, load_batches
from ..integrations._vllm_requests import request_view
from ..numerics._standards import Standard, StandardName
from ..output._common import OutputCheckFailed, as_int_list
from ._batch import BatchVerdict, judged, verdict_line, worst

SchedulingChange = Literal["prefix_caching", "chunked_prefill", "order"]
CHANGES: tuple[SchedulingChange, ...] = get_args(SchedulingChange)

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class SchedulingCase:
    """One request (``prompt``: its index) run both ways."""

    prompt: int
    change: SchedulingChange
    verdict: BatchVerdict
    #: positions both runs computed from the same tokens, compared
    compared: int
    #: prompt tokens the variant took from the prefix cache
    cached: int
    #: steps the variant took to compute the prompt
    prefill_steps: int
    #: the first generated token that differs between the two runs (its index), None if none
    tokens_differ_at: int | None
    first_variant: RecordComparison | None
    comparison: DumpComparison
    #: ``name.slot`` of records that describe the schedule, taken from the reference
    layout: tuple[str, ...] = ()

    @property
    def divergence(self) -> Divergence | None:
        return self.comparison.first_divergence


@dataclass(frozen=True)
class SchedulingInvariance:
    """Every case of :func:`check_scheduling_invariance`; ``verdict`` is the worst of them."""

    change: SchedulingChange
    cases: tuple[SchedulingCase, ...]

    @property
    def verdict(self) -> BatchVerdict:
        return worst(case.verdict for case in self.cases)

    @property
    def first_bug(self) -> SchedulingCase | None:
        return next((case for case in self.cases if case.verdict == "bug"), None)


class SchedulingVariant(OutputCheckFailed):
    """:func:`assert_scheduling_invariant` failed; ``result`` is the
    :class:`SchedulingInvariance`."""


@dataclass(frozen=True)
class _Ran:
    """One side: its dump and, per prompt, the request id and the tokens fed and generated."""

    path: Path
    requests: list[str]
    prompts: list[list[int]]
    generated: list[list[int]]


def check_scheduling_invariance(
    llm: Any,
    prompts: Sequence[Prompt],
    *,
    change: SchedulingChange,
    max_tokens: int = 3,
    chunk_tokens: int = 16,
    standard: Standard | StandardName | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> SchedulingInvariance:
    """Run ``prompts`` (strings or token ids) on the vLLM ``llm`` the reference way and the
    ``change`` way (see the module docstring), greedily for ``max_tokens`` tokens, and judge
    each request. Dumps are written under ``out`` and kept, or in a temporary folder removed
    at the end. For ``prefix_caching`` give prompts that share a prefix of at least one KV
    block (``block_size`` tokens) with an earlier prompt; for ``chunked_prefill`` prompts
    longer than ``chunk_tokens``.
    """
    if change not in CHANGES:
        raise PrecisionInputError(f"change: one of {', '.join(CHANGES)}, got {change!r}")
    if not prompts:
        raise PrecisionInputError("prompts: at least one prompt")
    if max_tokens < 1 or chunk_tokens < 1:
        raise PrecisionInputError("max_tokens and chunk_tokens: at least 1")
    given = [
        p if isinstance(p, str) else as_int_list(p, f"prompts[{i}]") for i, p in enumerate(prompts)
    ]
    _require(llm, change)
    folder = Path(tempfile.mkdtemp(prefix="precision-scheduling-")) if out is None else Path(out)
    try:
        reference = _run(llm, given, change, False, folder / "reference", max_tokens, chunk_tokens)
        variant = _run(llm, given, change, True, folder / "variant", max_tokens, chunk_tokens)
        cases = []
        for i in range(len(given)):
            case = _judge(i, change, reference, variant, standard)
            cases.append(case)
            if progress is not None:
                progress(case_line(case))
        return SchedulingInvariance(change, tuple(cases))
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)


def assert_scheduling_invariant(
    llm: Any, prompts: Sequence[Prompt], *, allow_noise: bool = True, **options: Any
) -> SchedulingInvariance:
    """:func:`check_scheduling_invariance`, raising :class:`SchedulingVariant` on a bug or an
    inconclusive case (and on noise, with ``allow_noise=False``)."""
    result = check_scheduling_invariance(llm, prompts, **options)
    allowed = {"invariant", "noise"} if allow_noise else {"invariant"}
    failing = [case for case in result.cases if case.verdict not in allowed]
    if failing:
        raise SchedulingVariant(scheduling_message(result, failing), result)
    return result


def scheduling_message(
    result: SchedulingInvariance, cases: Sequence[SchedulingCase] | None = None
) -> str:
    """The verdict and one line per case (``cases``: those to list, all by default)."""
    listed = result.cases if cases is None else cases
    head = f"{result.change} on / off: {result.verdict} ({len(result.cases)} requests)"
    if cases is not None:
        head = (
            f"{result.change} on / off: {result.verdict} "
            f"in {len(listed)} of {len(result.cases)} requests"
        )
    return "\n".join([head, *(f"  {case_line(case)}" for case in listed)])


def case_line(case: SchedulingCase) -> str:
    where = f"prompt {case.prompt} ({case.compared} tokens compared"
    if case.cached:
        where += f", {case.cached} from the prefix cache"
    if case.prefill_steps > 1:
        where += f", prefill in {case.prefill_steps} steps"
    where += ")"
    if case.tokens_differ_at is not None:
        where += f", generated token {case.tokens_differ_at} differs"
    return verdict_line(where, case, "first variant call")


def _judge(
    prompt: int,
    change: SchedulingChange,
    reference: _Ran,
    variant: _Ran,
    standard: Standard | StandardName | None,
) -> SchedulingCase:
    ref_gen, var_gen = reference.generated[prompt], variant.generated[prompt]
    differ = next(
        (j for j, (a, b) in enumerate(zip(ref_gen, var_gen, strict=False)) if a != b), None
    )
    length = len(reference.prompts[prompt])
    # positions whose input token is the same on both sides: the prompt, and the generated
    # tokens up to the first that differs (its logits, at the position before, are compared)
    upto = length + (len(ref_gen) - 1 if differ is None else differ)
    ref_batches, var_batches = load_batches(reference.path), load_batches(variant.path)
    view = request_view(
        (load_dump(reference.path), ref_batches, reference.requests[prompt]),
        (load_dump(variant.path), var_batches, variant.requests[prompt]),
        upto=upto,
    )
    comparison = compare_dumps(view.reference, view.variant, standard=standard)
    verdict, first = judged(comparison)
    prefill = [p for p in {s.variant for s in view.segments} if p.start < length]
    return SchedulingCase(
        prompt=prompt,
        change=change,
        verdict=verdict,
        compared=sum(s.end - s.start for s in view.segments),
        cached=min((p.start for p in prefill), default=0),
        prefill_steps=len(prefill),
        tokens_differ_at=differ,
        first_variant=first,
        comparison=comparison,
        layout=view.layout,
    )


def _require(llm: Any, change: SchedulingChange) -> None:
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if not hasattr(llm, "collective_rpc") or config is None:
        raise PrecisionInputError(f"a scheduling check needs a vllm.LLM, got {type(llm).__name__}")
    if change == "prefix_caching" and not config.cache_config.enable_prefix_caching:
        raise PrecisionInputError("prefix_caching: build the LLM with enable_prefix_caching=True")
    if change == "chunked_prefill":
        if not config.scheduler_config.enable_chunked_prefill:
            raise PrecisionInputError(
                "chunked_prefill: build the LLM with enable_chunked_prefill=True"
            )
        _scheduler(llm)


def _scheduler(llm: Any) -> Any:
    """The in-process engine's scheduler (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "max_num_scheduled_tokens"):
        raise PrecisionInputError(
            "chunked_prefill changes the scheduler's token budget, which only the in-process "
            "engine exposes: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before building the LLM"
        )
    return scheduler


@contextmanager
def _token_budget(llm: Any, tokens: int) -> Iterator[None]:
    scheduler = _scheduler(llm)
    saved = scheduler.max_num_scheduled_tokens
    scheduler.max_num_scheduled_tokens = min(tokens, saved)
    try:
        yield
    finally:
        scheduler.max_num_scheduled_tokens = saved


def _run(
    llm: Any,
    prompts: list[str | list[int]],
    change: SchedulingChange,
    is_variant: bool,
    path: Path,
    max_tokens: int,
    chunk_tokens: int,
) -> _Ran:
    from vllm import SamplingParams  # only here: the caller holds a vllm.LLM

    reads_cache = change == "prefix_caching" and is_variant
    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        skip_reading_prefix_cache=not reads_cache,
    )
    inputs = [p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts]
    order = list(range(len(prompts)))
    if change == "order" and is_variant:
        order.reverse()
    llm.reset_prefix_cache()  # what an earlier run left is not this run's to read
    budget = (
        _token_budget(llm, chunk_tokens)
        if change == "chunked_prefill" and is_variant
        else nullcontext()
    )
    with budget, capture_vllm(llm, path):
        if change == "prefix_caching":  # in turn: a request reads what the earlier ones wrote
            outputs = [llm.generate([inputs[i]], params, use_tqdm=False)[0] for i in order]
        else:
            outputs = list(llm.generate([inputs[i] for i in order], params, use_tqdm=False))
    by_prompt = dict(zip(order, outputs, strict=True))
    done = [by_prompt[i] for i in range(len(prompts))]
    return _Ran(
        path,
        [str(o.request_id) for o in done],
        [list(o.prompt_token_ids) for o in done],
        [list(o.outputs[0].token_ids) for o in done],
    )
