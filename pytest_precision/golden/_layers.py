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
from ._masking import LeftOut, keep_real, keep_real_later, mask_of
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


def check_all(
    golden: Golden,
    values: Sequence[tuple[str, Any, EnvelopeRequest]],
    left_out: dict[str, LeftOut] | None = None,
) -> None:
    """Check several goldens, all of them, then raise one error naming the first failing
    one in recording order (a bug shows first at the golden where it enters). ``left_out``:
    the masked positions each golden left out, for its report."""
    __tracebackhide__ = True
    failures: list[tuple[str, str]] = []
    left_out = left_out or {}
    with golden._lock:
        for name, value, request in values:
            try:
                golden._check(
                    value, name, NO_TOLERANCE, request, alone=False, left_out=left_out.get(name)
                )
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
    logits: bool | None = None,
    reference: bool = True,
    dtype: torch.dtype | None = None,
    golden: Golden | None = None,
    mask: torch.Tensor | bool | None = None,
    **kwargs: Any,
) -> None:
    """Assert each block's output (and the logits) of ``model(*inputs, **kwargs)`` against
    the running test's goldens, named by module path (``"logits"`` for the model output).

    ``modules``: module paths to check (default: :func:`repeated_blocks`). ``logits``: also
    check the model output as ``"logits"``; default yes, except against a dump (``--golden-dir``
    naming a capture), which records modules and ops, never a value named ``logits``.
    ``reference``:
    when recording, rerun the model in float64 and store the reference envelope; without
    it the goldens are marked multi-op (model-level rule). ``dtype``: cast the captured values
    first (a port computing in float32 that returns bf16). ``mask``: the ``(batch, seq)``
    positions to compare (1 real, 0 padding), by default the model's 2-D ``attention_mask``
    keyword; ``mask=False`` compares every position. Outputs at masked positions are never
    used by the model and follow each dtype's mask constant, so they are left out of the
    goldens (recorded and checked) and the verdict, and each golden's report counts them.
    """
    __tracebackhide__ = True
    golden = golden or current_golden()
    if logits is None:
        logits = golden.source.writable
    elif logits and not golden.source.writable:
        raise PrecisionInputError(
            f"logits=True: the golden is a dump ({golden.source.path}), which records modules "
            "and ops, not the model output as 'logits'; leave logits unset, or name the last "
            "module in modules="
        )
    paths = list(repeated_blocks(model) if modules is None else modules)
    real = mask_of(mask, kwargs)
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
    kept = {k: keep_real(v, real) for k, v in values.items()}
    values = {k: v for k, (v, _) in kept.items()}
    left_out = {k: n for k, (_, n) in kept.items() if n is not None}

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
                reference=keep_real_later(reference_of(name), real) if reference else None,
                source=SOURCE,
            ),
        )
        for name, value in values.items()
    ]
    check_all(golden, requests, left_out)
