"""ctmoe diagnosis: FP8 MoE model-level error against fp32 on dequantized weights, by format and by what is quantized."""
import os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import torch
import model_wrapper  # noqa: F401  (before tests/ on the path)
sys.path[:0] = [os.path.join(os.getcwd(), "tests"), os.path.join(os.getcwd(), "tests", "model_wrapper")]
from conftest import make_checkpoint
from fp8_checkpoints import write_fp8
from test_fp8_checkpoint import _cuda_vs_reference

ROUTERS = ("lm_head", "mlp.gate", "block_sparse_moe.gate", "shared_expert_gate")
VARIANTS = {"all": ROUTERS,
            "dense_only": ROUTERS + ("re:.*experts.*",),
            "experts_only": ROUTERS + ("re:.*self_attn.*", "re:.*shared_expert\\..*")}
root = tempfile.mkdtemp()
fams = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3_moe", "qwen2_moe", "mixtral"]
fmts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["block", "channel_dynamic", "tensor_static"]
for fam in fams:
    src = make_checkpoint(os.path.join(root, fam), fam)
    for graphs in (False,):
        deq_any = None
        for fmt in fmts:
            for vname, ign in VARIANTS.items():
                out = os.path.join(root, f"{fam}_{fmt}_{vname}_{graphs}")
                try:
                    fp8, deq, _ = write_fp8(src, Path(out), fmt, ignore=ign)
                    deq_any = deq
                    _, err, top1 = _cuda_vs_reference(fp8, deq, seed=8, cuda_graphs=graphs)
                    print(f"ROW {fam} graphs={graphs} {fmt} {vname}: err {err:.4f} top1 {top1:.3f}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"ROW {fam} graphs={graphs} {fmt} {vname}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        _, err16, top16 = _cuda_vs_reference(deq_any, deq_any, seed=8, cuda_graphs=graphs)
        print(f"ROW {fam} graphs={graphs} bf16: err {err16:.4f} top1 {top16:.3f} bound {4*err16+0.1:.4f}", flush=True)
