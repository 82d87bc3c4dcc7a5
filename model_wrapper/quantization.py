"""A checkpoint's `quantization_config` (config.json), parsed into an Fp8Config or refused.

Three FP8 weight formats are served; every other method or variant is refused with
UNSUPPORTED_QUANTIZATION naming the field and its value (loading int4 packs or scale-less
e4m3 as plain floats would silently give garbage):

    "quant_method": "fp8" with weight_block_size  (transformers' fine-grained FP8: Qwen3-*-FP8, DeepSeek)
        weight_block_size [128, 128], activation_scheme "dynamic", fmt "e4m3" (optional)
        tensors: <linear>.weight e4m3 [N, K], <linear>.weight_scale_inv float [ceil(N/128), ceil(K/128)]
    "quant_method": "fp8" without weight_block_size  (AutoFP8 / Neural Magic's 2024 "-FP8" checkpoints:
        Meta-Llama-3-8B-Instruct-FP8, Mixtral-8x7B-Instruct-v0.1-FP8; vLLM's Fp8Config, per tensor)
        activation_scheme "static" or "dynamic" (required, as vLLM's Fp8Config.from_config has it)
        kv_cache_scheme "static" (AutoFP8 with kv_cache_quant_targets; optional)
        tensors: <linear>.weight e4m3 [N, K], <linear>.weight_scale float32 [] or [1] (AutoFP8 saves
        0-d tensors: the reciprocal of 448 / amax, so W = weight * weight_scale, NOT weight_scale_inv);
        static: <linear>.input_scale [] or [1] (the calibrated max |x| / 448). Mixtral's experts are
        per-expert linears, block_sparse_moe.experts.<e>.w1 / w2 / w3, each with its own weight_scale
        (and input_scale when static); AutoFP8's Mixtral example ignores "re:.*gate" (the routers).
        KV scales of either "fp8" variant, per layer (the first layout below with any tensor present
        is taken and every layer must have it; vLLM loads them by name whatever the config says, and
        so do we; kv_cache_scheme "static" makes them required):
            self_attn.k_scale / self_attn.v_scale   AutoFP8 >= 2024-07 (k_proj's / v_proj's output max / 448)
            self_attn.kv_scale                      AutoFP8 before: one scale for both K and V (vLLM
                                                    remaps it to k_scale and copies it to v_scale)
            self_attn.k_proj.output_scale / v_proj.output_scale   (vLLM's Fp8Config.get_cache_scale)
        Not served: AutoFP8's names before 2024-06-07, `<linear>.act_scale` (now input_scale; refused
        as the missing input_scale), and vLLM's q_proj.output_scale / prob_output_scale (unexpected).
    "quant_method": "compressed-tensors"  (llm-compressor's "FP8-dynamic" / "FP8")
        one config_groups scheme on "Linear": weights num_bits 8, type float, symmetric,
        strategy "channel" or "tensor"; input_activations absent, dynamic "token" or static
        "tensor"; ignore (e.g. ["lm_head", "re:.*mlp.gate$"]); kv_cache_scheme (optional)
        tensors: <linear>.weight e4m3 [N, K], <linear>.weight_scale [N, 1] (channel) or [1] / []
        (tensor); static activations: <linear>.input_scale [1] / []; kv_cache_scheme:
        self_attn.k_scale / self_attn.v_scale [1] / [] per layer

"fp8"'s ignore list: "ignored_layers" (AutoFP8 writes the full module names it skipped, e.g.
["lm_head"] or Mixtral's "model.layers.<i>.block_sparse_moe.gate"; vLLM reads this key), else
"modules_to_not_convert" (transformers' name), as vLLM's newer Fp8Config.from_config falls back.
Sources read: vllm-project/vllm vllm/model_executor/layers/quantization/fp8.py (Fp8Config.from_config,
get_cache_scale, Fp8LinearMethod.create_weights: a per-tensor "weight_scale" per fused part and
"input_scale" when static), quantization/kv_cache.py (BaseKVCacheMethod: a lone kv_scale serves K and V),
model_loader/weight_utils.py (maybe_remap_kv_scale_name); neuralmagic/AutoFP8 auto_fp8/quantize.py
(per_tensor_quantize, quantize_activations, save_quantized_model) and auto_fp8/modeling.py.

In every format W = weight.float() * scale of its (row, K-group). The loader (loader.py,
fp8_weights.py) uses the Fp8Config to know which tensors to expect and how to expand the scales:
a fused qkv / gate_up whose parts carry different per-tensor scales gets each part's scale on its
own rows (exact; vLLM instead requantizes the parts to their max scale).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from model_wrapper.errors import ModelErrorCode, ModelLoadError

BLOCK = 128  # the one block size served (weight_block_size [128, 128])
SCALAR_SHAPES = ((), (1,))  # how per-tensor scales are saved


@dataclass(frozen=True)
class Fp8Config:
    """An FP8 weight checkpoint.

    method:     "fp8" or "compressed-tensors" (config.json's quant_method)
    kind:       "block" (a scale per 128 x 128 block), "channel" (per output row), "tensor" (one)
    group:      K-columns per scale: 128 for block, 0 for channel / tensor (the whole row)
    activation: "dynamic" (per token at run time), "static" (<linear>.input_scale) or "none"
                (weight-only: the checkpoint quantizes no activations)
    ignore:     module names or "re:<regex>" patterns whose linears are stored as plain floats
    kv_scales:  the checkpoint must have K / V scales per layer (kv_cache_scheme); an "fp8"
                checkpoint's are also read where present without it (fp8_weights.kv_scale_names)
    online:     a float checkpoint quantized while it loads (quantization="fp8", online_fp8.py)
    """

    method: str
    kind: str
    group: int
    activation: str
    ignore: tuple[str, ...] = ()
    kv_scales: bool = False
    online: bool = False

    @property
    def scale_suffix(self) -> str:
        """The scale tensor's name after `<linear>.`: transformers' block FP8 names it by its use
        (the inverse of the quantizer's 448 / amax), AutoFP8 and compressed-tensors by its meaning."""
        return "weight_scale_inv" if self.kind == "block" else "weight_scale"

    def ignores(self, module: str) -> bool:
        """Whether linear `module` (e.g. "model.layers.0.mlp.gate") is left unquantized."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return True
            elif module == entry or module.endswith("." + entry) or f".{entry}." in f".{module}.":
                return True
        return False

    def scale_shapes(self, n: int, k: int) -> tuple[tuple[int, ...], ...]:
        """The shapes the checkpoint may give the scale of a weight [n, k]."""
        if self.kind == "block":
            return ((math.ceil(n / BLOCK), math.ceil(k / BLOCK)),)
        if self.kind == "channel":
            return ((n, 1),)
        return SCALAR_SHAPES


def parse_quantization(raw: dict) -> Fp8Config | None:
    """config.json's quantization_config (or compression_config) -> Fp8Config; None if absent.

    Raises UNSUPPORTED_QUANTIZATION naming the first field whose value is not served."""
    q = raw.get("quantization_config", raw.get("compression_config"))
    if q is None:
        return None
    if not isinstance(q, dict):
        _refuse("", q, "an object")
    method = q.get("quant_method")
    if method == "fp8":
        return _parse_fp8(q)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(q)
    _refuse("quant_method", method, "'fp8' or 'compressed-tensors' (FP8 weights)")


def _refuse(field: str, value, expected: str):
    where = "config.json quantization_config" + (f".{field}" if field else "")
    raise ModelLoadError(ModelErrorCode.UNSUPPORTED_QUANTIZATION,
                         f"{where}: expected {expected}, got {value!r:.200} (not supported)")


def _names(q: dict, field: str) -> tuple[str, ...]:
    value = q.get(field) or []
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        _refuse(field, value, "a list of module names")
    for v in value:
        if v.startswith("re:"):
            try:
                re.compile(v[3:])
            except re.error:
                _refuse(field, v, "valid 're:' regular expressions")
    return tuple(value)


def _parse_fp8(q: dict) -> Fp8Config:
    """quant_method "fp8": block-wise with weight_block_size, else per tensor (AutoFP8)."""
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        _refuse("fmt", fmt, "'e4m3'")
    # vLLM's Fp8Config: ignored_layers, or transformers' modules_to_not_convert where that is empty
    ignore = _names(q, "ignored_layers") or _names(q, "modules_to_not_convert")
    kv = q.get("kv_cache_scheme")
    if kv not in (None, "static"):
        _refuse("kv_cache_scheme", kv, "'static' or absent")
    block = q.get("weight_block_size")
    if block is not None:
        if block != [BLOCK, BLOCK]:
            _refuse("weight_block_size", block, f"[{BLOCK}, {BLOCK}] or absent (per tensor)")
        scheme = q.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            _refuse("activation_scheme", scheme, "'dynamic' (with weight_block_size)")
        return Fp8Config("fp8", "block", BLOCK, "dynamic", ignore, kv_scales=kv == "static")
    scheme = q.get("activation_scheme")
    if scheme not in ("static", "dynamic"):
        _refuse("activation_scheme", scheme, "'static' or 'dynamic' (per-tensor FP8)")
    return Fp8Config("fp8", "tensor", 0, scheme, ignore, kv_scales=kv == "static")


def _check_fp8_args(args, field: str) -> None:
    """A compressed-tensors QuantizationArgs object that is 8-bit float and symmetric."""
    if not isinstance(args, dict):
        _refuse(field, args, "an object")
    for key, want in (("num_bits", 8), ("type", "float"), ("symmetric", True)):
        if args.get(key, want) != want:
            _refuse(f"{field}.{key}", args.get(key), repr(want))
    for key in ("group_size", "block_structure", "actorder"):
        if args.get(key) not in (None, False):
            _refuse(f"{field}.{key}", args.get(key), "null")


def _parse_compressed_tensors(q: dict) -> Fp8Config:
    fmt = q.get("format", "float-quantized")
    if fmt != "float-quantized":
        _refuse("format", fmt, "'float-quantized'")
    if q.get("sparsity_config"):
        _refuse("sparsity_config", q.get("sparsity_config"), "null")
    groups = q.get("config_groups")
    if not (isinstance(groups, dict) and len(groups) == 1):
        _refuse("config_groups", groups, "one scheme (FP8 on every Linear)")
    name, scheme = next(iter(groups.items()))
    field = f"config_groups.{name}"
    if not isinstance(scheme, dict):
        _refuse(field, scheme, "an object")
    if scheme.get("targets") != ["Linear"]:
        _refuse(f"{field}.targets", scheme.get("targets"), "['Linear']")
    weights = scheme.get("weights")
    _check_fp8_args(weights, f"{field}.weights")
    strategy = weights.get("strategy")
    if strategy not in ("channel", "tensor"):
        _refuse(f"{field}.weights.strategy", strategy, "'channel' or 'tensor'")
    if weights.get("dynamic", False) is not False:
        _refuse(f"{field}.weights.dynamic", weights.get("dynamic"), "false")
    acts = scheme.get("input_activations")
    if acts is None:
        activation = "none"
    else:
        _check_fp8_args(acts, f"{field}.input_activations")
        dynamic, act_strategy = acts.get("dynamic"), acts.get("strategy")
        if dynamic is True and act_strategy == "token":
            activation = "dynamic"
        elif dynamic is False and act_strategy == "tensor":
            activation = "static"
        else:
            _refuse(f"{field}.input_activations", {"dynamic": dynamic, "strategy": act_strategy},
                    "dynamic 'token' or static 'tensor'")
    if scheme.get("output_activations") is not None:
        _refuse(f"{field}.output_activations", scheme.get("output_activations"), "null")
    kv = q.get("kv_cache_scheme")
    if kv is not None:
        _check_fp8_args(kv, "kv_cache_scheme")
        if kv.get("strategy", "tensor") != "tensor" or kv.get("dynamic", False) is not False:
            _refuse("kv_cache_scheme", {"strategy": kv.get("strategy"), "dynamic": kv.get("dynamic")},
                    "static 'tensor' scales")
    return Fp8Config("compressed-tensors", strategy, 0, activation, _names(q, "ignore"), kv is not None)
