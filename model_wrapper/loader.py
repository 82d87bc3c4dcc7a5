"""Checkpoint loading: a Hugging Face folder (config.json + *.safetensors) into a CausalLM.

checkpoint.py reads and checks the files' headers; here they are compared with the model the
config describes (every checkpoint tensor used exactly once, every parameter filled exactly
once, shapes and float dtypes as the config says) before any memory is allocated. Then the
data is read (a tqdm bar over shards), refused if not finite, cast to the requested dtype; the
fused qkv_proj / gate_up_proj are filled from the checkpoint's separate projections; lm_head is
tied to the embedding when the config says so. Never touches a hub. Under tensor parallelism
(a TPGroup of world > 1) each rank reads only its slice of each sharded tensor (safetensors
get_slice; rules in model_wrapper/parallel.py) into a model built with its own sizes.
FP8 checkpoints (config.json quantization_config, model_wrapper/quantization.py): each e4m3 weight
comes with its scales (fp8_weights.py); on the CPU it is dequantized here into the model dtype,
on CUDA the linears keep e4m3 + a scale per row and K-group (layers/fp8_linear.py). Under TP a
block-FP8 checkpoint's expert (and dense MLP) widths are sliced at 128-column blocks (parallel.block_split):
every rank reads its blocks' e4m3 values and their own scales, nothing twice, and keeps them e4m3.
Qwen3-30B-A3B-FP8 at TP 4 (moe_intermediate 768): 128 / 256 / 128 / 256 columns, the widest rank reading
256 / 192 of an even share; the even split's mid-block ranks used to dequantize their experts (2x the bytes).
quantization="fp8" on a float checkpoint (cfg.quant.online, online_fp8.py): the headers and reads are
those of a block-FP8 checkpoint made on the fly (online_fp8.OnlineFp8), everything else as above.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from loguru import logger
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from model_wrapper.checkpoint import TensorInfo, read_checkpoint
from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.fp8_weights import (Fp8Tensors, check_dtypes, dequantize_slice, group_of, is_fp8_aux,
                                       keep_fp8_storage, plan_fp8, row_scales)
from model_wrapper.layers.fp8_linear import E4M3, Fp8Method, runs_e4m3
from model_wrapper.models.decoder import CausalLM
from model_wrapper.online_fp8 import OnlineFp8
from model_wrapper.parallel import TPGroup, TPShard

_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
}


@dataclass(frozen=True)
class Part:
    """Where one checkpoint tensor goes: parameter `param`, its expert `expert` (dim 0 of a
    stacked expert parameter) or None, then rows [rows[0], rows[1]) of that or None (all)."""

    param: str
    expert: int | None
    rows: tuple[int, int] | None

    def view(self, t: torch.Tensor) -> torch.Tensor:
        t = t if self.expert is None else t[self.expert]
        return t if self.rows is None else t[self.rows[0] : self.rows[1]]


def _row_ranges(cfg: ModelConfig | TPShard, fused: str) -> list[tuple[int, int]]:
    """Rows of each part in a fused parameter; a TPShard gives this rank's (local) sizes."""
    if fused.endswith("qkv_proj"):
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)]
    if ".shared_expert." in f".{fused}.":
        n = cfg.moe.shared_intermediate_size if isinstance(cfg, ModelConfig) else cfg.shared_intermediate_size
    else:
        n = cfg.intermediate_size
    return [(0, n), (n, 2 * n)]


def _moe_inter(sizes: ModelConfig | TPShard) -> int:
    return sizes.moe.intermediate_size if isinstance(sizes, ModelConfig) else sizes.moe_intermediate_size


