"""``capture_vllm``: :func:`capture` of the model that a vLLM engine runs, one step per
``execute_model`` call, in whichever process runs it.

The hooks are installed through ``llm.collective_rpc`` (vLLM serializes the function and runs it
on every worker: in this process for the in-process engine, in each worker process for the
multiprocess engine, one per tensor-parallel rank), so the same code serves V0/V1, in-process
or not, TP = 1 or more. Each worker wraps its model runner's ``execute_model``: a call that
schedules tokens starts a new capture step and, once it returns, the worker notes which
requests the flattened ``[num_tokens, hidden]`` batch held, in order, with their token counts.
Rank 0 writes those layouts to ``<dump>/vllm_batches.json``; :func:`request_rows` slices one
request out of a recorded tensor with them (see docs/vllm.md).

vllm is never imported here: the functions only touch the objects vLLM hands them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._atomic import atomic_write
from .._errors import DumpFormatError, PrecisionInputError
from ..dump._capture import Capture, Level, Mode, capture
from ..dump._capture_scope import rank_and_world_size
from ..dump._native import json_members

#: The per-step batch layouts, next to the dump's manifest.
BATCHES = "vllm_batches.json"


@dataclass(frozen=True)
class StepBatch:
    """One ``execute_model`` call: the requests of its flattened batch, in order, how many
    tokens each contributed (its whole prompt or a chunk of it at prefill, 1 at a decode) and,
    where the capture knew it, the position of each one's first token here (the tokens it had
    computed before: earlier chunks, or a prefix served from the prefix cache)."""

    step: int
    requests: tuple[str, ...]
    num_tokens: tuple[int, ...]
    #: per request, its first token's position in its sequence; empty when not recorded
    starts: tuple[int, ...] = ()

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def index(self, request: str) -> int:
        """Position of ``request`` in the batch; vLLM may suffix the id the user sees
        (``"0"`` -> ``"0-1a2b..."``), so a unique ``request-`` prefix matches too."""
        if request in self.requests:
            return self.requests.index(request)
        found = [i for i, r in enumerate(self.requests) if r.startswith(f"{request}-")]
        if len(found) != 1:
            raise PrecisionInputError(
                f"request {request!r} is not in step {self.step} "
                f"(requests: {', '.join(self.requests) or 'none'})"
            )
        return found[0]

    def token_slice(self, request: str) -> slice:
        """Rows of ``request`` in a ``[num_tokens, ...]`` activation of this step."""
        i = self.index(request)
        start = sum(self.num_tokens[:i])
        return slice(start, start + self.num_tokens[i])


def request_rows(tensor: torch.Tensor, batch: StepBatch, request: str) -> torch.Tensor:
    """The rows of ``request`` in a tensor recorded at ``batch.step``: its tokens' rows of a
    flattened activation (``[num_tokens, ...]``), or its row of a per-request tensor such as
    the logits (``[num_requests, vocab]``, one row per request at its last scheduled token)."""
    rows = tensor.shape[0] if tensor.dim() else 0
    if rows == batch.total_tokens:
        return tensor[batch.token_slice(request)]
    if rows == len(batch.requests):
        i = batch.index(request)
        return tensor[i : i + 1]
    raise PrecisionInputError(
        f"a tensor of shape {list(tensor.shape)} is neither per token ({batch.total_tokens} "
        f"rows at step {batch.step}) nor per request ({len(batch.requests)} rows)"
    )


def load_batches(path: str | Path) -> dict[int, StepBatch]:
    """The batch layouts :func:`capture_vllm` wrote for a dump, by step."""
    file = Path(path) / BATCHES
    try:
        content = json.loads(file.read_text())
        steps = content["steps"]
        return {
            int(s["step"]): StepBatch(
                int(s["step"]),
                tuple(str(r) for r in s["requests"]),
                tuple(int(n) for n in s["num_tokens"]),
                tuple(int(n) for n in s.get("starts", ())),
            )
            for s in steps
        }
    except FileNotFoundError:
        raise DumpFormatError(file, "missing: not a dump made by capture_vllm") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DumpFormatError(file, f"not a vLLM batch layout file ({exc!r})") from None


# -- in the worker -----------------------------------------------------------------------------


class _WorkerCapture:
    """The capture running in one worker: its :class:`Capture` and the wrapped runner.

    Between the model's forward and ``compute_logits`` the runner picks each request's last
    row (``hidden_states[logits_indices]``) outside any module, where capture records nothing:
    a comparison would see the logits' input appear from nowhere. The wrapper of
    ``compute_logits`` redoes that pick as a recorded op (``Torch.index_select`` in the
    ``vllm.sample_rows`` scope) and passes its result on, bitwise the same rows.
    """

    def __init__(self, runner: Any, cap: Capture) -> None:
        self.runner = runner
        self.cap = cap
        self.batches: list[dict[str, Any]] = []
        self.scheduled: dict[str, int] = {}
        self.last_output: Any = None
        model = runner.model
        self.original = runner.execute_model
        runner.execute_model = self._execute_model
        self.original_logits = model.compute_logits if hasattr(model, "compute_logits") else None
        if self.original_logits is not None:
            model.compute_logits = self._compute_logits
        self.hook = model.register_forward_hook(self._keep_output)

    def _keep_output(self, module: Any, args: Any, output: Any) -> None:
        self.last_output = output

    def _order(self) -> list[str]:
        scheduled = self.scheduled
        order = [str(r) for r in getattr(self.runner.input_batch, "req_ids", []) if r in scheduled]
        return order if sorted(order) == sorted(scheduled) else list(scheduled)

    def _execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        scheduled: dict[str, int] = dict(getattr(scheduler_output, "num_scheduled_tokens", {}))
        if not scheduled:  # nothing runs the model (an empty step)
            return self.original(scheduler_output, *args, **kwargs)
        step = len(self.batches)
        self.cap.step(step)
        self.scheduled, self.last_output = scheduled, None
        starts = _computed_before(scheduler_output)
        output = self.original(scheduler_output, *args, **kwargs)
        order = self._order()
        batch = {"step": step, "requests": order, "num_tokens": [int(scheduled[r]) for r in order]}
        if all(r in starts for r in order):
            batch["starts"] = [starts[r] for r in order]
        self.batches.append(batch)
        return output

    def _compute_logits(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.original_logits is not None
        full = self.last_output
        if isinstance(full, torch.Tensor) and full.dim() == 2 and self.scheduled:
            ends = torch.tensor([self.scheduled[r] for r in self._order()]).cumsum(0) - 1
            if ends.numel() == hidden_states.shape[0] and int(ends[-1]) < full.shape[0]:
                cap = self.cap
                frame = json_members({"module": "vllm.sample_rows", "parent": None})
                cap._stack.append(("vllm.sample_rows", "vllm.sample_rows", frame))
                try:
                    rows = torch.index_select(full, 0, ends.to(full.device))
                finally:
                    cap._stack.pop()
                if torch.equal(rows, hidden_states):
                    hidden_states = rows
        return self.original_logits(hidden_states, *args, **kwargs)

    def close(self) -> list[dict[str, Any]]:
        self.hook.remove()
        if self.runner.__dict__.get("execute_model") == self._execute_model:
            del self.runner.execute_model
        if self.original_logits is not None:
            model = self.runner.model
            if model.__dict__.get("compute_logits") == self._compute_logits:
                del model.compute_logits
        self.cap.__exit__(None, None, None)
        return self.batches


def _computed_before(scheduler_output: Any) -> dict[str, int]:
    """Each scheduled request's count of tokens computed before this step (V1's
    ``scheduled_new_reqs`` and ``scheduled_cached_reqs``); empty where the output lacks them."""
    starts: dict[str, int] = {}
    for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
        if hasattr(new, "req_id") and hasattr(new, "num_computed_tokens"):
            starts[str(new.req_id)] = int(new.num_computed_tokens)
    cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
    ids = getattr(cached, "req_ids", None) or ()
    counts = getattr(cached, "num_computed_tokens", None) or ()
    starts.update((str(r), int(n)) for r, n in zip(ids, counts, strict=False))
    return starts


_RUNNING: dict[str, _WorkerCapture] = {}
_LOCK = threading.Lock()


def _model_runner(worker: Any) -> Any:
    """The model runner of what ``collective_rpc`` hands a function: a worker wrapper (whose
    ``worker`` holds the runner) or the worker itself."""
    for candidate in (worker, getattr(worker, "worker", None)):
        runner = getattr(candidate, "model_runner", None)
        if runner is not None and hasattr(runner, "execute_model"):
            return runner
    raise PrecisionInputError(
        f"capture_vllm: no model_runner with execute_model on {type(worker).__name__} "
        "(an unsupported vLLM version?)"
    )


def _start_in_worker(worker: Any, path: str, options: dict[str, Any]) -> int:
    """Runs in each worker: start capturing its runner's model into ``path``; its rank."""
    runner = _model_runner(worker)
    model = runner.model if hasattr(runner, "model") else runner.get_model()
    with _LOCK:
        if path in _RUNNING:
            raise PrecisionInputError(f"capture_vllm: already capturing into {path}")
        cap = capture(model, path, **options)
        cap.__enter__()
        _RUNNING[path] = _WorkerCapture(runner, cap)
    return rank_and_world_size()[0]


