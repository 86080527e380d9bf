"""Reproducible runs: seed everything, switch on deterministic kernels, check run-to-run equality.

Step 2 of the localization workflow: before two runs can be compared, each must be repeatable.
Every change :func:`seed_all` makes is recorded with how to undo it, so a test (or a block of
code) can be seeded without leaking RNG states, environment variables, torch flags or patched
functions into whatever runs next.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._errors import PrecisionInputError
from ..numerics._nested import flatten
from ._devices import available_devices, backends
from ._seeds import DEFAULT_SEED

#: ``torch.nn.functional`` functions that randomly drop elements; ``nn.Dropout`` and friends call
#: them through the module attribute, so replacing the attribute covers the module forms too.
DROPOUT_FUNCTIONS = (
    "dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
)

#: Differing items listed in a failure message before the rest are only counted.
MAX_REPORTED_ITEMS = 10


class DeterminismWarning(UserWarning):
    """A determinism setting could not take effect in this process."""


#: Active handles, oldest first: changes are process-wide, so they stack process-wide.
_ACTIVE: list[SeedHandle] = []
_ACTIVE_LOCK = threading.RLock()


class SeedHandle:
    """What :func:`seed_all` changed; :meth:`restore` (or leaving the ``with`` block) undoes it."""

    def __init__(self, seed: int, deterministic: bool, remove_dropout: bool, undo: ExitStack):
        self.seed = seed
        self.deterministic = deterministic
        self.remove_dropout = remove_dropout
        self._undo = undo
        self._active = True

    @property
    def active(self) -> bool:
        """``True`` until :meth:`restore` has run."""
        return self._active

    def restore(self) -> None:
        """Put back every RNG state, environment variable, torch flag and patched function.

        Undoes in reverse order of application. Handles created later and still active are
        restored first (their changes sit on top of this one's), so any restore order leaves
        the process as it was. Calling it again does nothing.
        """
        with _ACTIVE_LOCK:
            if not self._active:
                return
            while _ACTIVE and _ACTIVE[-1] is not self:
                _ACTIVE.pop()._close()
            if _ACTIVE:
                _ACTIVE.pop()
            self._close()

    def _close(self) -> None:
        self._active = False
        self._undo.close()

    def __enter__(self) -> SeedHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "active" if self._active else "restored"
        return (
            f"<SeedHandle seed={self.seed} deterministic={self.deterministic} "
            f"remove_dropout={self.remove_dropout} {state}>"
        )


def seed_all(
    seed: int = DEFAULT_SEED, *, deterministic: bool = True, remove_dropout: bool = True
) -> SeedHandle:
    """Seed Python, numpy, torch and every available device; optionally make kernels
    deterministic and dropout the identity.

    Returns a :class:`SeedHandle`; use it as a context manager or call ``.restore()``.
    A setting that cannot take effect any more in this process (for example
    ``CUBLAS_WORKSPACE_CONFIG`` once CUDA is initialized) emits a :class:`DeterminismWarning`
    that says why, instead of failing.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise PrecisionInputError(
            f"seed must be an int in [0, 2**32) (numpy's limit), got {seed!r}"
        )
    undo = ExitStack()
    try:
        _seed_generators(undo, seed)
        if deterministic:
            _enable_deterministic_mode(undo)
        if remove_dropout:
            _disable_dropout(undo)
    except BaseException:
        undo.close()
        raise
    handle = SeedHandle(seed, deterministic, remove_dropout, undo)
    with _ACTIVE_LOCK:
        _ACTIVE.append(handle)
    return handle


def _seed_generators(undo: ExitStack, seed: int) -> None:
    undo.callback(random.setstate, random.getstate())
    random.seed(seed)
    undo.callback(np.random.set_state, np.random.get_state())
    np.random.seed(seed)
    for backend in available_devices():
        undo.callback(backend.set_rng_state, backend.get_rng_state())
        backend.seed(seed)


#: Other values of a determinism variable that are just as deterministic.
_EQUIVALENT_ENV: dict[str, tuple[str, ...]] = {"CUBLAS_WORKSPACE_CONFIG": (":4096:8", ":16:8")}


def _enable_deterministic_mode(undo: ExitStack) -> None:
    available = {backend.name for backend in available_devices()}
    for backend in backends():
        late = backend.late_env() if backend.name in available else {}
        for name, value in backend.deterministic_env.items():
            previous = os.environ.get(name)
            if previous in _EQUIVALENT_ENV.get(name, ()):
                continue  # already a deterministic setting: keep the user's choice
            undo.callback(_restore_env, name, previous)
            os.environ[name] = value
            if previous != value and name in late:
                warnings.warn(
                    f"{name}={value} cannot take effect: {late[name]}",
                    DeterminismWarning,
                    stacklevel=3,
                )
    undo.callback(
        torch.use_deterministic_algorithms,
        torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    cudnn = torch.backends.cudnn
    undo.callback(setattr, cudnn, "deterministic", cudnn.deterministic)
    undo.callback(setattr, cudnn, "benchmark", cudnn.benchmark)
    cudnn.deterministic = True
    cudnn.benchmark = False


def _restore_env(name: str, previous: str | None) -> None:
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous


def _disable_dropout(undo: ExitStack) -> None:
    for name in DROPOUT_FUNCTIONS:
        _replace(undo, F, name, _identity_dropout)
    _replace(
        undo,
        F,
        "scaled_dot_product_attention",
        _without_attention_dropout(F.scaled_dot_product_attention),
    )


def _replace(undo: ExitStack, owner: object, name: str, replacement: object) -> None:
    undo.callback(setattr, owner, name, getattr(owner, name))
    setattr(owner, name, replacement)


def _identity_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """Dropout with every element kept and no rescaling: the eval-mode result. The signature
    is spelled out (every ``torch.nn.functional`` dropout shares it) so TorchScript compiles
    models that call it."""
    return input


def _without_attention_dropout(sdpa: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``scaled_dot_product_attention`` so that ``dropout_p`` is always 0."""

    @functools.wraps(sdpa)
    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 4:  # query, key, value, attn_mask, dropout_p, ...
            args = (*args[:4], 0.0, *args[5:])
        else:
            kwargs["dropout_p"] = 0.0
        return sdpa(*args, **kwargs)

    return scaled_dot_product_attention


# --- run-twice check -----------------------------------------------------------------------


def assert_deterministic(
    fn: Callable[..., Any],
    /,
    *args: Any,
    runs: int = 3,
    seed: int = DEFAULT_SEED,
    deterministic: bool = True,
    locate: torch.nn.Module | None = None,
    **kwargs: Any,
) -> None:
    """Call ``fn(*args, **kwargs)`` ``runs`` times, each under ``seed_all(seed)``, and assert
    that every output leaf is bitwise identical to the first run's.

    ``deterministic`` switches on deterministic kernels for the runs (dropout is kept: under the
    same seed its masks repeat). ``locate`` names a model whose submodules are hooked so that a
    failure also names the first module, in call order, whose output changed. Keyword arguments
    called ``runs``, ``seed``, ``deterministic`` or ``locate`` are taken by this function; pass
    them to ``fn`` through a ``functools.partial``.
    """
    if runs < 2:
        raise PrecisionInputError(f"assert_deterministic needs runs >= 2, got {runs}")
    tracer = _ModuleTracer(locate) if locate is not None else None
    first: list[tuple[str, Any]] = []
    first_trace: list[tuple[str, int, str]] = []
    for run in range(1, runs + 1):
        trace_context: AbstractContextManager[list[tuple[str, int, str]]] = (
            tracer.trace() if tracer is not None else nullcontext([])
        )
        with (
            seed_all(seed, deterministic=deterministic, remove_dropout=False),
            trace_context as trace,
        ):
            leaves = [(path, _keep(path, leaf)) for path, leaf in flatten(fn(*args, **kwargs))]
        if run == 1:
            first, first_trace = leaves, trace
            continue
        problems = _differences(first, leaves, run)
        if problems:
            header = (
                f"{_callable_name(fn)} is not deterministic: run {run} of {runs} differs from "
                f"run 1 (seed {seed}, deterministic algorithms {'on' if deterministic else 'off'})"
            )
            lines = [header, *(f"  {problem}" for problem in problems)]
            if tracer is not None:
                lines.append(f"  {_first_module_difference(first_trace, trace, run)}")
            raise AssertionError("\n".join(lines))


#: Leaves compared by value (floats and complex numbers bit by bit).
_PLAIN_LEAVES = (bool, int, float, complex, str, bytes, type(None))


def _keep(path: str, leaf: Any) -> Any:
    """Copy array leaves, so a buffer the callee reuses cannot change a recorded output; numpy
    scalars become 0-d arrays (compared bit by bit). Anything else cannot be compared."""
    if isinstance(leaf, torch.Tensor):
        if leaf.layout != torch.strided:
            return leaf.detach().to_dense()
        return leaf.detach().clone()
    if isinstance(leaf, (np.ndarray, np.generic)):
        array = np.array(leaf)
        if array.dtype.hasobject:
            raise PrecisionInputError(f"{path or 'output'}: cannot compare a numpy object array")
        return array
    if isinstance(leaf, _PLAIN_LEAVES):
        return leaf
    raise PrecisionInputError(
        f"{path or 'output'}: cannot compare a {type(leaf).__name__} between runs; return "
        "tensors, arrays, numbers or strings (in tuples, lists, dicts or dataclasses)"
    )


def _callable_name(fn: Callable[..., Any]) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or repr(fn)


def _differences(first: list[tuple[str, Any]], later: list[tuple[str, Any]], run: int) -> list[str]:
    first_paths = [path for path, _ in first]
    later_paths = [path for path, _ in later]
    if first_paths != later_paths:
        return [
            f"the output structure differs: run 1 has items {_paths(first_paths)}, "
            f"run {run} has {_paths(later_paths)}"
        ]
    problems = [
        f"{path or 'output'}: {problem}"
        for (path, a), (_, b) in zip(first, later, strict=True)
        if (problem := _leaf_difference(a, b, run)) is not None
    ]
    if len(problems) > MAX_REPORTED_ITEMS:
        hidden = len(problems) - MAX_REPORTED_ITEMS
        problems = [*problems[:MAX_REPORTED_ITEMS], f"... and {hidden} more differing items"]
    return problems


def _paths(paths: list[str]) -> str:
    shown = ", ".join(path or "output" for path in paths[:MAX_REPORTED_ITEMS])
    more = f", ... ({len(paths)} in all)" if len(paths) > MAX_REPORTED_ITEMS else ""
    return f"[{shown}{more}]"


def _leaf_difference(a: Any, b: Any, run: int) -> str | None:
    """Say how ``b`` (from ``run``) differs bitwise from ``a`` (from run 1), or return None."""
    if type(a) is not type(b):
        return f"run 1 gave a {type(a).__name__}, run {run} a {type(b).__name__}"
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return _array_difference(a, b, run)
    return None if _bits(a) == _bits(b) else f"run 1 = {a!r}, run {run} = {b!r}"


def _bits(value: Any) -> Any:
    """Floats and complex numbers bit by bit: nan equals nan, -0.0 differs from 0.0."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, complex):
        return (value.real.hex(), value.imag.hex())
    return value


def _array_difference(
    a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray, run: int
) -> str | None:
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return f"run 1 gave {a.dtype} {tuple(a.shape)}, run {run} gave {b.dtype} {tuple(b.shape)}"
    a_bytes, b_bytes = _element_bytes(a), _element_bytes(b)
    differs = (a_bytes != b_bytes).any(axis=1)
    count = int(differs.sum())
    if count == 0:
        return None
    flat = int(np.argmax(differs))
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(a.shape)))
    return (
        f"{count} of {differs.size} elements differ ({a.dtype}, shape {tuple(a.shape)}); "
        f"first at index {index}: run 1 = {_element(a, a_bytes, flat)}, "
        f"run {run} = {_element(b, b_bytes, flat)}"
    )


def _element_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """View ``x`` as a ``(numel, itemsize)`` uint8 array: one row of raw bytes per element."""
    if isinstance(x, torch.Tensor):
        raw = x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        itemsize = x.element_size()
    else:
        raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        itemsize = x.itemsize
    return raw.reshape(-1, itemsize)


def _element(x: torch.Tensor | np.ndarray, rows: np.ndarray, flat: int) -> str:
    value = x.reshape(-1)[flat].item()
    if not isinstance(value, (float, complex)):
        return repr(value)
    # Most significant byte first, per part: a complex number is its real part, then imaginary.
    parts = np.split(rows[flat], 2 if isinstance(value, complex) else 1)
    if sys.byteorder == "little":
        parts = [part[::-1] for part in parts]
    return f"{value!r} (bits {' '.join('0x' + part.tobytes().hex() for part in parts)})"


class _ModuleTracer:
    """Record a digest of every submodule's output, in call order, to compare runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not isinstance(model, torch.nn.Module):
            raise PrecisionInputError(
                f"locate must be a torch.nn.Module, got {type(model).__name__}"
            )
        self.model = model

    @contextmanager
    def trace(self) -> Iterator[list[tuple[str, int, str]]]:
        calls: list[tuple[str, int, str]] = []
        counts: dict[str, int] = {}

        def hook_for(name: str) -> Callable[..., None]:
            def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
                counts[name] = counts.get(name, 0) + 1
                calls.append((name, counts[name], _digest(output)))

            return record

        handles = [
            module.register_forward_hook(hook_for(_module_label(name, module)))
            for name, module in self.model.named_modules()
        ]
        try:
            yield calls
        finally:
            for handle in handles:
                handle.remove()


def _module_label(name: str, module: torch.nn.Module) -> str:
    where = repr(name) if name else "the model itself"
    return f"{where} ({type(module).__name__})"


def _digest(output: Any) -> str:
    digest = hashlib.sha256()
    for path, leaf in flatten(output):
        digest.update(path.encode())
        if (isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided) or (
            isinstance(leaf, np.ndarray) and not leaf.dtype.hasobject
        ):
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
            digest.update(_element_bytes(leaf).tobytes())
        elif isinstance(leaf, (*_PLAIN_LEAVES, np.generic)):
            digest.update(repr(_bits(leaf)).encode())
        else:  # an opaque object (a KV cache, say): its repr may hold a memory address
            digest.update(type(leaf).__qualname__.encode())
    return digest.hexdigest()


def _first_module_difference(
    first: list[tuple[str, int, str]], later: list[tuple[str, int, str]], run: int
) -> str:
    for (name, call, digest), (later_name, later_call, later_digest) in zip(
        first, later, strict=False
    ):
        if (name, call) != (later_name, later_call):
            return (
                f"module calls diverge: run 1 called {name}, call {call}, where run {run} "
                f"called {later_name}, call {later_call}"
            )
        if digest != later_digest:
            return f"first module whose output differed: {name}, call {call}"
    if len(first) != len(later):
        return f"run 1 made {len(first)} module calls, run {run} made {len(later)}"
    return "every module output was identical; the difference arose outside the model's modules"
