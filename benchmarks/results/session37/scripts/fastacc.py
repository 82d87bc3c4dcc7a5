"""Probe: test_fp8_checkpoint's channel / tensor / block bounds with fp8_fast_accum off and on, numbers printed."""
import sys, tempfile, pathlib, dataclasses
import os; sys.path.insert(0, os.getcwd())
import model_wrapper  # before tests/ joins sys.path (tests/model_wrapper would shadow the package)
sys.path.append("tests"); sys.path.append("tests/model_wrapper")
import torch
from model_wrapper import KernelConfig
import test_fp8_checkpoint as T
from fp8_checkpoints import write_fp8
from conftest import make_checkpoint

root = pathlib.Path(tempfile.mkdtemp())
wide = make_checkpoint(root / "wide", "llama", hidden_size=256, intermediate_size=320,
                       num_attention_heads=4, num_key_value_heads=2)
for fmt in ("channel_dynamic", "tensor_static", "block"):
    d = root / fmt; d.mkdir()
    fp8, deq, _ = write_fp8(wide, d, fmt, ignore=())
    for graphs in (False, True):
        _, err16, top16 = T._cuda_vs_reference(deq, deq, seed=3, cuda_graphs=graphs)
        for fast in (False, True):
            kc = dataclasses.replace(KernelConfig(), fp8_fast_accum=fast)
            _, err, top1 = T._cuda_vs_reference(fp8, deq, seed=3, cuda_graphs=graphs, kernel_config=kc)
            ok = err <= 4 * err16 + 0.1 and top1 >= top16 - 0.2
            print(f"{fmt:16s} graphs={graphs!s:5s} fast={fast!s:5s} err={err:.4f} (bound {4*err16+0.1:.4f}) "
                  f"top1={top1:.3f} (bound {top16-0.2:.3f}) bf16 err={err16:.4f} top1={top16:.3f} {'ok' if ok else 'FAIL'}",
                  flush=True)