def _sources(cfg: ModelConfig, sizes: ModelConfig | TPShard, name: str) -> dict[str, Part]:
    """Our parameter `name` -> {checkpoint tensor name: the Part of the parameter it fills}.

    Fused projections take their parts' rows; a sparse layer's stacked experts take one tensor per
    expert and projection, named as the family's checkpoints spell them (MoEStyle); the router is
    the sparse block's `gate`. sizes: cfg, or this rank's TPShard for the row ranges."""
    if ".mlp.experts." in name or name.endswith(".mlp.gate.weight"):
        style = cfg.family.moe
        prefix = name[: name.index(".mlp.")] + f".{style.module}."
        if name.endswith(".mlp.gate.weight"):
            return {prefix + "gate.weight": Part(name, None, None)}
        gate, up, down = style.projections
        n = _moe_inter(sizes)
        out = {}
        for e in range(cfg.moe.num_experts):
            if name.endswith("experts.gate_up_proj"):
                out[f"{prefix}experts.{e}.{gate}.weight"] = Part(name, e, (0, n))
                out[f"{prefix}experts.{e}.{up}.weight"] = Part(name, e, (n, 2 * n))
            else:
                out[f"{prefix}experts.{e}.{down}.weight"] = Part(name, e, None)
        return out
    for hf, (ours, part) in _FUSED.items():
        if name.endswith(f".{ours}.weight") or name.endswith(f".{ours}.bias"):
            return {name.replace(f".{o}.", f".{h}."): Part(name, None, _row_ranges(sizes, o)[p])
                    for h, (o, p) in _FUSED.items() if o == ours}
    return {name: Part(name, None, None)}


def _read_shard(f, hf_name: str, dst: torch.Tensor, shard: TPShard, file: str):
    """This rank's part of checkpoint tensor hf_name, the part of dst it fills, and the slice taken:
    (dim, start, length, global size) or None (all of it)."""
    sl = f.get_slice(hf_name)
    shape = tuple(sl.get_shape())
    rng = shard.source_range(hf_name)
    if rng is None:
        want = tuple(dst.shape)
    else:
        dim, start, length, total = rng
        want = tuple(total if i == dim else n for i, n in enumerate(dst.shape))
    if shape != want:
        raise ModelLoadError(
            ModelErrorCode.MISSHAPEN_TENSOR,
            f"{hf_name} in {file}: expected shape {want}, got {shape}",
        )
    if rng is None:
        return sl[:], dst, None
    index = tuple(slice(start, start + length) if i == dim else slice(None) for i in range(len(shape)))
    return sl[index], dst.narrow(dim, 0, length), rng


