"""Session 42: the bf16 skinny GEMM's tiles on Qwen3-30B-A3B's attention / router shapes (and Llama-3-8B's o) at
8-64 tokens: us a GEMM in a graph of one GEMM per layer (distinct weights), cuBLAS beside, x the bytes floor."""
import itertools, json, os, sys
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from benchmarks.ab_gemv import graph_ms
from benchmarks.bench_forward import copy_bandwidth
import model_wrapper.kernels.gemm as gemm

bw = copy_bandwidth("cuda")
print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
SHAPES = {"q3 qkv": (5120, 2048, 48), "q3 o": (2048, 4096, 48), "q3 router": (128, 2048, 48), "8b o": (4096, 4096, 32),
          "8b qkv": (6144, 4096, 32)}
orig = gemm._skinny_config
rows = []
for name, (N, K, L) in SHAPES.items():
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(L)]
    floor_us = N * K * 2 / bw * 1e6
    for M in (8, 16, 32, 64):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, ws[0])
        cub = graph_ms(lambda: [F.linear(x, w) for w in ws]) * 1e3 / L
        bm = max(16, 1 << (M - 1).bit_length())
        d = orig(bm, N, K)
        res = {"shape": name, "M": M, "N": N, "K": K, "floor_us": floor_us, "cublas_us": cub, "default": d, "tiles": []}
        for cand in [None] + list(itertools.product((16, 32, 64, 128), (128, 256, 512), (3, 4), (4,))):
            if cand is not None and (cand == d or cand[0] > N):
                continue
            gemm._skinny_config = orig if cand is None else (lambda *a, c=cand: c)
            try:
                out = gemm.skinny_gemm(x, ws[0])
                err = float((out.float() - ref.float()).abs().max())
                us = graph_ms(lambda: [gemm.skinny_gemm(x, w) for w in ws]) * 1e3 / L
            except Exception as e:
                us, err = float("inf"), repr(e)[:200]
            res["tiles"].append({"tile": d if cand is None else cand, "default": cand is None, "us": us, "err": err})
        gemm._skinny_config = orig
        best = min(res["tiles"], key=lambda t: t["us"])
        dflt = res["tiles"][0]
        print(f"{name:10s} M={M:3d} floor {floor_us:6.2f} cuBLAS {cub:6.2f} default {tuple(dflt['tile'])} {dflt['us']:6.2f} "
              f"best {tuple(best['tile'])} {best['us']:6.2f} (x{best['us'] / floor_us:.2f})", flush=True)
        rows.append(res)
    del ws
json.dump({"device": torch.cuda.get_device_name(0), "copy_bandwidth_TBps": bw / 1e12, "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "skinny_sweep.json"), "w"), indent=1)
