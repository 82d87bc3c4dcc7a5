# per-layer error of the W8A8 small tiles, swapped or not, against the float64 oracle (test_fp8_experts_w8a8_cuda's case)
import sys, dataclasses, torch
sys.path.insert(0, "tests/kernels"); sys.path.insert(0, "tests"); sys.path.insert(0, ".")
from test_moe_kernel import _case
from moe_w8a8_oracle import w8a8_experts_reference
from conftest import quantize_fp8_blockwise
from model_wrapper.kernels.moe import fused_moe
from model_wrapper.kernels.config import KernelConfig
for T in (3, 16, 32):
    x, w, ids, gate_up, down = _case(T, 128, 8, 2048, 768, torch.bfloat16, "cuda", "random")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    want = w8a8_experts_reference(x, w, ids, gq, gs, dq, ds).float()
    for name, kw in (("default", {}), ("swap", dict(moe_w8a8_swap=True)), ("swap-tma", dict(moe_w8a8_swap=True, moe_tma_small_weights=True))):
        cfg = KernelConfig(moe_fp8_decode_pairs=0, moe_decode_pairs=0, **kw)
        got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds).float()
        print(f"T={T} {name:9s} max err / max {float((got - want).abs().max() / want.abs().max()):.3e}  mean abs err {float((got - want).abs().mean()):.3e}", flush=True)