def load_model(path: str, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device,
               tp: TPGroup | None = None, progress: bool = True, keep_fp8: bool | None = None) -> CausalLM:
    """Check the checkpoint's headers against cfg, then build the model and fill every parameter.

    Nothing is allocated before the headers agree with the config (layer count, every tensor's
    name, shape and float dtype), so a config that lies about sizes is refused in milliseconds.
    progress: a tqdm bar on stderr over the shards (of two or more; rank 0 only under TP).
    FP8 checkpoints (cfg.quant): keep_fp8 (None: on CUDA GPUs with e4m3, runs_e4m3) keeps the quantized linears' e4m3
    weights and scales (layers/fp8_linear.py); otherwise every FP8 weight is dequantized once here
    into `dtype`. The checkpoint's k_scale / v_scale, if any, become model.checkpoint_kv_scales.
    """
    tensors, paths = read_checkpoint(path)
    # quantization="fp8" (online_fp8.py): the float checkpoint is seen, and read, as a block-FP8 one
    online = OnlineFp8(tensors, paths, cfg.quant, device) if cfg.quant is not None and cfg.quant.online else None
    if online is not None:
        tensors = online.tensors
    wanted, fp8 = _expected_tensors(cfg, tensors, paths)
    tp = tp if tp is not None else TPGroup.single()
    with torch.device("meta"):
        model = CausalLM(cfg, tp).to(dtype)
    shard = model.shard
    sizes = shard if tp.enabled else cfg
    keep = runs_e4m3(device) if keep_fp8 is None else keep_fp8
    if fp8 is not None and not keep and torch.device(device).type == "cuda":
        logger.warning(f"{torch.cuda.get_device_name(device)} has no e4m3 support (compute capability before 8.9): the "
                       f"FP8 checkpoint's weights are dequantized to {dtype} at load (its bytes and speed, not FP8's)")
    if fp8 is not None and keep:
        keep_fp8_storage(model, cfg, fp8, lambda name: _sources(cfg, sizes, name), shard, tp.enabled)
    model = model.to_empty(device=device)
    with torch.no_grad():
        if tp.enabled:  # the last vocabulary shard's padding rows are never read: keep them finite
            model.model.embed_tokens.weight.zero_()
            for p in model.lm_head.parameters():
                p.zero_()
        for name, p in model.named_parameters():
            if name.endswith(".input_scale"):  # the max over a fused linear's parts
                p.zero_()
    params = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    # checkpoint tensor -> the part of a parameter it fills (fused and stacked ones by parts)
    parts = {hf: part for name in params if not is_fp8_aux(name) for hf, part in _sources(cfg, sizes, name).items()}
    pending = set(parts)
    small = online.scales if online is not None else _read_small(fp8, paths, tensors) if fp8 is not None else {}

    files = sorted({tensors[n].file for n in wanted})
    bar_off = not progress or len(files) < 2 or tp.rank != 0
    for file in tqdm(files, desc="loading shards", unit="shard", disable=bar_off):
        try:
            with (online.open(paths[file]) if online is not None
                  else safe_open(paths[file], framework="pt", device="cpu")) as f:
                for hf_name in sorted(n for n in wanted if tensors[n].file == file):
                    part = parts[hf_name]
                    dst = part.view(params[part.param].data)
                    rng = None
                    if tp.enabled:
                        t, dst, rng = _read_shard(f, hf_name, dst, shard, file)
                    else:
                        t = f.get_tensor(hf_name)
                    if tuple(t.shape) != tuple(dst.shape):
                        raise ModelLoadError(
                            ModelErrorCode.MISSHAPEN_TENSOR,
                            f"{hf_name} in {file}: expected shape {tuple(dst.shape)}, got {tuple(t.shape)}",
                        )
                    with torch.no_grad():
                        if fp8 is not None and hf_name in fp8.scales:
                            _fill_fp8(hf_name, file, t, dst, rng, part, params, fp8, small, tensors, dtype)
                        else:
                            dst.copy_(_finite_cast(hf_name, file, t, dtype))
                    pending.discard(hf_name)
        except ModelLoadError:
            raise
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(ModelErrorCode.CORRUPT_FILE, f"{file}: unreadable safetensors data: {e}") from None
    if pending:
        names = sorted(pending)
        raise ModelLoadError(
            ModelErrorCode.MISSING_TENSOR,
            f"checkpoint {path!r} lacks {len(names)} tensor(s), e.g. {names[:5]}",
        )
    if cfg.tie_word_embeddings:
        model.tie_weights()
    for module in model.modules():  # FP8 linears keep their block scales for cuBLASLt, once
        if isinstance(getattr(module, "method", None), Fp8Method):
            module.method.prepare(module)
    model.checkpoint_kv_scales = None
    if fp8 is not None and fp8.kv_scales:
        k, v = zip(*((small[a], small[b]) for a, b in fp8.kv_scales))
        model.checkpoint_kv_scales = (torch.stack(k), torch.stack(v))
    return model.eval().requires_grad_(False)


