"""A vLLM engine at tensor_parallel_size=2 (CPU, two worker processes)
loads a version through the tensorhub backend; run by test_vllm_tp2.py in
its own process (vLLM patches torch in the process that creates the engine).

Prints one JSON line: the engine's greedy generations before and after the
load, transformers' on the published weights, and each rank's stats.
Usage: python vllm_tp2_main.py TMPDIR
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    tmp = sys.argv[1]
    os.environ.update({
        "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CACHE_ROOT": os.path.join(tmp, "cache"), "TMPDIR": tmp,
        "TENSORHUB_LOG": "warn", "VLLM_LOGGING_LEVEL": "WARNING",
        # collective_rpc of a function (tensorhub.vllm.worker_stats) to the
        # worker processes.
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    })
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from vllm import LLM, SamplingParams

    import tensorhub
    import tensorhub.vllm
    from tensorhub import reshard
    from vllm_procs import MAX_TOKENS, PROMPTS, _reference, make_model_dir

    mdir = os.path.join(tmp, "tiny-qwen2")
    make_model_dir(mdir)
    torch.manual_seed(7)
    config = Qwen2Config.from_pretrained(mdir)
    model = Qwen2ForCausalLM(config).float().eval()
    weights = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    hub = tensorhub.serve_hub()
    trainer = tensorhub.connect(hub.address)
    trainer.publish("policy", 1, weights)
    llm = LLM(model=mdir, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
              max_model_len=128, max_num_seqs=8, kv_cache_memory_bytes=64 << 20,
              enforce_eager=True, tensor_parallel_size=2, distributed_executor_backend="mp",
              weight_transfer_config={"backend": "tensorhub"})
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def generate():
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    before = generate()
    llm.init_weight_transfer_engine({"init_info": {"hub": hub.address, "timeout_s": 60.0}})
    llm.start_weight_update()
    llm.update_weights({"update_info": {"model": "policy", "version": 1}})
    llm.finish_weight_update()
    after = generate()
    stats = [s for per in llm.collective_rpc(tensorhub.vllm.worker_stats) for s in per]
    boxes = {
        r: sum(reshard.box_elements(reshard.tp_rank_box(n, list(t.shape), r, 2, config)) * 4
               for n, t in weights.items())
        for r in range(2)
    }
    print(json.dumps({
        "before": before, "after": after, "reference": _reference(model),
        "total_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
        "box_bytes": boxes, "trainer": trainer.worker_id,
        "stats": [{"rank": s["rank"], "slices": s["slices"], "bytes": s["fetch"]["bytes"],
                   "sources": s["fetch"]["sources"]} for s in stats],
    }), flush=True)
    llm.shutdown() if hasattr(llm, "shutdown") else None
    hub.close()
