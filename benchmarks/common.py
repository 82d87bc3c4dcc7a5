"""Shared benchmark helpers: random checkpoints of real model shapes, made fast on the GPU.

    from benchmarks.common import LLAMA3_8B, make_random_checkpoint, percentile
    gen = random_text_generator(LLAMA3_8B, device="cuda")   # same weights law, built in GPU memory
    hf = random_hf_model(LLAMA3_8B, device="cuda")          # transformers' own model, likewise
    path = make_random_checkpoint("/tmp/llama3-8b", LLAMA3_8B, torch.bfloat16, device="cuda")
    # -> a Hugging Face folder: config.json + model-0000i-of-0000N.safetensors + index;
    #    loads with TextGenerator.from_pretrained and transformers' AutoModelForCausalLM alike

make_random_checkpoint writes the weight names and shapes transformers uses for the Llama family
(Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k norms, Qwen3-MoE's router and per-expert
projections) from a plain config dict; weights
are drawn on `device` (seconds for 8B on a GPU, where transformers' own init takes minutes on
the CPU) and saved shard by shard, so host memory holds one shard at a time. A folder that
already holds a checkpoint of the same config and dtype is reused.
"""

from __future__ import annotations

import json
import os

import torch

LLAMA3_8B = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
    intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
    bos_token_id=128000, eos_token_id=128001, hidden_act="silu", initializer_range=0.02,
)


def weight_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a Llama-family checkpoint described by cfg, in file order."""
    H, V, I = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or H // nh
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    qkv_bias = arch.startswith("Qwen2") or cfg.get("attention_bias", False)
    o_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    qk_norm = arch.startswith("Qwen3")
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
        for name, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            out.append((p + f"self_attn.{name}.weight", (rows, H)))
            if qkv_bias:
                out.append((p + f"self_attn.{name}.bias", (rows,)))
        out.append((p + "self_attn.o_proj.weight", (H, nh * hd)))
        if o_bias:
            out.append((p + "self_attn.o_proj.bias", (H,)))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        if _sparse(cfg, i):  # Qwen3-MoE: a router and num_experts experts of moe_intermediate_size
            E, Ie = cfg["num_experts"], cfg["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (E, H)))
            for e in range(E):
                for name, shape in (("gate_proj", (Ie, H)), ("up_proj", (Ie, H)), ("down_proj", (H, Ie))):
                    out.append((p + f"mlp.experts.{e}.{name}.weight", shape))
            continue
        for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            out.append((p + f"mlp.{name}.weight", shape))
            if mlp_bias:
                out.append((p + f"mlp.{name}.bias", shape[:1]))
    out.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H)))
    return out


def _sparse(cfg: dict, layer: int) -> bool:
    """Whether layer's MLP is a sparse one (a Qwen3-MoE config: num_experts, decoder_sparse_step,
    mlp_only_layers)."""
    if not cfg.get("num_experts"):
        return False
    step = cfg.get("decoder_sparse_step", 1)
    return layer not in cfg.get("mlp_only_layers", []) and (layer + 1) % step == 0


def make_random_checkpoint(
    path: str,
    config_dict: dict,
    dtype: torch.dtype = torch.bfloat16,
    *,
    device: str | torch.device | None = None,
    seed: int = 0,
    max_shard_bytes: int = 4 << 30,
    fp8: str | None = None,
) -> str:
    """Write a random checkpoint of config_dict's shape to path (a folder) and return path.

    Matrices and embeddings ~ N(0, initializer_range (default 0.02)); norm weights 1 + N(0, 0.02);
    biases N(0, 0.02). device: where weights are drawn (default: CUDA if available).
    fp8: None, "block" (transformers' fine-grained FP8: e4m3 weights + weight_scale_inv per 128 x 128
    block, quant_method "fp8") or "channel" (compressed-tensors FP8-dynamic: e4m3 weights +
    weight_scale per output row): the decoder layers' projections (experts included) are stored
    quantized, the embedding, norms, MoE routers and lm_head in dtype.
    """
    cfg = dict(config_dict)
    if fp8 is not None:
        cfg["quantization_config"] = fp8_quantization_config(fp8)
        routers = [f"model.layers.{i}.mlp.gate" for i in range(cfg["num_hidden_layers"]) if _sparse(cfg, i)]
        if routers:  # the routers stay in dtype, as in Qwen3-*-FP8 checkpoints
            key = "modules_to_not_convert" if fp8 == "block" else "ignore"
            cfg["quantization_config"][key] += routers
    cfg.setdefault("architectures", ["LlamaForCausalLM"])
    cfg.setdefault("model_type", cfg["architectures"][0].replace("ForCausalLM", "").lower())
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).replace("torch.", "")
    cfg_path = os.path.join(path, "config.json")
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(cfg_path) and os.path.isfile(index_path):
        with open(cfg_path) as f:
            if json.load(f) == cfg:
                return path
    from safetensors.torch import save_file

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(path, exist_ok=True)
    shapes = weight_shapes(cfg)
    elem = torch.empty((), dtype=dtype).element_size()  # (fp8 shards are smaller: fine)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = elem * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    std = float(cfg.get("initializer_range", 0.02))
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(std if len(shape) > 1 else 0.02)
            if name.endswith("norm.weight"):
                t.add_(1.0)
            if fp8 is not None and _quantized(name):
                q, scale = quantize_fp8(t, fp8)
                scale_name = name + ("_scale_inv" if fp8 == "block" else "_scale")
                tensors[name], tensors[scale_name] = q.cpu(), scale.cpu()
                weight_map[name] = weight_map[scale_name] = fname
                continue
            tensors[name] = t.to(dtype).cpu()
            weight_map[name] = fname
        save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})
        del tensors
    total = elem * sum(int(torch.Size(s).numel()) for _, s in shapes)
    with open(index_path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(cfg_path, "w") as f:  # last: its presence marks a complete folder
        json.dump(cfg, f, indent=1)
    return path


_FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _quantized(name: str) -> bool:
    """Whether an FP8 checkpoint stores this tensor in e4m3: the decoder layers' projection weights."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def fp8_quantization_config(kind: str) -> dict:
    """config.json's quantization_config of an FP8 checkpoint of kind "block" or "channel"."""
    if kind == "block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head"]}
    if kind == "channel":
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                                "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                          "dynamic": True}}}}
    raise ValueError(f"fp8: expected 'block' or 'channel', got {kind!r}")


