"""A Llama-3-8B-shaped model with random bf16 weights, made directly on the GPU (no disk, no hub).

Shared by the benchmark scripts:
    gen = random_text_generator(LLAMA3_8B, device="cuda")          # our TextGenerator
    hf = random_hf_model(LLAMA3_8B, device="cuda")                 # transformers' LlamaForCausalLM
Weights are N(0, 0.02) (norm weights 1): timings do not depend on the values.
"""

from __future__ import annotations

import torch

LLAMA3_8B = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
    intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
    hidden_act="silu", dtype="bfloat16",
)


def tiny(cfg: dict) -> dict:
    """The same architecture shrunk for a CPU smoke run of a benchmark script."""
    return dict(cfg, vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


def _fill(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)


def random_text_generator(raw_cfg: dict, *, device="cuda", dtype=torch.bfloat16, attention_backend="auto",
                          cuda_graphs: bool = True, max_graph_batch: int = 128):
    from model_wrapper import ModelConfig, ModelWrapper
    from model_wrapper.model_wrapper import make_backend
    from model_wrapper.models.decoder import CausalLM
    from text_generator import TextGenerator

    device = torch.device(device)
    cfg = ModelConfig.from_dict(raw_cfg)
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    _fill(model)
    model.eval().requires_grad_(False)
    backend = make_backend(attention_backend, cfg, device, dtype)
    mw = ModelWrapper(model, cfg, backend, device, dtype, cuda_graphs=cuda_graphs, max_graph_batch=max_graph_batch)
    return TextGenerator(mw)


def random_hf_model(raw_cfg: dict, *, device="cuda", dtype=torch.bfloat16, attn_implementation="sdpa"):
    """transformers' own LlamaForCausalLM, built (and randomly initialised) on the device."""
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in raw_cfg.items() if k not in ("architectures", "model_type", "dtype")})
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval().requires_grad_(False)
