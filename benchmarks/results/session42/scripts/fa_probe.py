"""Session 42: fast accumulation (KernelConfig.fp8_fast_accum) against the test's bounds, several seeds and formats:
err / top-1 of FP8 against fp32 on the dequantized weights beside bf16's own, accumulation off and on."""
import json, os, sys, tempfile
from pathlib import Path
sys.path[:0] = [os.getcwd(), "tests", "tests/model_wrapper"]
import torch
from conftest import make_checkpoint
from fp8_checkpoints import write_fp8
from test_fp8_checkpoint import _cuda_vs_reference
from model_wrapper.kernels import KernelConfig

out = []
root = Path(tempfile.mkdtemp())
wide = make_checkpoint(root / "wide", "llama", hidden_size=256, intermediate_size=320,
                       num_attention_heads=4, num_key_value_heads=2)
for fmt in ("channel_dynamic", "tensor_static", "autofp8_dynamic", "block"):
    fp8, deq, _ = write_fp8(wide, root / fmt, fmt, ignore=())
    for seed in (3, 4):
        for graphs in (False, True):
            _, e16, t16 = _cuda_vs_reference(deq, deq, seed=seed, cuda_graphs=graphs)
            row = dict(fmt=fmt, seed=seed, graphs=graphs, err16=e16, top1_16=t16)
            for name, kw in (("off", dict(fp8_fast_accum=False)), ("fast", dict(fp8_fast_accum=True)),
                             ("off_unfused", dict(fp8_fast_accum=False, fp8_fused_act_quant_per_token=False))):
                _, e, t = _cuda_vs_reference(fp8, deq, seed=seed, cuda_graphs=graphs, kernel_config=KernelConfig(**kw))
                ok = e <= 4 * e16 + 0.1 and t >= t16 - 0.2
                row[name] = dict(err=e, top1=t, within=ok)
            out.append(row)
            print(json.dumps(row), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fa_probe.json"), "w"), indent=1)
