"""Reading one PEFT LoRA adapter folder into host tensors, validated against the base model.

Input: a folder written by peft's `save_pretrained` (adapter_config.json +
adapter_model.safetensors, keys `base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight`).
Output: a PeftAdapter whose B matrices already carry the scaling, so the manager only copies
them into a slot. Everything is checked here, before any slot is touched.

Which modules are adapted is read from the weights themselves: they are what peft resolved from
target_modules (list, regex string or "all-linear"), layers_to_transform and exclude_modules.
Rank and alpha per module follow peft (0.21, `tuners.lora.model._create_and_replace` and
`utils.other.get_pattern_key`): for the module key `model.layers.{i}.self_attn.q_proj`, the first
key of rank_pattern / alpha_pattern (in the file's order) for which
`re.match(rf"(.*\\.)?({key})$", module_key)` holds gives r / alpha, else the config's r /
lora_alpha. scale = alpha / sqrt(r) with use_rslora, else alpha / r.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch
from safetensors import safe_open

from adapters.errors import LoraError, LoraErrorCode
from adapters.shapes import PEFT_MODULES, PEFT_PARENTS, LoraShapes

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_MODULE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<parent>self_attn|mlp)\.(?P<proj>[A-Za-z_]+)$")

# adapter_config.json fields whose non-default values change the math beyond plain LoRA
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora=True)",
    "lora_bias": "a LoRA bias (lora_bias=True)",
    "use_qalora": "QA-LoRA (use_qalora=True)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "layer_replication": "layer_replication",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
}


@dataclass
class PeftAdapter:
    """One adapter on the host, float32.

    weights: (layer, PEFT module name) -> (A [r, in_features], B [out_features, r] * scale)
             for every module the adapter adapts; r may differ between modules (rank_pattern).
    """

    name: str
    path: str
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def max_rank(self) -> int:
        return max(a.shape[0] for a, _ in self.weights.values())

    @property
    def target_modules(self) -> list[str]:
        return sorted({module for _, module in self.weights})


def pattern_value(patterns: dict, module_key: str, default):
    """peft's rank_pattern / alpha_pattern lookup (see the module docstring)."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module_key):
            return patterns[key]
    return patterns.get(module_key, default)


