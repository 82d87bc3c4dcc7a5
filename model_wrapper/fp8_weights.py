"""FP8 checkpoints at load: which tensors to expect, where e4m3 storage is kept, and the scale arithmetic.

loader.py calls these when config.json has a quantization_config (cfg.quant, quantization.py):

    plan_fp8(cfg, tensors, shapes)  the headers' check: every linear weight not in `ignore` must be e4m3
                                    with its scale (and input_scale when static; k_scale / v_scale per
                                    layer with a kv_cache_scheme, kv_scale_names) of the format's
                                    shape -> Fp8Tensors
    keep_fp8_storage(model, ...)    on the meta model, before memory: give each linear whose weights all
                                    come quantized an Fp8Method (layers/fp8_linear.py), and the stacked
                                    experts e4m3 tensors + scales (every format); everything else keeps
                                    the model dtype and is filled dequantized
    row_scales / dequantize_slice   a checkpoint scale -> a scale per row and K-group [N, KG]; a weight
                                    slice (TP) times its own columns' scales

    block scale [ceil(N/128), ceil(K/128)] --repeat rows--> [N, KG]   row n: block row n // 128
    channel     [N, 1]                                     -> [N, 1]
    tensor      [] or [1]                                  -> [N, 1]  (the scalar on every row)

Stacked MoE experts (layers/moe.Experts) keep e4m3 in every format, with one float32 scale per row and
128-column group, gate_up_proj_scale [E, 2I, ceil(H/128)] / down_proj_scale [E, H, ceil(I/128)]: the
layout the MoE kernels (kernels/moe.py, moe_gemv.py, moe_decode.py) read. A block scale fills it by
repeating over its 128 rows; a compressed-tensors channel scale [N, 1] or tensor scale [1] by repeating
over the K groups too (gate's and up's own scales on their own rows of the fused gate_up). The scale is
materialized, not a stride-0 expand: the kernels index groups with unit stride and the decode path makes
the scale contiguous each call. It costs 4 bytes per 128 e4m3 bytes (3.1%): Qwen3-30B-A3B's experts
27.0 GiB e4m3 + 0.84 GiB scales, against 54.0 GiB in bf16. Under TP any column cut of a channel / tensor
expert is exact (the scale is per row): a rank's local K gets ceil(K_local / 128) groups.
The MoE kernels quantize activations dynamically whatever the checkpoint's activation scheme
(kernels/moe.py: the decode path is weight-only, each e4m3 tile dequantized in registers; the grouped
GEMMs past it are W8A8 with activations quantized per token and 128 columns, KernelConfig.moe_fp8_w8a8):
a dynamic per-token scheme has nothing to store, and a static per-tensor input_scale on experts
(Mixtral-8x7B-Instruct-v0.1-FP8) is read, checked and not used. The dense linears (Fp8Method) keep the
checkpoint's scheme, static input_scale included.

On the CPU nothing keeps e4m3 (the reference path: dequantized weights, unquantized activations), nor
on a GPU before compute capability 8.9 (A100: Triton has no e4m3 type there; layers/fp8_linear.runs_e4m3);
on the others every quantized linear does except where a row-parallel TP shard starts inside a block.
Under TP a block checkpoint's MLP widths are cut at block boundaries (parallel.block_split), so the
experts' down_proj slice always starts on a block and they keep e4m3 on every rank (Qwen3-30B-A3B-FP8
at TP 4: 128 / 256 / 128 / 256 of the 768 columns, each rank exactly its blocks' bytes; the even 192
each had ranks 1 and 3 start mid-block, and their experts were dequantized to bf16: 2x the bytes, and
the bf16 kernels). What is still cut is dequantized: the dense MLP where the blocks are fewer than the
ranks (evenly split then), and o_proj where a rank's heads end inside a block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from model_wrapper.checkpoint import FLOAT_DTYPES, TensorInfo
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.layers.fp8_linear import E4M3, Fp8Method
from model_wrapper.layers.linear import Linear
from model_wrapper.quantization import BLOCK, SCALAR_SHAPES, Fp8Config

# a linear's module name ends with one of these (the rest of "*.weight" are embeddings and norms)
_LINEAR_TAILS = ("lm_head", "gate", "shared_expert_gate", "w1", "w2", "w3")


def is_linear_weight(hf_name: str) -> bool:
    """Whether checkpoint tensor hf_name is the weight of a linear (a projection, an expert, a router,
    lm_head), the only tensors an FP8 format may quantize."""
    if not hf_name.endswith(".weight"):
        return False
    last = hf_name[: -len(".weight")].rsplit(".", 1)[-1]
    return last.endswith("_proj") or last in _LINEAR_TAILS


@dataclass
class Fp8Tensors:
    """What an FP8 checkpoint holds besides the model's weights (names are the checkpoint's).

    scales:       quantized weight -> its scale tensor
    input_scales: quantized weight -> its input_scale tensor (static activations only)
    kv_scales:    per layer (k_scale name, v_scale name) (the same name twice for one kv_scale), or ()
    """

    quant: Fp8Config
    scales: dict[str, str] = field(default_factory=dict)
    input_scales: dict[str, str] = field(default_factory=dict)
    kv_scales: tuple[tuple[str, str], ...] = ()

    def names(self) -> set[str]:
        return set(self.scales.values()) | set(self.input_scales.values()) | {n for p in self.kv_scales for n in p}


def plan_fp8(quant: Fp8Config, num_layers: int, tensors: dict[str, TensorInfo],
             shapes: dict[str, tuple[int, ...]]) -> Fp8Tensors:
    """Check the headers of an FP8 checkpoint against its format; shapes: the model's tensors
    (name -> global shape). Raises UNSUPPORTED_DTYPE / MISSING_TENSOR / MISSHAPEN_TENSOR naming the tensor."""
    plan = Fp8Tensors(quant)

    def need(name: str, allowed: tuple[tuple[int, ...], ...], why: str) -> str:
        if name not in tensors:
            raise ModelLoadError(ModelErrorCode.MISSING_TENSOR, f"checkpoint lacks {name} ({why})")
        info = tensors[name]
        if info.shape not in allowed:
            raise ModelLoadError(ModelErrorCode.MISSHAPEN_TENSOR,
                                 f"{name} in {info.file}: expected shape {' or '.join(map(str, allowed))} "
                                 f"({why}), got {info.shape}")
        if info.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(ModelErrorCode.UNSUPPORTED_DTYPE,
                                 f"{name} in {info.file}: expected a float scale ({sorted(FLOAT_DTYPES)}), "
                                 f"got {info.dtype}")
        return name

    for name, shape in shapes.items():
        info = tensors[name]
        module = name[: -len(".weight")]
        quantized = is_linear_weight(name) and not quant.ignores(module)
        if not quantized:
            continue
        if info.dtype != "F8_E4M3":
            raise ModelLoadError(ModelErrorCode.UNSUPPORTED_DTYPE,
                                 f"{name} in {info.file}: expected F8_E4M3 (quantization_config "
                                 f"{quant.method}, not in its ignore list), got {info.dtype}")
        why = f"{quant.method} {quant.kind} scale of {name} {shape}"
        plan.scales[name] = need(f"{module}.{quant.scale_suffix}", quant.scale_shapes(*shape), why)
        if quant.activation == "static":
            plan.input_scales[name] = need(f"{module}.input_scale", SCALAR_SHAPES,
                                           f"static input_scale of {name}")
    layout = kv_scale_names(quant, tensors)
    if layout is not None:
        why = f"{quant.method} K / V cache scales, every layer"
        plan.kv_scales = tuple(tuple(need(f"model.layers.{i}.self_attn.{kv}", SCALAR_SHAPES, why) for kv in layout)
                               for i in range(num_layers))
    return plan


# the K / V scale names after model.layers.<i>.self_attn. a quant_method "fp8" checkpoint may have,
# in the order tried (quantization.py's docstring: AutoFP8's versions, vLLM's name remapping)
FP8_KV_LAYOUTS = (("k_scale", "v_scale"), ("kv_scale", "kv_scale"), ("k_proj.output_scale", "v_proj.output_scale"))


def kv_scale_names(quant: Fp8Config, tensors: dict[str, TensorInfo]) -> tuple[str, str] | None:
    """The (K, V) scale names after `self_attn.` the checkpoint has per layer, or None (no KV scales).
    compressed-tensors: k_scale / v_scale iff its kv_cache_scheme; "fp8": the first FP8_KV_LAYOUTS entry
    any tensor of which is present, k_scale / v_scale when none is and kv_cache_scheme requires them."""
    if quant.online or quant.method != "fp8":
        return FP8_KV_LAYOUTS[0] if quant.kv_scales else None
    for layout in FP8_KV_LAYOUTS:
        if any(n.startswith("model.layers.") and n.endswith(tuple(f".self_attn.{kv}" for kv in layout))
               for n in tensors):
            return layout
    return FP8_KV_LAYOUTS[0] if quant.kv_scales else None


def check_dtypes(plan: Fp8Tensors | None, tensors: dict[str, TensorInfo], shapes) -> None:
    """Every model tensor that is not a quantized weight must be a float tensor (e4m3 norms,
    embeddings or ignored linears are refused: no scale says what they mean)."""
    for n in shapes:
        if plan is not None and n in plan.scales:
            continue
        if tensors[n].dtype not in FLOAT_DTYPES:
            hint = (" (only the linear weights a quantization_config quantizes may be float8)"
                    if tensors[n].dtype.startswith("F8") else "")
            raise ModelLoadError(ModelErrorCode.UNSUPPORTED_DTYPE,
                                 f"{n} in {tensors[n].file}: expected a float tensor ({sorted(FLOAT_DTYPES)}), "
                                 f"got {tensors[n].dtype}{hint}")


def row_scales(scale: torch.Tensor, n: int, k: int, quant: Fp8Config) -> torch.Tensor:
    """A checkpoint scale of a weight [n, k] -> float32 [n, KG] (KG = ceil(k / 128) for block, else 1)."""
    scale = scale.float()
    if quant.kind == "block":
        return scale.repeat_interleave(BLOCK, dim=0)[:n].contiguous()
    return scale.reshape(-1, 1).expand(n, 1).contiguous()


def group_of(quant: Fp8Config, k: int) -> int:
    """K-columns per scale column of a weight with k columns."""
    return BLOCK if quant.kind == "block" else k


def dequantize_slice(t: torch.Tensor, rows: torch.Tensor, col0: int, group: int) -> torch.Tensor:
    """t e4m3 [n, c]: columns [col0, col0 + c) of a weight; rows [n, KG] its rows' scales
    -> float32 [n, c], each element times its (row, K-group) scale."""
    if rows.shape[1] == 1:
        return t.float() * rows
    idx = (col0 + torch.arange(t.shape[-1])) // group
    return t.float() * rows[:, idx]


def keep_fp8_storage(model: nn.Module, cfg, plan: Fp8Tensors, sources, shard, tp_enabled: bool) -> None:
    """On the meta model: e4m3 storage for the linears (and the stacked experts, every format) whose checkpoint
    weights are all quantized. sources(name) -> {checkpoint name: Part} (loader._sources)."""
    quant = plan.quant

    def all_quantized(hf_names) -> bool:
        return bool(hf_names) and all(n in plan.scales for n in hf_names)

    def cuts_block(hf_names) -> bool:
        # a row-parallel shard starting inside a 128-column block: its scales would need an offset;
        # dequantized instead (exact). The MLP widths are cut at blocks (parallel.block_split), so only
        # o_proj of odd head slices and a dense MLP of fewer blocks than ranks get here
        if not tp_enabled or quant.kind != "block":
            return False
        for n in hf_names:
            rng = shard.source_range(n)
            if rng is not None and rng[0] == 1 and rng[1] % BLOCK:
                return True
        return False

    with torch.device("meta"):
        for name, module in model.named_modules():
            if isinstance(module, Linear):
                if name == "lm_head" and cfg.tie_word_embeddings:
                    continue
                srcs = list(sources(f"{name}.weight"))
                if all_quantized(srcs) and not cuts_block(srcs):
                    method = Fp8Method(group_of(quant, module.in_features), quant.activation == "static")
                    module.method = method
                    method.create_weights(module, module.in_features, module.out_features)
            elif name.endswith("mlp.experts"):  # every kind as a scale per (row, 128 columns): _expert_storage
                srcs = list(sources(f"{name}.gate_up_proj")) + list(sources(f"{name}.down_proj"))
                if all_quantized(srcs) and not cuts_block(srcs):
                    _expert_storage(module)


def _expert_storage(experts: nn.Module) -> None:
    """Stacked experts [E, N, K] -> e4m3 + a float32 scale [E, N, ceil(K / 128)] per row and 128-column group,
    the layout the MoE kernels read for every format: a block scale repeated over its 128 rows; a channel
    or tensor scale repeated over the K groups too (materialized: the module docstring says why)."""
    for p in ("gate_up_proj", "down_proj"):
        e, n, k = getattr(experts, p).shape
        setattr(experts, p, nn.Parameter(torch.empty(e, n, k, dtype=E4M3), requires_grad=False))
        setattr(experts, f"{p}_scale", nn.Parameter(
            torch.empty(e, n, math.ceil(k / BLOCK), dtype=torch.float32), requires_grad=False))


def is_fp8_aux(param: str) -> bool:
    """A parameter of FP8 storage that no checkpoint tensor fills under its own name (scales)."""
    return param.endswith(("_scale", ".input_scale"))
