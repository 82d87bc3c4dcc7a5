"""ctmoe diagnosis under pytest (the fixtures' environment): err / top-1 by format and by what is quantized."""
import pytest
import torch
from fp8_checkpoints import write_fp8
from test_fp8_checkpoint import _cuda_vs_reference
from test_moe import _cuda_ckpt

ROUTERS = ("lm_head", "mlp.gate", "block_sparse_moe.gate", "shared_expert_gate")
VARIANTS = {"all": ROUTERS, "dense_only": ROUTERS + ("re:.*experts.*",),
            "experts_only": ROUTERS + ("re:.*self_attn.*", "re:.*shared_expert\\..*")}


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_diag(checkpoint_dir, tmp_path, family):
    src = _cuda_ckpt(checkpoint_dir, family)
    for graphs in (False, True):
        deq_any = None
        for fmt in ("block", "channel_dynamic", "tensor_static"):
            for vname, ign in VARIANTS.items():
                if graphs and vname != "all":
                    continue
                try:
                    fp8, deq, _ = write_fp8(src, tmp_path / f"{fmt}_{vname}_{graphs}", fmt, ignore=ign)
                    deq_any = deq
                    _, err, top1 = _cuda_vs_reference(fp8, deq, seed=8, cuda_graphs=graphs)
                    print(f"ROW {family} graphs={graphs} {fmt} {vname}: err {err:.4f} top1 {top1:.3f}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"ROW {family} graphs={graphs} {fmt} {vname}: ERROR {type(e).__name__}: {str(e)[:200]}",
                          flush=True)
        _, err16, top16 = _cuda_vs_reference(deq_any, deq_any, seed=8, cuda_graphs=graphs)
        print(f"ROW {family} graphs={graphs} bf16: err {err16:.4f} top1 {top16:.3f} bound {4 * err16 + 0.1:.4f}",
              flush=True)