def read_peft_adapter(name: str, path: str, shapes: LoraShapes, *, max_rank: int | None = None) -> PeftAdapter:
    """Read and validate `path`; raise LoraError (MISSING_FILE, INVALID_CONFIG, UNSUPPORTED_*,
    SHAPE_MISMATCH, RANK_TOO_LARGE, NON_FINITE_WEIGHTS) naming `load_adapter(name=...)` and what
    was expected. Names and shapes (and the rank against max_rank, if given) are checked from the
    safetensors header, before any tensor is read: an oversized file is refused unread."""
    arg = f"load_adapter(name={name!r})"

    def fail(code: LoraErrorCode, message: str):
        raise LoraError(code, arg, message)

    path = os.fspath(path)
    if not os.path.isdir(path):
        fail(LoraErrorCode.MISSING_FILE, f"expected a PEFT adapter folder, got {path!r} (no such folder)")
    cfg_path, weights_path = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(cfg_path):
        fail(LoraErrorCode.MISSING_FILE, f"expected {CONFIG_FILE} in {path!r}, got no such file")
    if not os.path.isfile(weights_path):
        hint = " (adapter_model.bin is not read: save with safe_serialization=True)" if os.path.isfile(
            os.path.join(path, "adapter_model.bin")) else ""
        fail(LoraErrorCode.MISSING_FILE, f"expected {WEIGHTS_FILE} in {path!r}, got no such file{hint}")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(LoraErrorCode.INVALID_CONFIG, f"expected a JSON object in {cfg_path!r}, got {e}")
    if not isinstance(cfg, dict):
        fail(LoraErrorCode.INVALID_CONFIG, f"expected a JSON object in {cfg_path!r}, got {type(cfg).__name__}")
    rank, alpha, rank_pattern, alpha_pattern, use_rslora = _check_config(cfg, fail)

    try:
        with safe_open(weights_path, framework="pt", device="cpu") as f:
            header = {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
            _check_header(header, shapes, max_rank, fail)
            state = {key: f.get_tensor(key) for key in header}
    except LoraError:
        raise
    except Exception as e:  # safetensors raises its own error types for a corrupt file
        fail(LoraErrorCode.INVALID_CONFIG, f"expected a readable {WEIGHTS_FILE}, got {type(e).__name__}: {e}")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():  # every key's name passed _check_header
        m = _KEY.match(key)
        mod = _MODULE.match(m["module"])
        layer = int(mod["layer"])
        if layer >= shapes.num_layers:
            fail(LoraErrorCode.SHAPE_MISMATCH,
                 f"expected layers 0..{shapes.num_layers - 1} (the base model has {shapes.num_layers}), "
                 f"got tensor {key!r}")
        pairs.setdefault((layer, mod["proj"]), {})[m["ab"]] = tensor
    if not pairs:
        fail(LoraErrorCode.INVALID_CONFIG, f"expected LoRA weights in {weights_path!r}, got none")

    weights = {}
    for (layer, proj), ab in sorted(pairs.items()):
        module_key = f"model.layers.{layer}.{PEFT_PARENTS[proj]}.{proj}"
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            fail(LoraErrorCode.SHAPE_MISMATCH, f"expected lora_A and lora_B for {module_key}, got no {missing}")
        a, b = ab["A"], ab["B"]
        in_f, out_f = shapes.peft_shape(proj)
        r = int(a.shape[0]) if a.dim() == 2 else -1
        if a.dim() != 2 or a.shape[1] != in_f or r < 1:
            fail(LoraErrorCode.SHAPE_MISMATCH,
                 f"expected {module_key}.lora_A of shape [r, {in_f}], got {list(a.shape)}")
        if b.dim() != 2 or tuple(b.shape) != (out_f, r):
            fail(LoraErrorCode.SHAPE_MISMATCH,
                 f"expected {module_key}.lora_B of shape [{out_f}, {r}], got {list(b.shape)}")
        r_cfg = pattern_value(rank_pattern, module_key, rank)
        if r_cfg != r:
            fail(LoraErrorCode.SHAPE_MISMATCH,
                 f"expected {module_key} of rank {r_cfg} (adapter_config.json r / rank_pattern), "
                 f"got weights of rank {r}")
        a_alpha = pattern_value(alpha_pattern, module_key, alpha)
        if not _positive_number(a_alpha):
            fail(LoraErrorCode.INVALID_CONFIG, f"expected a finite positive number as alpha of {module_key}, "
                                               f"got {a_alpha!r}")
        scale = a_alpha / math.sqrt(r) if use_rslora else a_alpha / r
        a, b = a.float(), b.float() * scale
        for what, w in ((f"{module_key}.lora_A", a), (f"{module_key}.lora_B * scale ({scale:g})", b)):
            if not bool(torch.isfinite(w).all()):
                fail(LoraErrorCode.NON_FINITE_WEIGHTS, f"expected finite values in {what}, got "
                     f"{int((~torch.isfinite(w)).sum())} NaN / inf of {w.numel()}")
        weights[(layer, proj)] = (a, b)
    return PeftAdapter(name=name, path=path, weights=weights)


def _check_config(cfg: dict, fail):
    """-> (r, lora_alpha, rank_pattern, alpha_pattern, use_rslora) after refusing what plain LoRA is not."""
    peft_type = cfg.get("peft_type", "LORA")
    if peft_type != "LORA":
        fail(LoraErrorCode.UNSUPPORTED_CONFIG, f"expected peft_type 'LORA', got {peft_type!r}")
    for key, what in _UNSUPPORTED.items():
        if cfg.get(key):
            fail(LoraErrorCode.UNSUPPORTED_CONFIG, f"expected plain LoRA, got {what}")
    if cfg.get("bias", "none") != "none":
        fail(LoraErrorCode.UNSUPPORTED_CONFIG,
             f"expected bias 'none' (base biases left untrained), got {cfg['bias']!r}")
    for key in ("modules_to_save", "trainable_token_indices"):
        if cfg.get(key):
            fail(LoraErrorCode.UNSUPPORTED_MODULE,
                 f"expected only LoRA on {sorted(PEFT_MODULES)}, got {key}={cfg[key]!r} (fully trained modules)")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        for t in targets:
            if not isinstance(t, str) or t.rsplit(".", 1)[-1] not in PEFT_MODULES:
                fail(LoraErrorCode.UNSUPPORTED_MODULE,
                     f"expected target_modules among {sorted(PEFT_MODULES)}, got {t!r}")
    elif targets is not None and not isinstance(targets, str):
        # a str is "all-linear" or a regex: the saved weights show what it matched
        fail(LoraErrorCode.INVALID_CONFIG, f"expected target_modules as a list or a str, got {targets!r}")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not _positive_int(rank):
        fail(LoraErrorCode.INVALID_CONFIG, f"expected r as a positive int, got {rank!r}")
    if not _positive_number(alpha):
        fail(LoraErrorCode.INVALID_CONFIG, f"expected lora_alpha as a finite positive number, got {alpha!r}")
    patterns = []
    for key in ("rank_pattern", "alpha_pattern"):
        p = cfg.get(key) or {}
        if not isinstance(p, dict):
            fail(LoraErrorCode.INVALID_CONFIG, f"expected {key} as an object, got {p!r}")
        for k, v in p.items():
            try:
                re.compile(k)
            except re.error as e:
                fail(LoraErrorCode.INVALID_CONFIG, f"expected {key} keys as regular expressions, got {k!r} ({e})")
            ok, want = (_positive_int(v), "a positive int") if key == "rank_pattern" else \
                (_positive_number(v), "a finite positive number")
            if not ok:
                fail(LoraErrorCode.INVALID_CONFIG, f"expected {key}[{k!r}] as {want}, got {v!r}")
        patterns.append(p)
    return rank, alpha, patterns[0], patterns[1], bool(cfg.get("use_rslora", False))


def _check_header(header: dict[str, list[int]], shapes: LoraShapes, max_rank: int | None, fail) -> None:
    """Shapes from the safetensors header, before any tensor is read: each lora_A is [r, in] and
    each lora_B [out, r] with in / out at most the base model's widest projection and r at most
    max_rank, so a file is never read into memory only to be refused (the full checks follow)."""
    widest = max(max(shapes.in_features(m), *shapes.out_features(m)) for m in ("qkv", "o", "gate_up", "down"))
    for key, shape in header.items():
        m = _KEY.match(key)
        mod = _MODULE.match(m["module"]) if m else None
        if mod is None or mod["proj"] not in PEFT_MODULES or PEFT_PARENTS[mod["proj"]] != mod["parent"]:
            fail(LoraErrorCode.UNSUPPORTED_MODULE,
                 f"expected only lora_A / lora_B weights of {sorted(PEFT_MODULES)} in model.layers.N, "
                 f"got tensor {key!r}")
        if len(shape) != 2 or max(shape, default=0) > max(widest, max_rank or 0):
            fail(LoraErrorCode.SHAPE_MISMATCH,
                 f"expected 2-D lora weights of at most {widest} rows / columns, got {key!r} of shape {shape}")
        if max_rank is not None:
            r = shape[0] if m["ab"] == "A" else shape[1]
            if r > max_rank:
                fail(LoraErrorCode.RANK_TOO_LARGE, f"expected rank <= max_rank={max_rank}, got {r}")


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _positive_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
