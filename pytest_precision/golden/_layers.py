"""``assert_layers_close_to_golden``: every decoder layer's output and the logits as goldens.

One forward with hooks, one golden per module (named by its module path), in forward order.
When recording, the same model is rerun in float64 (:func:`float64_reference`) so each golden
stores its noise envelope; all goldens are checked before anything is raised, and the error
names the first failing one: with a bug, the layer where it enters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._errors import PrecisionInputError
from .._text import shown_text
from ._assert import current_golden
from ._envelope import EnvelopeRequest
from ._golden import Golden
from ._reference import capture_outputs, float64_reference, primary_output, upcast
from ._tolerances import NO_TOLERANCE

SOURCE = "assert_layers_close_to_golden"


def repeated_blocks(model: torch.nn.Module) -> list[str]:
    """The module paths of the model's repeated blocks: the children of its first
    ``nn.ModuleList`` (``model.layers.*`` in Llama, ``transformer.h.*`` in GPT-2)."""
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module):
            prefix = f"{path}." if path else ""
            return [f"{prefix}{child}" for child, _ in module.named_children()]
    raise PrecisionInputError(
        f"{type(model).__name__} has no nn.ModuleList of blocks; name the modules to check "
        "with modules=[...] (paths as model.named_modules() spells them)"
    )


def check_all(golden: Golden, values: Sequence[tuple[str, Any, EnvelopeRequest]]) -> None:
    """Check several goldens, all of them, then raise one error naming the first failing
    one in recording order (a bug shows first at the golden where it enters)."""
    __tracebackhide__ = True
    failures: list[tuple[str, str]] = []
    with golden._lock:
        for name, value, request in values:
            try:
                golden._check(value, name, NO_TOLERANCE, request, alone=False)
            except AssertionError as exc:
                failures.append((name, str(exc)))
    if not failures:
        return
    names = [name for name, _, _ in values]
    first, message = failures[0]
    passed = names[: names.index(first)]
    others = [name for name, _ in failures[1:]]
    head = f"{golden.test_id}: first failing golden: {first}"
    head += f" ({', '.join(passed)} passed" if passed else " (the first one checked"
    head += f"; {', '.join(others)} also fail)" if others else ")"
    raise AssertionError(shown_text("\n".join([head, message])))


def assert_layers_close_to_golden(
    model: torch.nn.Module,
    *inputs: Any,
    modules: Sequence[str] | None = None,
    logits: bool = True,
    reference: bool = True,
    dtype: torch.dtype | None = None,
    golden: Golden | None = None,
    **kwargs: Any,
) -> None:
    """Assert each block's output (and the logits) of ``model(*inputs, **kwargs)`` against
    the running test's goldens, named by module path (``"logits"`` for the model output).

    ``modules``: module paths to check (default: :func:`repeated_blocks`). ``reference``:
    when recording, rerun the model in float64 and store the reference envelope; without
    it the goldens are marked multi-op (model-level rule). ``dtype``: cast the captured values
    first (a port computing in float32 that returns bf16).
    """
    __tracebackhide__ = True
    golden = golden or current_golden()
    paths = list(repeated_blocks(model) if modules is None else modules)
    if "logits" in paths:
        raise PrecisionInputError("'logits' names the model output; no module may take it")
    with torch.no_grad(), capture_outputs(model, paths) as captured:
        output = model(*inputs, **kwargs)
    missing = [p for p in paths if p not in captured]
    if missing:
        raise PrecisionInputError(f"modules {missing} did not run in the forward")
    values: dict[str, Any] = {p: captured[p] for p in captured}  # forward order
    if logits:
        values["logits"] = primary_output(output)
    if dtype is not None:
        values = {k: upcast(v, dtype) for k, v in values.items()}

    cache: list[dict[str, Any]] = []

    def reference_of(name: str) -> Callable[[], Any]:
        def run() -> Any:
            if not cache:  # one float64 forward for every golden, only when recording
                out, caps = float64_reference(model, *inputs, capture=paths, **kwargs)
                cache.append({**caps, "logits": primary_output(out)})
            return cache[0][name]

        return run

    requests = [
        (
            name,
            value,
            EnvelopeRequest(
                kind=None if reference else "model",
                reference=reference_of(name) if reference else None,
                source=SOURCE,
            ),
        )
        for name, value in values.items()
    ]
    check_all(golden, requests)
