"""Checkpoint loading: a Hugging Face folder (config.json + *.safetensors) into a CausalLM.

Reads one file or the shards listed in model.safetensors.index.json, with a tqdm bar over
shards; casts to the requested dtype; fills the fused qkv_proj / gate_up_proj from the
checkpoint's separate projections; ties lm_head to the embedding when the config says so.
Never touches a hub: a path that is not a local folder is an error. Under tensor parallelism
(a TPGroup of world > 1) each rank reads only its slice of each sharded tensor (safetensors
get_slice; rules in model_wrapper/parallel.py) into a model built with its own sizes.
"""

from __future__ import annotations

import json
import os

import torch
from loguru import logger
from safetensors import safe_open
from tqdm import tqdm

from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.models.decoder import CausalLM
from model_wrapper.parallel import TPGroup, TPShard

_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _shard_files(path: str) -> list[str]:
    if not os.path.isdir(path):
        raise ModelLoadError(
            ModelErrorCode.MISSING_FILE, f"checkpoint path: expected a local folder, got {path!r}"
        )
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        hint = ""
        if any(f.startswith("pytorch_model") and f.endswith(".bin") for f in os.listdir(path)):
            hint = (" (it has PyTorch pickle weights, pytorch_model*.bin, which are not read: convert them once with "
                    "transformers: AutoModelForCausalLM.from_pretrained(path).save_pretrained(path, "
                    "safe_serialization=True))")
        raise ModelLoadError(ModelErrorCode.MISSING_FILE, f"no *.safetensors weights in {path!r}{hint}")
    missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise ModelLoadError(
            ModelErrorCode.MISSING_FILE, f"shards listed in the index are missing from {path!r}: {missing}"
        )
    return [os.path.join(path, f) for f in files]


def _row_ranges(cfg: ModelConfig | TPShard, fused: str) -> list[tuple[int, int]]:
    """Rows of each part in a fused parameter; a TPShard gives this rank's (local) sizes."""
    if fused.endswith("qkv_proj"):
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)]
    n = cfg.intermediate_size
    return [(0, n), (n, 2 * n)]


def _target(cfg: ModelConfig | TPShard, name: str):
    """HF tensor name -> (our parameter name, row range or None), or None to skip."""
    for hf, (ours, part) in _FUSED.items():
        marker = f".{hf}."
        if marker in name:
            return name.replace(marker, f".{ours}."), _row_ranges(cfg, ours)[part]
    return name, None


def _read_shard(f, hf_name: str, dst: torch.Tensor, shard: TPShard, file: str):
    """This rank's part of checkpoint tensor hf_name, and the part of dst it fills."""
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
            f"{hf_name} in {os.path.basename(file)}: expected shape {want}, got {shape}",
        )
    if rng is None:
        return sl[:], dst
    index = tuple(slice(start, start + length) if i == dim else slice(None) for i in range(len(shape)))
    return sl[index], dst.narrow(dim, 0, length)


def load_model(path: str, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device,
               tp: TPGroup | None = None, progress: bool = True) -> CausalLM:
    """progress: a tqdm bar on stderr over the shards (of two or more; rank 0 only under TP)."""
    files = _shard_files(path)
    tp = tp if tp is not None else TPGroup.single()
    with torch.device("meta"):
        model = CausalLM(cfg, tp)
    model = model.to_empty(device=device).to(dtype)
    shard = model.shard
    sizes = shard if tp.enabled else cfg
    if tp.enabled:  # the last vocabulary shard's padding rows are never read: keep them finite
        with torch.no_grad():
            model.model.embed_tokens.weight.zero_()
            model.lm_head.weight.zero_()
    params = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    # every (parameter, row range) that must be filled; fused ones by parts
    pending: set[tuple[str, tuple[int, int] | None]] = set()
    for name, p in params.items():
        parts = None
        for _, (ours, _) in _FUSED.items():
            if f".{ours}." in name:
                parts = _row_ranges(sizes, ours)
        pending.update((name, r) for r in parts) if parts else pending.add((name, None))

    bar_off = not progress or len(files) < 2 or tp.rank != 0
    for file in tqdm(files, desc="loading shards", unit="shard", disable=bar_off):
        with safe_open(file, framework="pt", device="cpu") as f:
            for hf_name in f.keys():
                name, rows = _target(sizes, hf_name)
                if name not in params:
                    if not (cfg.tie_word_embeddings and name == "lm_head.weight"):
                        logger.debug("ignoring checkpoint tensor {}", hf_name)
                    continue
                param = params[name]
                dst = param.data if rows is None else param.data[rows[0] : rows[1]]
                if tp.enabled:
                    t, dst = _read_shard(f, hf_name, dst, shard, file)
                else:
                    t = f.get_tensor(hf_name)
                if tuple(t.shape) != tuple(dst.shape):
                    raise ModelLoadError(
                        ModelErrorCode.MISSHAPEN_TENSOR,
                        f"{hf_name} in {os.path.basename(file)}: expected shape {tuple(dst.shape)}, "
                        f"got {tuple(t.shape)}",
                    )
                with torch.no_grad():
                    dst.copy_(t.to(dtype))
                pending.discard((name, rows))
    if pending:
        names = sorted(_hf_name(n, r, sizes) for n, r in pending)
        raise ModelLoadError(
            ModelErrorCode.MISSING_TENSOR,
            f"checkpoint {path!r} lacks {len(names)} tensor(s), e.g. {names[:5]}",
        )
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval().requires_grad_(False)


def _hf_name(name: str, rows, cfg: ModelConfig | TPShard) -> str:
    if rows is None:
        return name
    for hf, (ours, part) in _FUSED.items():
        if f".{ours}." in name and _row_ranges(cfg, ours)[part] == rows:
            return name.replace(f".{ours}.", f".{hf}.")
    return name