def _read_small(fp8: Fp8Tensors, paths: dict[str, str], tensors: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    """Every scale tensor of an FP8 checkpoint, float32 and finite (they are small: read them whole)."""
    out = {}
    names = fp8.names()
    for file in sorted({tensors[n].file for n in names}):
        try:
            with safe_open(paths[file], framework="pt", device="cpu") as f:
                for n in sorted(x for x in names if tensors[x].file == file):
                    out[n] = _finite_cast(n, file, f.get_tensor(n), torch.float32).reshape(tensors[n].shape)
        except ModelLoadError:
            raise
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(ModelErrorCode.CORRUPT_FILE, f"{file}: unreadable safetensors data: {e}") from None
    for a, b in fp8.kv_scales:
        out[a], out[b] = out[a].reshape(()), out[b].reshape(())
    return out


def _fill_fp8(hf_name: str, file: str, t: torch.Tensor, dst: torch.Tensor, rng, part: Part, params: dict,
              fp8: Fp8Tensors, small: dict, tensors: dict[str, TensorInfo], dtype: torch.dtype) -> None:
    """Fill dst from t, this rank's slice of FP8 weight hf_name: e4m3 and its scales into FP8 storage
    (fp8_weights.keep_fp8_storage), or dequantized into a float parameter."""
    if not bool(torch.isfinite(t.float()).all()):
        raise ModelLoadError(ModelErrorCode.NONFINITE_WEIGHT, f"{hf_name} in {file}: expected finite weights, got NaN")
    n, k = tensors[hf_name].shape
    rows = row_scales(small[fp8.scales[hf_name]], n, k, fp8.quant)  # [n, KG]
    dim, start, length = rng[:3] if rng is not None else (None, 0, 0)
    if dim == 0:
        rows = rows[start : start + length]
    col0 = start if dim == 1 else 0
    group = group_of(fp8.quant, k)
    if dst.dtype != E4M3:
        dst.copy_(_finite_cast(hf_name, file, dequantize_slice(t, rows, col0, group), dtype))
        return
    dst.copy_(t)
    scale = part.view(params[part.param + "_scale"].data).narrow(0, 0, rows.shape[0])
    first = col0 // group  # keep_fp8_storage kept e4m3 only where col0 is a multiple of group
    # channel / tensor rows are [n, 1]: broadcast over the K groups (stacked experts keep [n, ceil(k / 128)])
    scale.copy_(rows[:, first : first + scale.shape[-1]])
    # the MoE kernels quantize activations dynamically: an expert's input_scale is not used (fp8_weights.py)
    if hf_name in fp8.input_scales and part.param.endswith(".weight"):
        inp = params[part.param[: -len("weight")] + "input_scale"].data
        inp.copy_(torch.maximum(inp, small[fp8.input_scales[hf_name]].reshape(())))


def _finite_cast(hf_name: str, file: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t cast to dtype; NaN / inf are refused: they would make outputs NaN, or finite garbage."""
    cast = t.to(dtype)
    if not bool(torch.isfinite(cast).all()):
        if bool(torch.isfinite(t).all()):
            raise ModelLoadError(ModelErrorCode.NONFINITE_WEIGHT,
                                 f"{hf_name} in {file}: values exceed the range of {dtype} (inf after the cast); "
                                 "load in a wider dtype")
        raise ModelLoadError(ModelErrorCode.NONFINITE_WEIGHT,
                             f"{hf_name} in {file}: expected finite weights, got NaN or inf")
    return cast


def _expected_tensors(cfg: ModelConfig, tensors: dict[str, TensorInfo],
                      paths: dict[str, str]) -> tuple[set[str], Fp8Tensors | None]:
    """The checkpoint tensors the model reads, after checking that they are exactly the model's,
    and an FP8 checkpoint's scale tensors (fp8_weights.plan_fp8; None unquantized).

    Raises MISSING_TENSOR / UNEXPECTED_TENSOR / MISSHAPEN_TENSOR / UNSUPPORTED_DTYPE from the
    headers alone. The layer count is compared first, so that a config claiming 10**6 layers is
    refused before a model of that many layers is described, even on the meta device.
    """
    layers = {int(m.group(1)) for n in tensors if (m := _LAYER.match(n))}
    missing_layers = cfg.num_layers - sum(1 for i in layers if i < cfg.num_layers)
    if missing_layers:
        raise ModelLoadError(
            ModelErrorCode.MISSING_TENSOR,
            f"config.json num_hidden_layers={cfg.num_layers}: the checkpoint lacks {missing_layers} of "
            f"those layers (it holds {len(layers)}: {_span(layers)})",
        )
    extra = sorted(i for i in layers if i >= cfg.num_layers)
    if extra:
        names = sorted(n for n in tensors if (m := _LAYER.match(n)) and int(m.group(1)) >= cfg.num_layers)
        raise ModelLoadError(
            ModelErrorCode.UNEXPECTED_TENSOR,
            f"config.json num_hidden_layers={cfg.num_layers}, but the checkpoint holds layers up to {extra[-1]} "
            f"({len(names)} unused tensors, e.g. {names[:3]})",
        )
    # no tensor of the model can have a side longer than the longest in the file (each of those is
    # backed by data, so bounded by the file size): this bounds the meta model built next
    longest = max((d for t in tensors.values() if math.prod(t.shape) for d in t.shape), default=0)
    sizes = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
             "intermediate_size": cfg.intermediate_size, "num_attention_heads * head_dim": cfg.num_heads * cfg.head_dim}
    for field, n in sizes.items():
        if n > longest:
            raise ModelLoadError(ModelErrorCode.MISSHAPEN_TENSOR,
                                 f"config.json {field}={n}: larger than any tensor side in the checkpoint "
                                 f"(longest {longest})")
    if cfg.moe is not None and cfg.moe.num_experts > len(tensors):  # each expert has tensors of its own
        raise ModelLoadError(ModelErrorCode.MISSING_TENSOR,
                             f"config.json: {cfg.moe.num_experts} experts per layer, but the checkpoint holds only "
                             f"{len(tensors)} tensors")
    with torch.device("meta"):  # global shapes, no memory
        plan = CausalLM(cfg, TPGroup.single())
    shapes = {}
    for name, p in plan.named_parameters():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        for hf, part in _sources(cfg, cfg, name).items():
            shapes[hf] = tuple(part.view(p).shape)
    missing = sorted(n for n in shapes if n not in tensors)
    if missing:
        raise ModelLoadError(ModelErrorCode.MISSING_TENSOR,
                             f"checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:5]}")
    for n, shape in shapes.items():
        if tensors[n].shape != shape:
            raise ModelLoadError(ModelErrorCode.MISSHAPEN_TENSOR,
                                 f"{n} in {tensors[n].file}: expected shape {shape} (from config.json), "
                                 f"got {tensors[n].shape}")
    fp8 = plan_fp8(cfg.quant, cfg.num_layers, tensors, shapes) if cfg.quant is not None else None
    check_dtypes(fp8, tensors, shapes)
    ignored = [n for n in tensors if n.endswith(_RECOMPUTED)] + sorted(fp8.names() if fp8 is not None else ())
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors and _same_tensor(
            tensors, paths, "lm_head.weight", "model.embed_tokens.weight"):
        ignored.append("lm_head.weight")  # a tied model saved with both copies: transformers ties them too
    unused = sorted(n for n in tensors if n not in shapes and n not in ignored)
    if unused:
        hint = (" (config.json says tie_word_embeddings=true, but lm_head.weight differs from the embedding: "
                "set it to false)" if "lm_head.weight" in unused else "")
        raise ModelLoadError(ModelErrorCode.UNEXPECTED_TENSOR,
                             f"checkpoint holds {len(unused)} tensor(s) the model has no place for{hint}, "
                             f"e.g. {unused[:5]}")
    return set(shapes), fp8


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_RECOMPUTED = ".rotary_emb.inv_freq"  # old exports saved this buffer; it is recomputed from config.json


def _same_tensor(tensors: dict[str, TensorInfo], paths: dict[str, str], a: str, b: str) -> bool:
    """Whether checkpoint tensors a and b hold the same values (read only when shapes agree)."""
    if b not in tensors or tensors[a].shape != tensors[b].shape:
        return False
    try:
        with safe_open(paths[tensors[a].file], framework="pt") as fa, safe_open(paths[tensors[b].file], framework="pt") as fb:
            return torch.equal(fa.get_tensor(a), fb.get_tensor(b))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(ModelErrorCode.CORRUPT_FILE, f"{tensors[a].file}: unreadable safetensors data: {e}") from None


def _span(layers: set[int]) -> str:
    if not layers:
        return "none"
    return f"{min(layers)}..{max(layers)}" if len(layers) == max(layers) - min(layers) + 1 else str(sorted(layers)[:8])
