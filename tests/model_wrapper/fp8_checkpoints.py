"""Writing FP8 checkpoints for the tests (tests/model_wrapper/test_fp8_checkpoint.py): this file's own
quantizer, independent of the library's loader.

write_fp8(src, out, fmt) takes a float checkpoint saved by transformers and writes two folders: the
FP8 one (every linear weight not ignored as e4m3 with the format's scales and quantization_config)
and the dequantized one (fp8 * scale as floats, no quantization_config), the oracle's.

Formats: "block" (transformers' fine-grained FP8), "channel_dynamic" / "tensor_static" /
"channel_weight_only" (compressed-tensors), "autofp8_static" / "autofp8_dynamic" (AutoFP8: quant_method
"fp8" without weight_block_size, 0-d per-tensor weight_scale / input_scale, "ignored_layers",
kv_cache_scheme "static" and the K / V scale names of KV_LAYOUTS).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import torch
from safetensors.torch import load_file, save_file

E4M3, FP8_MAX = torch.float8_e4m3fn, 448.0
LINEAR_TAILS = ("lm_head", "gate", "shared_expert_gate", "w1", "w2", "w3")


# -- writing FP8 checkpoints: this file's own quantizer ------------------------------------------

def quantize(w: torch.Tensor, kind: str):
    """w [N, K] float -> (e4m3 [N, K], the checkpoint's scale, the dequantized fp32 weight)."""
    w = w.float()
    n, k = w.shape
    if kind == "block":
        nb, kb = math.ceil(n / 128), math.ceil(k / 128)
        pad = torch.zeros(nb * 128, kb * 128)
        pad[:n, :k] = w
        blocks = pad.view(nb, 128, kb, 128)
        scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-8)  # [nb, kb]
        q = (blocks / scale[:, None, :, None]).to(E4M3)
        deq = (q.float() * scale[:, None, :, None]).reshape(nb * 128, kb * 128)[:n, :k]
        return q.reshape(nb * 128, kb * 128)[:n, :k].contiguous(), scale, deq
    if kind == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-8)  # [N, 1]
    else:
        scale = (w.abs().amax() / FP8_MAX).clamp_min(1e-8).reshape(1)  # [1]
    q = (w / scale.reshape(-1, 1)).to(E4M3)
    return q, scale, q.float() * scale.reshape(-1, 1)


def _is_linear(name: str) -> bool:
    module = name[: -len(".weight")].rsplit(".", 1)[-1]
    return name.endswith(".weight") and (module.endswith("_proj") or module in LINEAR_TAILS)


FORMATS = {  # test format name -> the scale kind it writes
    "block": "block",
    "channel_dynamic": "channel",
    "tensor_static": "tensor",
    "channel_weight_only": "channel",
    "autofp8_static": "tensor",
    "autofp8_dynamic": "tensor",
}
# AutoFP8's K / V scale tensors per layer, after model.layers.<i>.self_attn.: (K name, V name)
KV_LAYOUTS = {"k_scale": ("k_scale", "v_scale"), "kv_scale": ("kv_scale", "kv_scale"),
              "output_scale": ("k_proj.output_scale", "v_proj.output_scale")}


def quant_config(fmt: str, ignore=("lm_head",), kv: bool = False) -> dict:
    if fmt == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": list(ignore)}
    if fmt.startswith("autofp8"):  # AutoFP8's save_quantized_model
        q = {"quant_method": "fp8", "activation_scheme": fmt.split("_")[1], "ignored_layers": list(ignore)}
        if kv:
            q["kv_cache_scheme"] = "static"
        return q
    kind = FORMATS[fmt]
    scheme = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": kind,
                                                 "symmetric": True, "dynamic": False}}
    if fmt.endswith("dynamic"):
        scheme["input_activations"] = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                       "dynamic": True}
    elif fmt.endswith("static"):
        scheme["input_activations"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
                                       "dynamic": False}
    q = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
         "config_groups": {"group_0": scheme}, "ignore": list(ignore)}
    if kv:
        q["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                "symmetric": True}
    return q


def write_fp8(src: str, out, fmt: str, ignore=("lm_head",), kv: bool | str = False, seed: int = 0):
    """src (a float checkpoint) -> (the FP8 folder, the dequantized float folder, {name: extra tensors}).
    Ignored modules match as in quantization_config (a name, or a 're:' regex of the full name).
    kv: K / V scales per layer (extra["<i>.k"] / ["<i>.v"]); True: self_attn.k_scale / v_scale, or an
    AutoFP8 layout of KV_LAYOUTS by name."""
    def ignored(module):
        return any(re.match(i[3:], module) if i.startswith("re:") else
                   (module == i or module.endswith("." + i)) for i in ignore)

    kind = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    q_out, deq_out, extra = {}, {}, {}
    for name, w in tensors.items():
        module = name[: -len(".weight")]
        if not _is_linear(name) or ignored(module):
            q_out[name] = deq_out[name] = w
            continue
        q, scale, deq = quantize(w, kind)
        if fmt.startswith("autofp8"):
            scale = scale.reshape(())  # AutoFP8 saves 0-d scales
        q_out[name] = q
        q_out[f"{module}.{'weight_scale_inv' if kind == 'block' else 'weight_scale'}"] = scale
        if fmt.endswith("static"):
            shape = () if fmt.startswith("autofp8") else (1,)
            q_out[f"{module}.input_scale"] = extra[f"{module}.input_scale"] = \
                torch.rand(shape, generator=g) * 0.05 + 0.01
        deq_out[name] = deq.to(w.dtype).contiguous()
    if kv:
        layers = {int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.")}
        k_name, v_name = KV_LAYOUTS["k_scale" if kv is True else kv]
        for i in sorted(layers):
            for s, kv_name in (("k", k_name), ("v", v_name)):
                name = f"model.layers.{i}.self_attn.{kv_name}"
                if name not in q_out:  # one kv_scale serves K and V
                    q_out[name] = torch.rand((), generator=g) * 0.1 + 0.01
                extra[f"{i}.{s}"] = q_out[name]
    cfg = json.load(open(os.path.join(src, "config.json")))
    paths = []
    for sub, state, qcfg in (("fp8", q_out, quant_config(fmt, ignore, kv)), ("deq", deq_out, None)):
        path = out / sub
        path.mkdir(parents=True, exist_ok=True)
        save_file(state, str(path / "model.safetensors"))
        json.dump({**cfg, "quantization_config": qcfg} if qcfg else cfg, open(path / "config.json", "w"))
        for f in os.listdir(src):  # generation config, tokenizer files
            if f not in ("model.safetensors", "config.json"):
                shutil.copy(os.path.join(src, f), path / f)
        paths.append(str(path))
    return paths[0], paths[1], extra