def quantize_fp8(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (e4m3 [N, K], float32 scale) with w ~= e4m3 * scale: "block" gives the scale
    per 128 x 128 block [ceil(N/128), ceil(K/128)] (a checkpoint's weight_scale_inv), "channel" per
    row [N, 1] (compressed-tensors' weight_scale)."""
    w = w.float()
    N, K = w.shape
    if kind == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / _FP8_MAX).clamp_min(1e-12)
        return (w / scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn), scale
    nb, kb = -(-N // 128), -(-K // 128)
    padded = torch.zeros(nb * 128, kb * 128, device=w.device)
    padded[:N, :K] = w
    blocks = padded.view(nb, 128, kb, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / _FP8_MAX).clamp_min(1e-12)  # [nb, kb]
    q = (blocks / scale[:, None, :, None]).clamp(-_FP8_MAX, _FP8_MAX).view(nb * 128, kb * 128)[:N, :K]
    return q.to(torch.float8_e4m3fn), scale


def linear_to_fp8(lin: torch.nn.Module, kind: str) -> int:
    """A model's projection (its `weight` [N, K] a float Parameter) to FP8 in place, as a checkpoint of `kind` loads:
    the e4m3 weight of quantize_fp8 and Fp8Method with its scales per row and 128 columns ("block": the block's
    scale on each of its rows) or per row ("channel"); dynamic activations. -> bytes of the e4m3 weight and scales."""
    from model_wrapper.layers.fp8_linear import Fp8Method

    N, K = lin.weight.shape
    q, s = quantize_fp8(lin.weight.data, kind)
    if kind == "block":
        scale, group = s.repeat_interleave(128, dim=0)[:N].contiguous(), 128
    else:
        scale, group = s.reshape(N, 1).contiguous(), K
    del lin.weight
    lin.method = Fp8Method(group)
    lin.weight = torch.nn.Parameter(q.contiguous(), requires_grad=False)
    lin.weight_scale = torch.nn.Parameter(scale.float(), requires_grad=False)
    lin.input_scale = None
    return q.numel() + scale.numel() * 4


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100); nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# -- in-memory random models (no disk): the forward benchmark and the profiler --------------

def tiny(cfg: dict) -> dict:
    """The same architecture shrunk for a CPU smoke run of a benchmark script."""
    return dict(cfg, vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                bos_token_id=1, eos_token_id=2)


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
        model = CausalLM(cfg).to(dtype)
    # allocated in dtype at once (as the loader does): a 30B model built in fp32 first and then cast
    # does not fit an 80 GB card
    model = model.to_empty(device=device)
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


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or None with a note if matplotlib is
    not installed: every benchmark writes its JSON either way, the PNG only with it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
        return None
    return plt


def count_triton_compiles():
    """-> (a list the Triton JIT appends a kernel's name to whenever this process first builds one of its
    specializations (compiled, or loaded from the disk cache), a function that removes the hook again):
    Triton's jit_cache_hook, called before each such build; returning None lets it build."""
    try:
        from triton import knobs
    except ImportError:  # (a Triton without knobs: nothing counted)
        return [], None
    seen, before = [], knobs.runtime.jit_cache_hook

    def hook(*, fn, **_):
        seen.append(getattr(fn, "name", str(fn)))
        return None

    knobs.runtime.jit_cache_hook = hook

    def restore():
        knobs.runtime.jit_cache_hook = before

    return seen, restore
