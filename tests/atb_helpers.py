"""A generator of ATB (msprobe ``atb_probe``) dump trees, written as atb_probe's source writes
them (see docs/atb.md for what is verified and what is assumed).

``make_atb_dump`` runs a tiny decoder (embedding, then per layer an RMS norm, a linear and a
residual add; then the LM head) and writes, per round (decode step),
``atb_dump_data/data/<device>_<pid>/<round>/<layerId>_<Layer>/<opId>_<Op>/<kernelId>_<Kernel>/``
with ``before/intensor<N>.bin`` and ``after/outtensor<N>.bin`` (``tensor`` and ``all`` tasks) and
one ``statistic.csv`` (every task; statistics in ``statistics`` and ``all``, tensor paths in
``tensor`` and ``all``). ``filter_level`` 1 stores a tensor that an earlier operation of the same
layer saved as an alias (``data=<op ids>_<io><N>.bin``); 2 also leaves the kernels' data out.
``perturb=(layer_id, op_id)`` scales that op's kernel output by 1.1 (a broken kernel), and the
error flows on through the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pytest_precision.dump._atb_bin import DTYPES, MKI_DTYPES
from pytest_precision.dump._atb_csv import STAT_COLUMNS

CODES = {name: code for code, name in DTYPES.items()}
ND = 2


def bin_bytes(tensor: torch.Tensor, *, fmt: int = ND, alias: str | None = None) -> bytes:
    """A ``.bin`` file: the ASCII header lines, then the raw little-endian bytes (none for an
    alias, whose ``data=`` names the tensor holding them)."""
    t = tensor.detach().contiguous().cpu()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    stored = b"" if alias is not None else raw
    lines = [
        "$Version=1.0",
        f"$Object.Count={0 if alias is not None else 1}",
        f"$Object.Length={len(stored)}",
        f"format={fmt}",
        f"dtype={CODES[_dtype(t)]}",
        "dims=" + ",".join(str(n) for n in t.shape),
    ]
    lines += [f"data={alias}"] if alias is not None else [f"$Object.data=0,{len(raw)}"]
    return ("\n".join([*lines, "$End=1"]) + "\n").encode("ascii") + stored


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def statistics(t: torch.Tensor) -> list[str]:
    """Max, Min, Mean, Norm as atb_probe writes them (``std::to_string``: ``%f``, integers
    as integers; none for bool), computed here in float64."""
    if t.dtype == torch.bool:
        return ["N/A"] * 4
    f = t.double()
    ends = [f.max().item(), f.min().item()]
    if not t.is_floating_point():
        return [str(int(v)) for v in ends] + [f"{f.mean().item():f}", f"{f.norm().item():f}"]
    return [f"{v:f}" for v in (*ends, f.mean().item(), f.norm().item())]


@dataclass
class Op:
    """An op: its ``<id>_<Name>`` folder, the tensors it received and produced, the ops inside."""

    folder: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    children: list[Op] = field(default_factory=list)


@dataclass
class _Round:
    out: Path
    process: str
    index: int
    task: str
    filter_level: int
    rows: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.out / "data" / self.process / str(self.index)

    def layer(self, op: Op) -> None:
        """Write a layer-level op and the ops inside it, in atb_probe's order."""
        self._write(op, "", {})

    def _write(self, op: Op, parent: str, saved: dict[int, str]) -> None:
        path = f"{parent}/{op.folder}" if parent else op.folder
        self._save(path, "intensor", op.inputs, saved)
        for child in op.children:
            self._write(child, path, saved)
        self._save(path, "outtensor", op.outputs, saved)

    def _save(self, path: str, io: str, tensors: list[torch.Tensor], saved: dict[int, str]) -> None:
        ids = "_".join(p.split("_")[0] for p in path.split("/"))
        names = "/".join(p.split("_", 1)[1] for p in path.split("/"))
        kernel = path.endswith("Kernel")
        for i, t in enumerate(tensors):
            alias = None
            if self.filter_level == 2 and kernel:
                alias = f"{io}{i}.bin"  # the kernel's data are left out
            elif self.filter_level and not kernel:  # kernels are not in the layer graph
                alias = saved.get(id(t))
                saved.setdefault(id(t), f"{ids}_{io}{i}.bin")
            file = f"{path}/{'before' if io == 'intensor' else 'after'}/{io}{i}.bin"
            if self.task != "statistics":
                (self.folder / file).parent.mkdir(parents=True, exist_ok=True)
                (self.folder / file).write_bytes(bin_bytes(t, alias=alias))
            stats = statistics(t) if self.task != "tensor" else ["N/A"] * 4
            tensor_path = f"{self.folder}/{file}" if self.task != "statistics" else "N/A"
            self.rows.append(",".join([
                self.process, str(self.index), names, names.rsplit("/", 1)[-1], ids,
                "input" if io == "intensor" else "output", str(i), MKI_DTYPES[CODES[_dtype(t)]],
                "nd", "x".join(str(n) for n in t.shape), *stats, tensor_path,
            ]))  # fmt: skip

    def finish(self) -> None:
        text = "\n".join([",".join(STAT_COLUMNS), *self.rows]) + "\n"
        (self.folder / "statistic.csv").write_text(text, encoding="utf-8")


