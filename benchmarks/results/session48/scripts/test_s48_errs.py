"""Session 48 probe (copied into tests/kernels/ on the device): the W8A8 FP8 experts' error, swapped (W a^T,
e4m3 wgmma) and unswapped (mma.sync on fp16), against (a) the float64 W8A8 oracle of the same quantized
operands and (b) the exact float64 product on the dequantized weights (x unquantized), for the shard test's
shapes and the kernel test's; also the oracle's own error against (b). Prints one JSON line per case."""
import dataclasses, json, os
import pytest, torch
from conftest import quantize_fp8_blockwise
from moe_w8a8_oracle import w8a8_experts_reference
from test_moe_kernel import _case
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.moe import fused_moe
from model_wrapper.layers.moe import experts_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
OUT = os.environ.get("OUT", "/tmp")


def deq(q, s):
    cols = torch.arange(q.shape[-1]) // 128
    return q.cpu().double() * s.cpu().double()[..., cols]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(256, 128, 16, 4), (256, 256, 16, 4), (256, 384, 16, 4), (384, 256, 64, 8),
                                   (2048, 768, 128, 8)])
@pytest.mark.parametrize("T", [3, 16, 64, 257])
def test_errs(shape, T):
    H, I, E, k = shape
    rows_out = []
    for seed in range(3):
        x, w, ids, gate_up, down = _case(T, E, k, H, I, torch.bfloat16, DEV, "random", seed=seed)
        (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
        base = KernelConfig(moe_decode_pairs=0, moe_fp8_decode_pairs=0)
        rows = torch.arange(T) if T <= 64 else torch.randperm(T, generator=torch.Generator().manual_seed(0))[:64]
        xs, ws, idss = x[rows].cpu(), w[rows].cpu(), ids[rows].cpu()
        oracle = w8a8_experts_reference(xs, ws, idss, gq, gs, dq, ds).double()
        exact = experts_reference(xs.double(), ws.double(), idss, deq(gq, gs), deq(dq, ds))
        scale = float(exact.abs().max())
        rec = dict(H=H, I=I, E=E, k=k, T=T, seed=seed,
                   oracle_vs_exact=[float((oracle - exact).abs().max()) / scale,
                                    float((oracle - exact).abs().mean()) / scale])
        for name, cfg in (("swap", dataclasses.replace(base, moe_w8a8_swap=True)),
                          ("noswap", dataclasses.replace(base, moe_w8a8_swap=False, moe_tma_small_weights=False)),
                          ("weight_only", dataclasses.replace(base, moe_fp8_w8a8=False))):
            got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)[rows].cpu().double()
            rec[name] = dict(vs_oracle=[float((got - oracle).abs().max()) / scale,
                                        float((got - oracle).abs().mean()) / scale],
                             vs_exact=[float((got - exact).abs().max()) / scale,
                                       float((got - exact).abs().mean()) / scale])
        rows_out.append(rec)
        print(json.dumps(rec))
    with open(os.path.join(OUT, "errs.jsonl"), "a") as f:
        for r in rows_out:
            f.write(json.dumps(r) + "\n")
