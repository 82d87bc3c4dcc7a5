"""Load an EAGLE-3 draft head (the public checkpoint layout) for a given target model.

Input: a folder with config.json (architectures ["LlamaForCausalLMEagle3"], a one-layer Llama
shape plus draft_vocab_size, target_hidden_size and optionally eagle_aux_hidden_state_layer_ids)
and safetensors holding

    fc.weight                                   [H, 3 * target_hidden]
    midlayer.input_layernorm.weight / hidden_norm.weight / post_attention_layernorm.weight   [H]
    midlayer.self_attn.{q,k,v}_proj.weight      [heads * head_dim | kv_heads * head_dim, 2H]
    midlayer.self_attn.o_proj.weight            [H, heads * head_dim]
    midlayer.mlp.{gate,up}_proj.weight [I, H],  midlayer.mlp.down_proj.weight [H, I]
    norm.weight [H],  lm_head.weight [draft_vocab, H]
    d2t [draft_vocab] int (target id = draft id + d2t[draft id]),  t2d [vocab] bool (optional, unused)
    embed_tokens.weight [vocab, H] (optional: without it the head embeds with the target's table)

Output: (Eagle3Head on the device, its ModelConfig, the three target hidden-state indices it
reads, numbered as forward_tensor's output_hidden_states). Everything is checked against the
target before anything is allocated; a head that does not fit its target is DRAFT_MISMATCH.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from safetensors import SafetensorError, safe_open

from model_wrapper.checkpoint import read_checkpoint, read_json_object, resolve_file
from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.models.eagle3 import Eagle3Head

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default target states (SafeAILab's training code, vLLM, SGLang): the inputs of
    layers 2, L // 2 and L - 3 (output_hidden_states indices)."""
    return 2, num_layers // 2, num_layers - 3


def _fail(code: ModelErrorCode, msg: str):
    raise ModelLoadError(code, msg)


