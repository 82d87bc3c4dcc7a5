"""Session 42: per-token fused activation quantization against the unfused path, call by call, on the tiny
channel_dynamic model (the fused producers' e4m3 + scales against quantize_fp8_reference of the unfused rows)."""
import os, sys, tempfile
from pathlib import Path
sys.path[:0] = [os.getcwd(), "tests", "tests/model_wrapper"]
import torch
from conftest import make_checkpoint
from fp8_checkpoints import write_fp8
from test_forward_parity import _script, run_scenario
from model_wrapper.kernels import KernelConfig
from model_wrapper.kernels.fp8_reference import QuantizedActivation, quantize_fp8_reference
from model_wrapper.layers import fp8_linear as fl
from text_generator import TextGenerator

root = Path(tempfile.mkdtemp())
wide = make_checkpoint(root / "wide", "llama", hidden_size=256, intermediate_size=320, num_attention_heads=4,
                       num_key_value_heads=2)
fp8, deq, _ = write_fp8(wide, root / "ch", "channel_dynamic", ignore=())
rec = []
import model_wrapper.kernels.fp8 as k8
orig_mm = k8._rowwise_mm


def mm(a, a_s, M, weight, weight_scale, bias, out_dtype, cfg):
    y = orig_mm(a, a_s, M, weight, weight_scale, bias, out_dtype, cfg)
    rec.append((a[:M].view(torch.uint8).clone(), a_s[:M].clone(), y.clone(), tuple(a.shape), a.stride(), a_s.stride()))
    return y


k8._rowwise_mm = mm
runs = {}
for name, kw in (("fused", {}), ("unfused", dict(fp8_fused_act_quant_per_token=False))):
    rec.clear()
    gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16, kernel_config=KernelConfig(**kw))
    full, steps = _script(3)
    outs = [o.float().cpu() for *_, o in run_scenario(gen, full, steps, block_size=16)]
    runs[name] = (list(rec), outs)
    print(name, len(rec), "row-wise GEMM calls", flush=True)
(fr, fo), (ur, uo) = runs["fused"], runs["unfused"]
print("logits max |diff|", max(float((a - b).abs().max()) for a, b in zip(fo, uo)))
shown = 0
for i, (f, u) in enumerate(zip(fr, ur)):
    if f[0].shape != u[0].shape:
        print(f"call {i}: shapes {f[0].shape} / {u[0].shape}"); break
    dq = int((f[0] != u[0]).sum())
    ds = float((f[1] - u[1]).abs().max())
    dy = float((f[2].float() - u[2].float()).abs().max())
    if (dq or ds or dy) and shown < 15:
        shown += 1
        print(f"call {i}: M={f[0].shape[0]} K={f[0].shape[1]} e4m3 differing {dq}, scale diff {ds:.3e}, output diff {dy:.3e}; "
              f"a {f[3]} {f[4]} / {u[3]} {u[4]}; a_s strides {f[5]} / {u[5]}", flush=True)
print("done")
