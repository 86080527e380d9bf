"""A generator of ATB (msprobe ``atb_probe``) dump trees, written from the published layout.

``make_atb_dump`` runs a tiny decoder (embedding, then per layer an RMS norm, a linear and a
residual add; then the LM head) and writes what ``atb_probe`` would: per round (decode step)
``atb_dump_data/data/<device>_<pid>/<round>/<layerId>_<Layer>/<opId>_<Op>/<kernelId>_<Kernel>/``
with ``before/intensor<N>.bin`` and ``after/outtensor<N>.bin`` (tensor task), or one
``statistic.csv`` per round (statistics task). ``perturb=(layer_id, op_id)`` scales that
op's kernel output by 1.1 (a broken kernel), and the error flows on through the model.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pytest_precision.dump._atb import DTYPES, STAT_COLUMNS

CODES = {name: code for code, name in DTYPES.items()}


def bin_bytes(tensor: torch.Tensor, *, fmt: int = 2, alias: str | None = None) -> bytes:
    """A ``.bin`` file: the ASCII header lines, then the raw little-endian bytes (none for an
    alias, whose ``data=`` names the file holding them)."""
    t = tensor.detach().contiguous().cpu()
    dtype = str(t.dtype).removeprefix("torch.")
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    lines = [
        "$Version=1.0",
        "$Object.Count=1",
        f"$Object.Length={len(raw)}",
        f"format={fmt}",
        f"dtype={CODES[dtype]}",
        "dims=" + ",".join(str(n) for n in t.shape),
    ]
    if alias is not None:
        lines.append(f"data={alias}")
    lines += [f"$Object.data=0,{len(raw)}", "$End=1"]
    return ("\n".join(lines) + "\n").encode("ascii") + (b"" if alias is not None else raw)


@dataclass
class _Round:
    folder: Path
    device: int
    pid: int
    index: int
    task: str
    rows: list[list[str]] = field(default_factory=list)

    def save(
        self, node: str, stage: str, io: str, tensors: list[torch.Tensor], aliases: dict[int, str]
    ) -> None:
        for i, t in enumerate(tensors):
            if self.task == "tensor":
                path = self.folder / node / stage / f"{io}{i}.bin"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(bin_bytes(t, alias=aliases.get(i)))
                continue
            f = t.double()
            ids = "_".join(p.split("_")[0] for p in node.split("/"))
            self.rows.append([
                str(self.device), str(self.pid), str(self.index), ids, node, stage, io, str(i),
                "2", str(CODES[str(t.dtype).removeprefix("torch.")]),
                ",".join(str(n) for n in t.shape), repr(f.max().item()), repr(f.min().item()),
                repr(f.mean().item()), repr(f.norm().item()),
            ])  # fmt: skip

    def op(
        self,
        node: str,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        aliases: dict[int, str] | None = None,
    ) -> None:
        self.save(node, "before", "intensor", inputs, aliases or {})
        self.save(node, "after", "outtensor", outputs, {})


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
    out = root / "atb_dump_data"
    process = out / "data" / f"{device}_{pid}"
    for index in range(rounds):
        step = _Round(process / str(index), device, pid, index, task)
        step.folder.mkdir(parents=True)
        x_ids = ids if index == 0 else ids[-1:] + index  # decode: one new token per round
        x_ids = x_ids % vocab
        x = table[x_ids]
        for node in ("0_WordEmbedding", "0_WordEmbedding/0_GatherKernel"):
            step.op(node, [x_ids, table], [x])
        for i, (gamma, w) in enumerate(weights):
            layer = f"{i + 1}_Decoder_layer"
            n = _rms_norm(x, gamma)
            y = n @ w
            if perturb == (i + 1, 1):
                y = y * 1.1
            z = x + y
            if perturb == (i + 1, 2):
                z = z * 1.1
            step.op(layer, [x, gamma, w], [z])
            for op, kernel, ins, outs in (
                ("0_RmsNormOperation", "0_RmsNormKernel", [x, gamma], [n]),
                ("1_LinearOperation", "0_MatMulKernel", [n, w], [y]),
                ("2_ElewiseOperation", "0_AddBF16Kernel", [x, y], [z]),
            ):
                kernel_node = f"{layer}/{op}/{kernel}"
                # the operation's weight is the kernel's: stored once, the other is an alias
                alias = {1: f"{kernel_node}/before/intensor1.bin"} if op.startswith("1_") else None
                step.op(f"{layer}/{op}", ins, outs, alias if task == "tensor" else None)
                step.op(kernel_node, ins, outs)
            x = z
        logits = x @ head
        base = f"{layers + 1}_LmHead"
        for node in (base, f"{base}/0_LinearOperation", f"{base}/0_LinearOperation/0_MatMulKernel"):
            step.op(node, [x, head], [logits])
        if task == "statistics":
            with open(step.folder / "statistic.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(STAT_COLUMNS)
                writer.writerows(step.rows)
    return out