def _stop_in_worker(worker: Any, path: str) -> tuple[int, list[dict[str, Any]]]:
    """Runs in each worker: stop the capture into ``path``; its rank and batch layouts."""
    with _LOCK:
        running = _RUNNING.pop(path, None)
    if running is None:
        return -1, []
    rank = rank_and_world_size()[0]
    return rank, running.close()


# -- in the caller ---------------------------------------------------------------------------------


@dataclass
class VllmCapture:
    """What :func:`capture_vllm` yields: the dump's path and, once the block exits, the batch
    layouts by step (also in ``<path>/vllm_batches.json``)."""

    path: Path
    ranks: list[int]
    batches: dict[int, StepBatch]

    def request_rows(self, tensor: torch.Tensor, step: int, request: str) -> torch.Tensor:
        """:func:`request_rows` at ``step``."""
        try:
            batch = self.batches[step]
        except KeyError:
            raise PrecisionInputError(
                f"step {step} was not recorded (steps: {sorted(self.batches)})"
            ) from None
        return request_rows(tensor, batch, request)


@contextmanager
def capture_vllm(
    llm: Any,
    path: str | Path,
    *,
    level: Level = "mix",
    mode: Mode = "tensor",
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    steps: Iterable[int] | None = None,
) -> Iterator[VllmCapture]:
    """Capture the model a vLLM ``LLM`` runs into a native dump at ``path``::

        with capture_vllm(llm, "dump", level="mix") as cap:
            outputs = llm.generate(prompts, params)

    Each ``execute_model`` call that runs the model is one step (prefill, then one per decode
    step; a chunked prefill takes several). ``level``, ``mode``, ``include``, ``exclude`` and
    ``steps`` are :func:`capture`'s. Every worker (tensor-parallel rank) writes
    ``path/rank<r>/``; records keep vLLM's layout: activations flattened to
    ``[num_tokens, hidden]``, decoder layers returning ``(hidden, residual)``, custom ops
    (``_C.*``, the attention backend) named ``Custom.<namespace>.<op>``. Use
    :meth:`VllmCapture.request_rows` to take one request's rows.
    """
    if not hasattr(llm, "collective_rpc"):
        raise PrecisionInputError(
            f"capture_vllm needs a vllm.LLM (with collective_rpc), got {type(llm).__name__}"
        )
    target = Path(path).resolve()
    options: dict[str, Any] = {"level": level, "mode": mode, "include": include}
    options.update(exclude=exclude, steps=None if steps is None else sorted(steps))
    ranks = list(llm.collective_rpc(_start_in_worker, args=(str(target), options)))
    result = VllmCapture(target, ranks, {})
    try:
        yield result
    finally:
        stopped = llm.collective_rpc(_stop_in_worker, args=(str(target),))
        layouts: list[Any] = next((b for rank, b in sorted(stopped) if rank == min(ranks)), [])
        atomic_write(target / BATCHES, json.dumps({"steps": layouts}, indent=1).encode())
        result.batches = load_batches(target)