def read_eagle3_config(path: str, target: ModelConfig) -> tuple[ModelConfig, int, int, tuple[int, int, int]]:
    """-> (the head's ModelConfig, target_hidden, draft_vocab, aux layer indices), checked against target."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        _fail(ModelErrorCode.MISSING_FILE, f"EAGLE-3 head path: expected a local folder, got {path!r}")
    raw = read_json_object(resolve_file(path, "config.json", "config.json"), "config.json")
    archs = raw.get("architectures") or []
    if not (isinstance(archs, list) and any(a in ARCHITECTURES for a in archs)):
        _fail(ModelErrorCode.UNSUPPORTED_ARCHITECTURE,
              f"EAGLE-3 head config.json architectures: expected one of {list(ARCHITECTURES)}, got {archs!r}")
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        _fail(ModelErrorCode.UNSUPPORTED_FEATURE, f"EAGLE-3 head num_hidden_layers: expected 1, got {layers!r}")
    if raw.get("norm_before_residual"):
        _fail(ModelErrorCode.UNSUPPORTED_FEATURE, "EAGLE-3 head norm_before_residual: expected false (the "
              "residual is the un-normed feature, as SafeAILab's EAGLE-3), got true")
    no_rope = raw.get("rope_theta") is None and raw.get("rope_parameters") is None
    # the head reads positions as long as its target does; its rotary tables do not depend on the limit
    as_llama = {**raw, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                "max_position_embeddings": max(int(raw.get("max_position_embeddings") or 0),
                                               target.max_position_embeddings)}
    if no_rope:
        as_llama.pop("rope_theta", None)
    cfg = ModelConfig.from_dict(as_llama)
    if no_rope:  # some published heads leave rope_theta null: the target's rotary is meant
        cfg = dataclasses.replace(cfg, rope=target.rope)

    def whole(key, default):
        v = raw.get(key, default)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(ModelErrorCode.BAD_CONFIG, f"EAGLE-3 head config.json {key}: expected an int >= 1, got {v!r}")
        return v

    target_hidden = whole("target_hidden_size", cfg.hidden_size)
    draft_vocab = whole("draft_vocab_size", cfg.vocab_size)
    if target_hidden != target.hidden_size:
        _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head target_hidden_size: expected the target's hidden "
              f"size {target.hidden_size}, got {target_hidden}")
    if cfg.vocab_size != target.vocab_size:
        _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head vocab_size: expected the target's vocabulary "
              f"{target.vocab_size}, got {cfg.vocab_size}")
    if draft_vocab > cfg.vocab_size:
        _fail(ModelErrorCode.BAD_CONFIG, f"EAGLE-3 head draft_vocab_size: expected <= vocab_size "
              f"{cfg.vocab_size}, got {draft_vocab}")
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is None and isinstance(raw.get("eagle_config"), dict):
        aux = raw["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    L = target.num_layers
    if aux is None:
        aux = default_aux_layers(L)
        if min(aux) < 0:
            _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head: the default target layers (2, L // 2, L - 3) "
                  f"need a target of at least 3 layers, got {L}; name them in eagle_aux_hidden_state_layer_ids")
    if not (isinstance(aux, (list, tuple)) and len(aux) == 3
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= L for i in aux)):
        _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head eagle_aux_hidden_state_layer_ids: expected 3 "
              f"indices in [0, {L}] (the target's layers), got {aux!r}")
    return cfg, target_hidden, draft_vocab, tuple(aux)


def _expected_shapes(cfg: ModelConfig, target_hidden: int, draft_vocab: int) -> dict[str, tuple[int, ...]]:
    H, I, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    a = "midlayer.self_attn."
    shapes = {
        "fc.weight": (H, 3 * target_hidden),
        "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        a + "q_proj.weight": (q, 2 * H), a + "k_proj.weight": (kv, 2 * H), a + "v_proj.weight": (kv, 2 * H),
        a + "o_proj.weight": (H, q),
        "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "norm.weight": (H,), "lm_head.weight": (draft_vocab, H), "d2t": (draft_vocab,),
    }
    if cfg.qkv_bias:
        shapes.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
    if cfg.o_bias:
        shapes[a + "o_proj.bias"] = (H,)
    if cfg.mlp_bias:
        shapes.update({"midlayer.mlp.gate_proj.bias": (I,), "midlayer.mlp.up_proj.bias": (I,),
                       "midlayer.mlp.down_proj.bias": (H,)})
    return shapes


# our fused parameter <- the checkpoint's tensors, concatenated along dim 0 in this order
_FUSED = {
    "midlayer.self_attn.qkv_proj.weight": ("midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                                           "midlayer.self_attn.v_proj.weight"),
    "midlayer.self_attn.qkv_proj.bias": ("midlayer.self_attn.q_proj.bias", "midlayer.self_attn.k_proj.bias",
                                         "midlayer.self_attn.v_proj.bias"),
    "midlayer.mlp.gate_up_proj.weight": ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"),
    "midlayer.mlp.gate_up_proj.bias": ("midlayer.mlp.gate_proj.bias", "midlayer.mlp.up_proj.bias"),
}


def load_eagle3_head(path: str, target: ModelConfig, *, target_embed: torch.Tensor | None, dtype: torch.dtype,
                     device: torch.device) -> tuple[Eagle3Head, ModelConfig, tuple[int, int, int]]:
    """Check the head against `target`, then build it on `device` in `dtype` (see the module doc).

    target_embed: the target's whole embedding table [vocab, H] (None where it has none to share,
    e.g. vocab-split under tensor parallelism: the head must then bring embed_tokens.weight)."""
    cfg, target_hidden, draft_vocab, aux = read_eagle3_config(path, target)
    tensors, paths = read_checkpoint(path)
    shapes = _expected_shapes(cfg, target_hidden, draft_vocab)
    optional = {"t2d": (cfg.vocab_size,), "embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for name, info in tensors.items():
        want = shapes.get(name, optional.get(name))
        if want is None:
            _fail(ModelErrorCode.UNEXPECTED_TENSOR, f"EAGLE-3 head tensor {name!r} in {info.file}: not part of the layout")
        if tuple(info.shape) != want:
            _fail(ModelErrorCode.MISSHAPEN_TENSOR, f"EAGLE-3 head {name} in {info.file}: expected shape {want}, "
                  f"got {tuple(info.shape)}")
        integral = name in ("d2t", "t2d")
        if integral == (info.dtype in ("F16", "BF16", "F32", "F64")):
            _fail(ModelErrorCode.UNSUPPORTED_DTYPE, f"EAGLE-3 head {name}: expected "
                  f"{'an integer' if integral else 'a float'} dtype, got {info.dtype}")
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        _fail(ModelErrorCode.MISSING_TENSOR, f"EAGLE-3 head {path!r} lacks {len(missing)} tensor(s), e.g. {missing[:5]}")
    own_embed = "embed_tokens.weight" in tensors
    if not own_embed and (target_embed is None or cfg.hidden_size != target.hidden_size):
        _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head: no embed_tokens.weight, and the target's embedding "
              f"cannot be shared (head hidden size {cfg.hidden_size}, target {target.hidden_size}"
              f"{', vocab-split under tensor parallelism' if target_embed is None else ''})")

    loaded = {}
    try:
        for file in sorted({info.file for info in tensors.values()}):
            with safe_open(paths[file], framework="pt", device="cpu") as f:
                for name in (n for n, info in tensors.items() if info.file == file):
                    loaded[name] = f.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as e:
        _fail(ModelErrorCode.CORRUPT_FILE, f"EAGLE-3 head {path!r}: unreadable safetensors data: {e}")
    d2t = loaded["d2t"].to(torch.int64)
    mapped = torch.arange(draft_vocab) + d2t
    if bool(((mapped < 0) | (mapped >= cfg.vocab_size)).any()):
        bad = int(torch.nonzero((mapped < 0) | (mapped >= cfg.vocab_size))[0, 0])
        _fail(ModelErrorCode.DRAFT_MISMATCH, f"EAGLE-3 head d2t: expected draft id + d2t in [0, {cfg.vocab_size}) "
              f"(the target's vocabulary), got {int(mapped[bad])} for draft id {bad}")
    for name, t in loaded.items():
        if name not in ("d2t", "t2d") and not bool(torch.isfinite(t.to(dtype)).all()):
            _fail(ModelErrorCode.NONFINITE_WEIGHT, f"EAGLE-3 head {name}: expected finite weights in {dtype}, "
                  "got NaN or inf")

    with torch.device("meta"):
        head = Eagle3Head(cfg, target_hidden, draft_vocab, embed=None if own_embed else target_embed)
    head = head.to_empty(device=device).to(dtype)
    if not own_embed:
        head._shared_embed = target_embed.detach()  # to_empty does not see a plain attribute
    with torch.no_grad():
        for name, p in head.named_parameters():
            parts = _FUSED.get(name, (name,))
            p.copy_(torch.cat([loaded[n] for n in parts]).to(dtype))
        head.d2t.copy_(d2t)
    return head.eval().requires_grad_(False), cfg, aux
