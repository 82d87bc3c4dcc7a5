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
orig_apply, orig_silu = fl.Fp8Method.apply, fl.Fp8Method.apply_silu


def grab(x):
    if isinstance(x, QuantizedActivation):
        return ("q", x.q[: x.rows].clone(), x.scale[: x.rows].clone(), None if x.x is None else x.x.clone())
    if isinstance(x, torch.Tensor):
        return ("x", x.clone())
    return (type(x).__name__,)


def apply(self, linear, x, bias, kernels):
    rec.append(("apply", grab(x)))
    return orig_apply(self, linear, x, bias, kernels)


def apply_silu(self, linear, x, bias, kernels, quant_group=None):
    rec.append(("silu", grab(x)))
    out = orig_silu(self, linear, x, bias, kernels, quant_group)
    rec.append(("silu_out", grab(out)))
    return out


fl.Fp8Method.apply, fl.Fp8Method.apply_silu = apply, apply_silu
runs = {}
for name, kw in (("fused", {}), ("unfused", dict(fp8_fused_act_quant_per_token=False))):
    rec.clear()
    gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16, kernel_config=KernelConfig(**kw))
    full, steps = _script(3)
    outs = [o.float().cpu() for *_, o in run_scenario(gen, full, steps, block_size=16)]
    runs[name] = (list(rec), outs)
    print(name, len(rec), "calls", flush=True)
(fr, fo), (ur, uo) = runs["fused"], runs["unfused"]
print("logits max |diff|", max(float((a - b).abs().max()) for a, b in zip(fo, uo)))
bad = 0
for i, ((kf, f), (ku, u)) in enumerate(zip(fr, ur)):
    if f[0] == "q" and u[0] == "x":
        qr, sr = quantize_fp8_reference(u[1], u[1].shape[1])
        dq = int((f[1].view(torch.uint8) != qr.view(torch.uint8)).sum())
        ds = float((f[2][:, :1] - sr[:, :1]).abs().max())
        xd = None if f[3] is None else float((f[3].float() - u[1].float()).abs().max())
        if dq or ds or xd:
            bad += 1
            if bad <= 12:
                print(f"call {i} {kf}: rows {u[1].shape}, e4m3 bytes differing {dq}, scale max diff {ds:.3e}, "
                      f"fused x vs unfused x {xd}", flush=True)
    elif f[0] == "x" and u[0] == "x":
        d = float((f[1].float() - u[1].float()).abs().max()) if f[1].shape == u[1].shape else "shape"
        if d:
            bad += 1
            if bad <= 12:
                print(f"call {i} {kf}: bf16 inputs differ by {d} {tuple(f[1].shape)}", flush=True)
    elif f[0] != u[0]:
        print(f"call {i} {kf}: fused {f[0]} unfused {u[0]}", flush=True)
print("calls differing:", bad, "of", len(fr))
