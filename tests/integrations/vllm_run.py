"""Generate with vLLM under capture_vllm in a process of its own (a process holds one vLLM CPU
engine: a second one fails to register its kernels again).

    python vllm_run.py MODEL_DIR DTYPE DUMP MAX_TOKENS PROMPT [PROMPT ...]

Prints one JSON line: the generated token ids per prompt and the steps recorded.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    from vllm import LLM, SamplingParams

    from pytest_precision.integrations._vllm import capture_vllm

    model, dtype, dump, max_tokens, *prompts = argv
    # the engine of test_vllm.py's fixture, block size and cache size included
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=128, max_num_seqs=4,
              seed=0, enable_prefix_caching=True, block_size=32,
              num_gpu_blocks_override=16)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=True)
    with capture_vllm(llm, dump, level="mix") as cap:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    print(json.dumps({"tokens": tokens, "steps": sorted(cap.batches), "ranks": cap.ranks}))


if __name__ == "__main__":
    main(sys.argv[1:])
