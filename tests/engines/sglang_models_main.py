"""tensorhub.sglang's loader against SGLang's own model classes (SGLang's
Python package, put first on PYTHONPATH by test_sglang_models.py).

SGLang serves on GPUs only, but its model classes build on this CPU (TP 1,
a gloo group) once its runtime context is published. For a tiny Llama and a
tiny Mixtral (4 experts, tied embeddings off), a trainer publishes the
Hugging Face weights; SGLang's own model is then loaded twice: through
``tensorhub.sglang.load_weights`` called as SGLang's weight updater calls a
custom loader, inside the weight-update session's own steps
(``DefaultModelLoader.restore_weights_before_loading`` /
``postprocess_weights``), and directly with SGLang's ``load_weights`` on the
same weights. Every parameter must be equal. Prints one JSON line.
Where SGLang stops on this CPU is printed instead (and the test fails).

Usage: python sglang_models_main.py TMPDIR
"""

from __future__ import annotations

import json
import os
import socket
import sys

if __name__ == "__main__":
    tmp = sys.argv[1]
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    import tensorhub
    import tensorhub.sglang as ths

    small = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    configs = {
        "llama": (LlamaConfig(**small, architectures=["LlamaForCausalLM"]), LlamaForCausalLM),
        "mixtral": (MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2,
                                  architectures=["MixtralForCausalLM"]), MixtralForCausalLM),
    }
    model_dir = os.path.join(tmp, "llama")
    configs["llama"][0].save_pretrained(model_dir)

    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    publish(ServerArgs(model_path=model_dir, device="cpu", skip_tokenizer_init=True),
            role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=0, gpu_id=0))
    initialize_model_parallel(backend="gloo")
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.models.llama import LlamaForCausalLM as SGLlama
    from sglang.srt.models.mixtral import MixtralForCausalLM as SGMixtral
    from sglang.srt.utils import dynamic_import

    sg_classes = {"llama": SGLlama, "mixtral": SGMixtral}
    out = {}
    cpu = torch.device("cpu")
    with tensorhub.serve_hub() as hub, tensorhub.connect(hub.address) as trainer:
        for v, (kind, (cfg, hf_cls)) in enumerate(configs.items(), start=1):
            torch.manual_seed(v)
            hf = hf_cls(cfg).float()
            # The checkpoint's names and layout (transformers 5 keeps MoE
            # experts fused in memory and writes them per expert), which
            # SGLang's loaders expect: what save_pretrained writes.
            ckpt = os.path.join(tmp, f"ckpt-{kind}")
            hf.save_pretrained(ckpt)
            weights = {}
            for f in sorted(os.listdir(ckpt)):
                if f.endswith(".safetensors"):
                    weights.update(load_file(os.path.join(ckpt, f)))
            trainer.publish(kind, 1, weights)
            torch.manual_seed(100)
            via_hub = sg_classes[kind](cfg, quant_config=None)
            torch.manual_seed(100)
            direct = sg_classes[kind](cfg, quant_config=None)
            # SGLang's weight-update session around a custom loader, as its
            # scheduler and model runner run them.
            DefaultModelLoader.restore_weights_before_loading(via_hub, cpu)
            dynamic_import(ths.LOADER)(via_hub, ths.request(kind, 1, hub=hub.address))
            DefaultModelLoader.postprocess_weights(via_hub, cpu)
            direct.load_weights(list(weights.items()))
            DefaultModelLoader.postprocess_weights(direct, cpu)
            a, b = dict(via_hub.named_parameters()), dict(direct.named_parameters())
            out[kind] = {
                "params": sorted(a),
                "equal": sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a),
                "changed": not all(torch.equal(p, torch.zeros_like(p)) for p in a.values()),
                "fetched": ths.last_stats["fetch"].bytes,
                "total": sum(t.numel() * t.element_size() for t in weights.values()),
            }
        ths.close()
    print(json.dumps(out), flush=True)