def _rms_norm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype) * gamma


def make_atb_dump(
    root: Path,
    *,
    layers: int = 3,
    hidden: int = 8,
    vocab: int = 16,
    prompt: int = 4,
    rounds: int = 2,
    dtype: torch.dtype = torch.float32,
    perturb: tuple[int, int] | None = None,
    task: str = "tensor",
    filter_level: int = 1,
    device: int = 0,
    pid: int = 4242,
    seed: int = 0,
) -> Path:
    """Write a dump under ``root``; returns its ``atb_dump_data`` folder."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, hidden, generator=gen).to(dtype)
    weights = [
        (1 + 0.1 * torch.randn(hidden, generator=gen), torch.randn(hidden, hidden, generator=gen))
        for _ in range(layers)
    ]
    weights = [(g.to(dtype), (w / math.sqrt(hidden)).to(dtype)) for g, w in weights]
    head = (torch.randn(hidden, vocab, generator=gen) / math.sqrt(hidden)).to(dtype)
    ids = torch.randint(0, vocab, (prompt,), generator=gen)
    out = (root / "atb_dump_data").resolve()
    for index in range(rounds):
        step = _Round(out, f"{device}_{pid}", index, task, filter_level)
        step.folder.mkdir(parents=True)
        x_ids = (ids if index == 0 else ids[-1:] + index) % vocab  # decode: one token per round
        x = table[x_ids]
        step.layer(Op("0_WordEmbedding", [x_ids, table], [x], [
            Op("0_GatherKernel", [x_ids, table], [x]),
        ]))  # fmt: skip
        for i, (gamma, w) in enumerate(weights):
            n = _rms_norm(x, gamma)
            y = n @ w
            if perturb == (i + 1, 1):
                y = y * 1.1
            z = x + y
            if perturb == (i + 1, 2):
                z = z * 1.1
            step.layer(Op(f"{i + 1}_Decoder_layer", [x, gamma, w], [z], [
                Op("0_RmsNormOperation", [x, gamma], [n], [Op("0_RmsNormKernel", [x, gamma], [n])]),
                Op("1_LinearOperation", [n, w], [y], [Op("0_MatMulKernel", [n, w], [y])]),
                Op("2_ElewiseOperation", [x, y], [z], [Op("0_AddBF16Kernel", [x, y], [z])]),
            ]))  # fmt: skip
            x = z
        logits = x @ head
        kernel = Op("0_MatMulKernel", [x, head], [logits])
        step.layer(Op(f"{layers + 1}_LmHead", [x, head], [logits], [
            Op("0_LinearOperation", [x, head], [logits], [kernel]),
        ]))  # fmt: skip
        step.finish()
    return out
