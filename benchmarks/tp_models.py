"""The models bench_tp.py runs under tensor parallelism, and how it builds them quickly.

    llama8b        Llama-3-8B shape, bf16
    llama8b-fp8    the same, every decoder projection in block FP8 (e4m3 + a scale per 128 x 128 block)
    qwen3moe       Qwen3-30B-A3B shape (128 experts of width 768, top 8), bf16
    qwen3moe-fp8   the same, every projection and expert in block FP8 (routers, embedding, lm_head bf16)

Writing and loading these checkpoints at full depth takes minutes (the MoE is 61 GB in bf16), so
rank 0 writes each with --check-layers layers only (a layer-reduced shape: every per-layer
tensor has its real shape), and every rank loads it through the real loader
(TextGenerator.from_pretrained with its TPGroup: the TP slices of the weights and of the FP8
scales come from there). That model is the correctness run's. For the timings, `deepen` then
copies its decoder layers in GPU memory up to the benchmarked depth (layer i a copy, with its own
storage, of loaded layer i mod L0), so every step reads as many bytes and runs as many
collectives as the full model would.
"""

from __future__ import annotations

import copy
import json
import os

import torch
from torch import nn

from benchmarks.bench_moe import QWEN3_30B_A3B
from benchmarks.common import LLAMA3_8B, make_random_checkpoint, tiny

MODELS = {  # name -> (config, FP8 format or None)
    "llama8b": (LLAMA3_8B, None),
    "llama8b-fp8": (LLAMA3_8B, "block"),
    "qwen3moe": (QWEN3_30B_A3B, None),
    "qwen3moe-fp8": (QWEN3_30B_A3B, "block"),
}
LABELS = {
    "llama8b": "Llama-3-8B-shaped, random bf16 weights",
    "llama8b-fp8": "Llama-3-8B-shaped, random block-FP8 weights (bf16 embedding / lm_head)",
    "qwen3moe": "Qwen3-30B-A3B-shaped, random bf16 weights",
    "qwen3moe-fp8": "Qwen3-30B-A3B-shaped, random block-FP8 weights (bf16 routers / embedding / lm_head)",
}


def tiny_moe(cfg: dict) -> dict:
    """The MoE shape shrunk for a CPU smoke run: 8 experts of width 256 (128 per rank at TP=2: whole FP8 blocks)."""
    return dict(tiny(cfg), intermediate_size=512, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2,
                head_dim=64)


def model_config(name: str, tiny_model: bool, layers: int | None) -> tuple[dict, str | None]:
    """-> (the benchmarked config dict at full depth, or `layers` deep; FP8 format or None)."""
    cfg, fp8 = MODELS[name]
    if tiny_model:
        cfg = tiny_moe(cfg) if "num_experts" in cfg else tiny(cfg)
    cfg = dict(cfg)
    if layers:
        cfg["num_hidden_layers"] = layers
    return cfg, fp8


def write_checkpoint(path: str, cfg: dict, fp8: str | None, check_layers: int, device) -> str:
    """The layer-reduced checkpoint of cfg (check_layers layers) in path; reused when it matches."""
    return make_random_checkpoint(path, dict(cfg, num_hidden_layers=check_layers), torch.bfloat16, device=device,
                                  fp8=fp8)


def fp32_reference(path: str, device):
    """The checkpoint at TP=1 in fp32 (FP8 weights dequantized once: w * scale), torch attention
    backend, no graphs: the reference both TP=1 and TP=N are held to."""
    from model_wrapper import ModelConfig, ModelWrapper
    from model_wrapper.loader import load_model
    from model_wrapper.model_wrapper import make_backend
    from text_generator import TextGenerator

    cfg = ModelConfig.from_pretrained(path)
    model = load_model(path, cfg, dtype=torch.float32, device=device, progress=False, keep_fp8=False)
    backend = make_backend("torch", cfg, device, torch.float32, model.shard)
    return TextGenerator(ModelWrapper(model, cfg, backend, device, torch.float32, cuda_graphs=False))


def deepen(gen, path: str, num_layers: int, max_graph_batch: int = 256):
    """gen (loaded from path with L0 layers) -> a TextGenerator of num_layers layers whose layer i is a
    copy of layer i mod L0 in its own memory; gen's model is taken over (do not use gen after)."""
    from model_wrapper import ModelConfig, ModelWrapper
    from model_wrapper.model_wrapper import make_backend
    from text_generator import TextGenerator

    mw = gen.model_wrapper
    model = mw.model
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    cfg = ModelConfig.from_dict(dict(raw, num_hidden_layers=num_layers))
    src = list(model.model.layers)
    layers = []
    for i in range(num_layers):
        # the TPGroup (process group, symmetric buffer) is shared, never copied
        layer = copy.deepcopy(src[i % len(src)], memo={id(model.tp): model.tp})
        layer.self_attn.layer = i
        layers.append(layer)
    del src
    model.model.layers = nn.ModuleList(layers)
    model.cfg = cfg
    backend = make_backend("auto", cfg, mw.device, mw.dtype, model.shard)
    return TextGenerator(ModelWrapper(model, cfg, backend, mw.device, mw.dtype, cuda_graphs=mw.graphs is not None,
                                      max_graph_batch=max_graph_batch, kernel_config=mw.kernel_config))
