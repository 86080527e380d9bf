"""Device backends (cpu, cuda, npu): availability, seeding, synchronization and versions.

Everything that differs between device kinds lives here, behind one small interface, so that
seeding, environment fingerprints and op replay treat every device the same way. A new kind of
device is a :class:`DeviceBackend` subclass passed to :func:`register_backend`.

Nothing here initializes an accelerator: CUDA reads ``CUBLAS_WORKSPACE_CONFIG`` once, so merely
printing a report header must not be what makes a later ``seed_all`` come too late.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import sys
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any, ClassVar

import numpy
import torch

from .._errors import PrecisionInputError

#: The seed a torch accelerator generator starts from when nobody seeded it (c10's
#: ``default_rng_seed_val``); restoring a never-seeded generator means going back to it.
TORCH_DEFAULT_SEED = 67280421310721


class DeviceBackend:
    """One kind of device. Subclasses override what their device supports."""

    #: Short name, also the torch device type (``"cpu"``, ``"cuda"``, ``"npu"``).
    name: ClassVar[str] = ""
    #: Environment variables that make this device's kernels and collectives deterministic.
    deterministic_env: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: Further environment variables worth recording next to results (device visibility).
    reported_env: ClassVar[tuple[str, ...]] = ()

    def is_available(self) -> tuple[bool, str]:
        """Return whether the device can be used, and a human reason either way."""
        raise NotImplementedError

    def seed(self, seed: int) -> None:
        """Seed the default generator of every device of this kind."""
        raise NotImplementedError

    def get_rng_state(self) -> Any:
        """Return an opaque value that :meth:`set_rng_state` puts back exactly."""
        raise NotImplementedError

    def set_rng_state(self, state: Any) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for all queued work on every device of this kind."""

    def device_name(self) -> str:
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Versions of the software stack behind this device, for reports and fingerprints."""
        return {}

    def late_env(self) -> dict[str, str]:
        """Map each variable of :attr:`deterministic_env` that this process can no longer apply
        to the reason why."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class CpuBackend(DeviceBackend):
    name = "cpu"

    def is_available(self) -> tuple[bool, str]:
        return True, f"{torch.get_num_threads()} torch threads"

    def seed(self, seed: int) -> None:
        # Not torch.manual_seed: that one also queues seeds for every accelerator.
        torch.default_generator.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def device_name(self) -> str:
        return _cpu_model() or platform.machine() or "unknown cpu"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


class AcceleratorBackend(DeviceBackend):
    """A device exposed through a ``torch.cuda``-like module (``torch.cuda``, ``torch.npu``)."""

    def module(self) -> Any:
        """Return the ``torch.<name>`` module; only called once the backend is available."""
        return getattr(torch, self.name)

    def device_count(self) -> int:
        return int(self.module().device_count())

    def seed(self, seed: int) -> None:
        self.module().manual_seed_all(seed)

    def get_rng_state(self) -> tuple[str, Any]:
        module = self.module()
        if module.is_initialized():
            return "states", module.get_rng_state_all()
        # Seeding an uninitialized device only queues the seed; remember what was queued instead
        # of initializing the device just to read a state.
        tracker = getattr(module, "_lazy_seed_tracker", None)
        if tracker is None:
            # torch_npu keeps no seed tracker: seeds join the lazy-call queue, so remember its
            # length and cut what was queued after.
            queue = getattr(module, "_queued_calls", None)
            return "queue", None if queue is None else len(queue)
        return "lazy", (
            tracker.manual_seed_all_cb,
            tracker.manual_seed_cb,
            list(tracker.call_order),
        )

    def set_rng_state(self, state: tuple[str, Any]) -> None:
        module = self.module()
        kind, payload = state
        if kind == "states":
            module.set_rng_state_all(payload)
            return
        if kind == "queue":
            if module.is_initialized():  # initialized in between: the queued seeds were applied
                module.manual_seed_all(TORCH_DEFAULT_SEED)
            elif payload is not None:
                del module._queued_calls[payload:]
            return
        tracker = getattr(module, "_lazy_seed_tracker", None)
        if tracker is not None and payload is not None:
            tracker.manual_seed_all_cb, tracker.manual_seed_cb, tracker.call_order = payload
        if module.is_initialized():
            # Initialized in between: replay what initialization would have applied.
            module.manual_seed_all(TORCH_DEFAULT_SEED)
            for queued in payload[2] if payload else ():
                if queued:
                    queued[0]()

    def synchronize(self) -> None:
        module = self.module()
        if module.is_initialized():
            for index in range(self.device_count()):
                module.synchronize(index)

    def device_name(self) -> str:
        module = self.module()
        count = self.device_count()
        if not module.is_initialized():
            # Naming the device would initialize it (see the module docstring).
            return f"{count} {self.name} device(s), not initialized yet"
        names = sorted({module.get_device_name(index) for index in range(count)})
        return f"{count} x {', '.join(names)}"


