# ctmoe: 1 GPU, about 3-4 minutes (each step has its own timeout). Branch h/s37-ctmoe: compressed-tensors FP8
# MoE experts (per-channel / per-tensor weight scales) kept e4m3 on CUDA, scales expanded to [E, N, ceil(K/128)].
# Steps: (1) the new CUDA tests (Qwen3-MoE / Qwen2-MoE / Mixtral channel_dynamic + tensor_static, eager and
# graphs, within the FP8 bounds; the fused kernels on expanded scales), (2) the existing FP8 / MoE CUDA tests
# (regression), (3) a per-layer expert timing at the Qwen3-30B-A3B shape (E 128, H 2048, I 768, top 8):
# bf16 experts vs e4m3 with block scales vs e4m3 with channel scales expanded (same kernels, should be equal).
mkdir -p $OUT/ctmoe
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/model_wrapper/test_moe_fp8_formats.py \
  2>&1 | tail -30 | tee $OUT/ctmoe/new_tests.log
timeout 180 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_fp8_checkpoint.py \
  tests/model_wrapper/test_moe_fp8_shards.py -k "moe or experts or keeps_fp8 or rank_slices" \
  2>&1 | tail -15 | tee $OUT/ctmoe/regression.log
cat > $OUT/ctmoe/micro.py <<'PYEOF'
import json, os, torch
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.moe import fused_moe
from model_wrapper.layers.moe import MoESpec, route
E, H, K, I = 128, 2048, 8, 768
dev, dt, cfg = "cuda", torch.bfloat16, KernelConfig()
g = torch.Generator().manual_seed(0)
gu = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
dn = torch.randn(E, H, I, generator=g) * I ** -0.5
def q(w, kind):
    G = -(-w.shape[-1] // 128)
    if kind == "block":
        pad = torch.nn.functional.pad(w, (0, G * 128 - w.shape[-1])).unflatten(-1, (G, 128))
        s = pad.abs().amax(-1).clamp(min=1e-8) / 448.0
        return (pad / s[..., None]).flatten(-2)[..., :w.shape[-1]].to(torch.float8_e4m3fn).to(dev), s.to(dev)
    s = w.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 448.0
    return (w / s).to(torch.float8_e4m3fn).to(dev), s.expand(*w.shape[:-1], G).contiguous().to(dev)
variants = {"bf16": dict(gate_up=gu.to(dt).to(dev), down=dn.to(dt).to(dev))}
for kind in ("block", "channel"):
    (a, sa), (b, sb) = q(gu, kind), q(dn, kind)
    variants[f"fp8_{kind}"] = dict(gate_up=a, down=b, gate_up_scale=sa, down_scale=sb)
res = {}
for name, w in variants.items():
    for T in (1, 8, 32, 128):
        gg = torch.Generator().manual_seed(T)
        x = torch.randn(T, H, generator=gg).to(dt).to(dev)
        rw, ids = route(torch.randn(T, E, generator=gg).to(dt).to(dev), MoESpec(E, K, I, True))
        call = lambda: fused_moe(x, rw, ids, w["gate_up"], w["down"], cfg, w.get("gate_up_scale"), w.get("down_scale"))
        call(); torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                call()
        times = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graph.replay(); b.record(); torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1000 / 20)
        times.sort()
        res[f"{name}/T{T}"] = times[len(times) // 2]
        print(f"{name:14s} T={T:4d} {res[f'{name}/T{T}']:8.2f} us/layer", flush=True)
    nbytes = sum(t.numel() * t.element_size() for t in w.values())
    print(f"{name:14s} expert bytes per layer {nbytes / 2**20:8.1f} MiB", flush=True)
json.dump(res, open(os.environ["MICRO_OUT"], "w"), indent=1)
PYEOF
MICRO_OUT=$OUT/ctmoe/micro.json PYTHONPATH=$PWD:$PYTHONPATH timeout 120 python3 $OUT/ctmoe/micro.py 2>&1 \
  | grep -v Warning | tee $OUT/ctmoe/micro.log
