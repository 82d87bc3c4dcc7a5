"""ModelConfig: the numbers the shared decoder needs, read from a checkpoint's config.json.

Reads the JSON itself (not transformers' config classes) so that checkpoints saved by
transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`) both load.
Every field the decoder uses is type- and range-checked here (a bad one is BAD_CONFIG naming
it), and a quantized checkpoint is parsed or refused (check_quantization); the sizes are compared with
the weights' headers later, in loader.py, before anything is allocated.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from model_wrapper.checkpoint import read_json_object, resolve_file
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.families import FAMILIES, Family, MoEStyle
from model_wrapper.quantization import Fp8Config, parse_quantization

MAX_POSITIONS = 1 << 24  # rotary positions are float32, exact integers only up to 2**24
CONFIG_DTYPES = ("float32", "float16", "bfloat16", "float", "half", "float64")  # config.json "dtype"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters. rope_type: "default", "linear" or "llama3"."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts model's sparse MLPs (global sizes; TPShard slices the widths).

    num_experts: E per sparse layer; top_k: experts per token; intermediate_size: each expert's width
    norm_topk_prob: renormalise the top-k probabilities; fp32_weights: routing weights kept in fp32
    shared_intermediate_size: the shared expert's width (Qwen2-MoE) or None
    sparse_layers: per layer, True where the MLP is sparse (others are dense, of the config's
                   intermediate_size: Qwen's decoder_sparse_step / mlp_only_layers)
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    fp32_weights: bool
    shared_intermediate_size: int | None
    sparse_layers: tuple[bool, ...]


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    # one entry per layer: None (full attention) or the window W (a token sees the last W keys,
    # itself included, as transformers' sliding_window and FlashInfer's window_left = W - 1)
    layer_windows: tuple[int | None, ...] = field(default=())
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 always; others by attention_bias)
    o_bias: bool = False  # bias on o_proj (attention_bias in Llama / Mistral / Qwen3)
    mlp_bias: bool = False
    dtype_name: str = "float32"
    moe: MoEConfig | None = None  # mixture-of-experts families only
    quant: Fp8Config | None = None  # an FP8 weight checkpoint's format (model_wrapper/quantization.py)

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_pretrained(cls, path: str) -> "ModelConfig":
        if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
            raise ModelLoadError(
                ModelErrorCode.MISSING_FILE,
                f"checkpoint path: expected a local folder (no hub access), got {path!r}",
            )
        if not os.path.lexists(os.path.join(path, "config.json")):
            raise ModelLoadError(
                ModelErrorCode.MISSING_FILE, f"config.json not found in checkpoint folder {path!r}"
            )
        raw = read_json_object(resolve_file(path, "config.json", "config.json"), "config.json")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        """Every field is type- and range-checked: a bad value is BAD_CONFIG naming the field."""
        if not isinstance(raw, dict):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"config: expected a dict, got {type(raw).__name__}")
        quant = check_quantization(raw)
        archs = raw.get("architectures") or []
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        if arch not in FAMILIES:
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_ARCHITECTURE,
                f"config.json architectures: expected one of {sorted(FAMILIES)}, got {archs!r}",
            )
        family = FAMILIES[arch]

        hidden = _int(raw, "hidden_size")
        heads = _int(raw, "num_attention_heads")
        kv_heads = _int(raw, "num_key_value_heads", heads)
        if raw.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                f"config.json: hidden_size ({hidden}) must be divisible by num_attention_heads ({heads}) "
                "when head_dim is not given",
            )
        head_dim = _int(raw, "head_dim", hidden // heads)
        if head_dim % 2:
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG, f"config.json head_dim: expected an even number (rotary pairs), got {head_dim}"
            )
        if heads % kv_heads != 0:
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                f"config.json: num_attention_heads ({heads}) must be a multiple of "
                f"num_key_value_heads ({kv_heads})",
            )
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_FEATURE, f"config.json hidden_act: expected 'silu', got {act!r}"
            )
        num_layers = _int(raw, "num_hidden_layers")
        max_pos = _int(raw, "max_position_embeddings", 2048)
        if max_pos > MAX_POSITIONS:
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                f"config.json max_position_embeddings: expected at most {MAX_POSITIONS} (float32 positions "
                f"are exact up to 2**24), got {max_pos}",
            )
        eps = _float(raw, "rms_norm_eps", 1e-6, minimum=0.0)
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if not isinstance(dtype_name, str) or dtype_name.replace("torch.", "") not in CONFIG_DTYPES:
            raise ModelLoadError(
                ModelErrorCode.UNSUPPORTED_DTYPE,
                f"config.json dtype: expected one of {sorted(CONFIG_DTYPES)}, got {dtype_name!r}",
            )
        window = raw.get("sliding_window")
        if window is not None and not (_is_int(window) and window >= 0):
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG, f"config.json sliding_window: expected null or an int >= 0, got {window!r}"
            )
        _int(raw, "max_window_layers", 0, minimum=0)
        types = raw.get("layer_types")
        if types is not None and not (isinstance(types, list) and len(types) == num_layers
                                      and all(t in ("full_attention", "sliding_attention") for t in types)):
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                f"config.json layer_types: expected {num_layers} of 'full_attention' / 'sliding_attention', "
                f"got {types!r:.200}",
            )
        attention_bias = _bool(raw, "attention_bias")
        _bool(raw, "use_sliding_window")
        return cls(
            architecture=arch,
            family=family,
            vocab_size=_int(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(raw, "intermediate_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=eps,
            max_position_embeddings=max_pos,
            tie_word_embeddings=_bool(raw, "tie_word_embeddings"),
            rope=_rope_from_dict(raw),
            layer_windows=family.layer_windows(raw, num_layers),
            qkv_bias=family.qkv_bias or attention_bias,
            o_bias=(not family.qkv_bias) and attention_bias,
            mlp_bias=_bool(raw, "mlp_bias"),
            dtype_name=dtype_name.replace("torch.", ""),
            moe=_moe_from_dict(raw, family.moe, num_layers) if family.moe else None,
            quant=quant,
        )


# quantization_config.quant_method values this library serves (FP8 weights, model_wrapper/quantization.py);
# every other method is refused at load
SUPPORTED_QUANTIZATION: frozenset[str] = frozenset({"fp8", "compressed-tensors"})


def check_quantization(raw: dict) -> Fp8Config | None:
    """The checkpoint's FP8 format (None: unquantized), or UNSUPPORTED_QUANTIZATION.

    Loading quantized weights as if they were plain floats would silently produce garbage
    (FP8 weights without their scales, int4 packs read as int32, ...): a method not in
    SUPPORTED_QUANTIZATION, or a variant of one that is not served, is refused naming the field.
    """
    # compression_config: the name llm-compressor (compressed-tensors) exports used before
    q = raw.get("quantization_config", raw.get("compression_config"))
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method not in SUPPORTED_QUANTIZATION:
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_QUANTIZATION,
            f"config.json quantization_config.quant_method {method!r} is not supported "
            f"(supported: {sorted(SUPPORTED_QUANTIZATION)}, FP8 weights)",
        )
    return parse_quantization(raw)


def _moe_from_dict(raw: dict, style: MoEStyle, num_layers: int) -> MoEConfig:
    key = next((k for k in style.experts_keys if k in raw), style.experts_keys[0])
    experts = _int(raw, key)
    top_k = _int(raw, "num_experts_per_tok")
    if top_k > experts:
        raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                             f"config.json num_experts_per_tok: expected at most {key} ({experts}), "
                             f"got {top_k}")
    sparse = [True] * num_layers
    if style.sparse_step:
        step = _int(raw, "decoder_sparse_step", 1)
        only = raw.get("mlp_only_layers") or []
        if not (isinstance(only, list) and all(_is_int(i) and 0 <= i < num_layers for i in only)):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"config.json mlp_only_layers: expected layer indices in [0, {num_layers}), "
                                 f"got {only!r:.200}")
        sparse = [i not in only and (i + 1) % step == 0 for i in range(num_layers)]
    shared = _int(raw, "shared_expert_intermediate_size") if style.shared else None
    return MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=_int(raw, style.inter_key),
        norm_topk_prob=style.always_norm or _bool(raw, "norm_topk_prob"),
        fp32_weights=style.fp32_weights,
        shared_intermediate_size=shared,
        sparse_layers=tuple(sparse),
    )


_MISSING = object()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(raw: dict, key: str, default=_MISSING, *, minimum: int = 1) -> int:
    """raw[key] as an int >= minimum; absent or null -> default (required when no default)."""
    value = raw.get(key)
    if value is None:
        if default is _MISSING:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"config.json: missing required field {key!r}")
        return default
    if not _is_int(value) or value < minimum:
        raise ModelLoadError(
            ModelErrorCode.BAD_CONFIG, f"config.json {key}: expected an integer >= {minimum}, got {value!r:.100}"
        )
    return value


def _float(raw: dict, key: str, default: float, *, minimum: float, strict: bool = False, where: str = "") -> float:
    """raw[key] as a finite float >= minimum (> minimum when strict); absent or null -> default."""
    value = raw.get(key)
    if value is None:
        return default
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > minimum if strict else value >= minimum))
    if not ok:
        op = ">" if strict else ">="
        raise ModelLoadError(
            ModelErrorCode.BAD_CONFIG, f"config.json {where}{key}: expected a finite number {op} {minimum}, "
            f"got {value!r:.100}"
        )
    return float(value)


def _bool(raw: dict, key: str, default: bool = False) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"config.json {key}: expected true or false, got {value!r:.100}")
    return value


def _rope_from_dict(raw: dict) -> RopeConfig:
    params, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG, f"config.json {key}: expected an object, got {value!r:.100}")
    params = {**(scaling or {}), **(params or {})}
    theta = _float(params, "rope_theta", _float(raw, "rope_theta", 10000.0, minimum=0.0, strict=True),
                   minimum=0.0, strict=True, where="rope_parameters.")
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_FEATURE,
            f"config.json rope type: expected 'default', 'linear' or 'llama3', got {rope_type!r}",
        )
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_FEATURE, "config.json partial_rotary_factor != 1 is not supported"
        )
    where = "rope_parameters."
    low = _float(params, "low_freq_factor", 1.0, minimum=0.0, strict=True, where=where)
    high = _float(params, "high_freq_factor", 4.0, minimum=0.0, strict=True, where=where)
    if rope_type == "llama3" and high == low:  # the smoothing divides by high - low
        raise ModelLoadError(
            ModelErrorCode.BAD_CONFIG,
            f"config.json rope_parameters: llama3 scaling needs high_freq_factor != low_freq_factor, got {high} and {low}",
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=_float(params, "factor", 1.0, minimum=0.0, strict=True, where=where),
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=_int(params, "original_max_position_embeddings", 8192),
    )
