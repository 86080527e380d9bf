"""Generate with vLLM at tensor-parallel size 2 under capture_vllm, twice in one engine: clean,
then with one wrong element in rank 1's shard of layer 1's fused q/k/v projection.

    python vllm_tp_run.py MODEL_DIR DUMPS MAX_TOKENS PROMPT [PROMPT ...]

Writes ``DUMPS/clean`` and ``DUMPS/planted``; prints one JSON line: the generated token ids
of each run and the ranks captured. The workers are processes of their own (the multiprocess
executor), reached through ``collective_rpc``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: the element of layer 1's q projection made wrong: the first row of rank 1's q head
PLANTED_ROW, PLANTED_COLUMN, PLANTED_DELTA = 32, 3, 0.5


def plant(worker: Any, model_dir: str) -> int:
    """In each worker: rank 1 rebuilds its shard of layer 1's q/k/v weight from the checkpoint
    with one element of its q head changed, and has vLLM pack it as at load. Its tp rank."""
    import torch
    from safetensors.torch import load_file
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    runner = worker.model_runner if hasattr(worker, "model_runner") else worker.worker.model_runner
    layer = runner.model.model.layers[1].self_attn.qkv_proj
    if layer.tp_rank != 1:
        return int(layer.tp_rank)
    full = load_file(str(Path(model_dir) / "model.safetensors"))
    prefix = "model.layers.1.self_attn"
    q, k, v = (full[f"{prefix}.{name}_proj.weight"] for name in "qkv")
    q = q.clone()
    q[PLANTED_ROW, PLANTED_COLUMN] += PLANTED_DELTA
    heads, kv_heads, head = layer.num_heads, layer.num_kv_heads, layer.head_size
    first_kv = layer.tp_rank // layer.num_kv_head_replicas * kv_heads * head
    rows = slice(layer.tp_rank * heads * head, (layer.tp_rank + 1) * heads * head)
    kv_rows = slice(first_kv, first_kv + kv_heads * head)
    shard = torch.cat([q[rows], k[kv_rows], v[kv_rows]]).to(layer.params_dtype)
    layer.weight = torch.nn.Parameter(shard, requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    return int(layer.tp_rank)


def main(argv: list[str]) -> None:
    from vllm import LLM, SamplingParams

    from pytest_precision.integrations._vllm import capture_vllm

    model, dumps, max_tokens, *prompts = argv
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=4,
              seed=0, tensor_parallel_size=2)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=True)
    tokens, ranks = {}, {}
    for run in ("clean", "planted"):
        if run == "planted":
            llm.collective_rpc(plant, args=(model,))
        with capture_vllm(llm, Path(dumps) / run, level="mix") as cap:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens[run] = [list(o.outputs[0].token_ids) for o in outputs]
        ranks[run] = cap.ranks
    print(json.dumps({"tokens": tokens, "ranks": ranks}))


if __name__ == "__main__":
    main(sys.argv[1:])