class CudaBackend(AcceleratorBackend):
    name = "cuda"
    deterministic_env = MappingProxyType({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    reported_env = ("CUDA_VISIBLE_DEVICES",)

    def is_available(self) -> tuple[bool, str]:
        if torch.version.cuda is None and torch.version.hip is None:
            return False, f"this torch build ({torch.__version__}) has no CUDA support"
        if not torch.cuda.is_available():
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None:
                return False, f"no CUDA device is visible (CUDA_VISIBLE_DEVICES={visible!r})"
            return False, "no CUDA device found (no GPU, or the driver is missing)"
        return True, f"{self.device_count()} device(s)"

    def versions(self) -> dict[str, str]:
        found = {"cuda": torch.version.cuda or f"hip {torch.version.hip}"}
        if torch.backends.cudnn.is_available():
            found["cudnn"] = str(torch.backends.cudnn.version())
        return found

    def late_env(self) -> dict[str, str]:
        if not torch.cuda.is_initialized():
            return {}
        return {
            "CUBLAS_WORKSPACE_CONFIG": "CUDA is already initialized in this process and cuBLAS "
            "keeps the workspace configuration it started with; export "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8 before Python starts"
        }


class NpuBackend(AcceleratorBackend):
    """Ascend NPUs through ``torch_npu``, which adds ``torch.npu`` when imported."""

    name = "npu"
    deterministic_env = MappingProxyType(
        {
            "HCCL_DETERMINISTIC": "TRUE",
            "LCCL_DETERMINISTIC": "1",
            "CLOSE_MATMUL_K_SHIFT": "1",
            "ATB_LLM_LCOC_ENABLE": "0",
        }
    )
    reported_env = ("ASCEND_RT_VISIBLE_DEVICES",)

    def is_available(self) -> tuple[bool, str]:
        torch_npu, reason = _import_torch_npu()
        if torch_npu is None:
            return False, reason
        npu = getattr(torch, "npu", None)
        try:
            visible_count = self.device_count() if npu is not None and npu.is_available() else 0
        except Exception as exc:  # a broken driver raises from the query itself
            return False, f"torch_npu could not query the NPUs: {type(exc).__name__}: {exc}"
        if not visible_count:
            visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
            where = f" (ASCEND_RT_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return False, f"torch_npu is installed but no NPU is visible{where}"
        return True, f"{visible_count} device(s)"

    def versions(self) -> dict[str, str]:
        torch_npu, _ = _import_torch_npu()
        if torch_npu is None:
            return {}
        return {
            "torch_npu": str(getattr(torch_npu, "__version__", "unknown")),
            "cann": _cann_version(torch_npu),
        }

    def late_env(self) -> dict[str, str]:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return {}
        reason = (
            "torch.distributed is already initialized and communicators read it when they are "
            "created; set it before init_process_group"
        )
        return {"HCCL_DETERMINISTIC": reason, "LCCL_DETERMINISTIC": reason}


#: Why ``torch_npu`` failed to import, once: a broken install is not retried on every check.
_TORCH_NPU_FAILURE: list[str] = []


def _import_torch_npu() -> tuple[ModuleType | None, str]:
    """Import ``torch_npu`` if it is installed; otherwise say why not."""
    module = sys.modules.get("torch_npu")
    if module is not None:
        return module, "imported"
    if _TORCH_NPU_FAILURE:
        return None, _TORCH_NPU_FAILURE[0]
    if importlib.util.find_spec("torch_npu") is None:
        return None, "torch_npu is not installed"
    try:
        return importlib.import_module("torch_npu"), "imported"
    except Exception as exc:  # a broken CANN install raises anything from OSError to RuntimeError
        reason = f"torch_npu is installed but failed to import: {type(exc).__name__}: {exc}"
        _TORCH_NPU_FAILURE.append(reason)
        return None, reason


def _cann_version(torch_npu: ModuleType) -> str:
    # torch_npu.utils.get_cann_version exists from CANN 8.1.RC1 on and answers "" before that.
    get_cann_version = getattr(getattr(torch_npu, "utils", None), "get_cann_version", None)
    if get_cann_version is not None:
        try:
            version = get_cann_version(module="CANN")
        except Exception:  # an introspection helper must never break a report
            version = ""
        if version:
            return str(version)
    return "unknown"


_BACKENDS: dict[str, DeviceBackend] = {}


def register_backend(backend: DeviceBackend) -> None:
    """Add (or replace) the backend for ``backend.name``."""
    _BACKENDS[backend.name] = backend


def backends() -> list[DeviceBackend]:
    """Every registered backend, available or not, in registration order."""
    return list(_BACKENDS.values())


def get_backend(name: str) -> DeviceBackend:
    try:
        return _BACKENDS[name]
    except KeyError:
        known = ", ".join(_BACKENDS)
        raise PrecisionInputError(f"unknown device {name!r}; known devices: {known}") from None


def backend_of(device: str | torch.device) -> DeviceBackend:
    """The backend of a device string (``"cuda:1"`` -> cuda), whether torch knows the kind or
    not yet (``"npu"`` before ``torch_npu`` is imported)."""
    kind, colon, index = str(device).partition(":")
    if colon and not index.isdigit():
        raise PrecisionInputError(f"not a device: {str(device)!r} (expected KIND or KIND:INDEX)")
    return get_backend(kind)


def available_devices() -> list[DeviceBackend]:
    """The registered backends that can run work in this process."""
    return [backend for backend in _BACKENDS.values() if backend.is_available()[0]]


def torch_determinism_flags() -> dict[str, bool]:
    """The process-wide torch switches that decide whether kernels are deterministic."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_algorithms_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


#: Environment variables that change numerics or determinism (beyond the device backends' own).
PRECISION_ENV = (
    # CPU: threads change reduction order; oneDNN / MKL may pick other kernels or fp math
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "ATEN_CPU_CAPABILITY",
    "KMP_DETERMINISTIC_REDUCTION",
    # CUDA
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_ALGO",
    "NCCL_PROTO",
    # Ascend
    "HCCL_DETERMINISTIC",
    "LCCL_DETERMINISTIC",
    "CLOSE_MATMUL_K_SHIFT",
    "ATB_LLM_LCOC_ENABLE",
    "ATB_MATMUL_SHUFFLE_K_ENABLE",
    "ASCEND_LAUNCH_BLOCKING",
    "INF_NAN_MODE_ENABLE",
    "ASCEND_RT_VISIBLE_DEVICES",
    # serving
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_V1",
)


def environment_fingerprint() -> dict[str, Any]:
    """Describe this process for dumps and reports: versions, devices, flags, env vars.

    The result is JSON-serializable; unset environment variables map to ``None``.
    """
    devices: dict[str, Any] = {}
    env_names: list[str] = []
    for backend in backends():
        available, reason = backend.is_available()
        entry: dict[str, Any] = {"available": available, "reason": reason}
        if available:
            entry["device_name"] = backend.device_name()
            entry["versions"] = backend.versions()
        devices[backend.name] = entry
        env_names += [*backend.deterministic_env, *backend.reported_env]
    env_names += [name for name in PRECISION_ENV if name not in env_names]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "devices": devices,
        "determinism": torch_determinism_flags(),
        "env": {name: os.environ.get(name) for name in env_names},
    }


def flat_fingerprint(fingerprint: Mapping[str, Any] | None = None) -> dict[str, str]:
    """A fingerprint as ``dotted.key -> str`` lines (unset values left out), for checklists
    that diff two runs line by line."""
    flat: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for name, item in value.items():
                walk(item, f"{key}.{name}" if key else str(name))
        elif value is not None:
            flat[key] = str(value)

    walk(environment_fingerprint() if fingerprint is None else fingerprint, "")
    return flat


for _backend in (CpuBackend(), CudaBackend(), NpuBackend()):
    register_backend(_backend)
