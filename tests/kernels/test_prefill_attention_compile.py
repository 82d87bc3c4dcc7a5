"""The mixed-step prefill attention kernel compiles for Hopper (sm_90) on a machine without a GPU:
bf16 and e4m3 caches, with and without a sliding window, one split and several.

The interpreter (test_prefill_attention.py) runs the kernel's arithmetic but not the compiler, which
refuses some constructs the interpreter accepts; here each variant is compiled ahead of time for the
Llama-3-8B shape (GQA group 4, head_dim 128, pages of 16) with the ptxas that ships with Triton, in a
child process without TRITON_INTERPRET (as tests/kernels/test_fp8_kv_compile.py does for the others).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compile_all() -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from model_wrapper.kernels import prefill_attention, verify_attention

    built = []
    fn = prefill_attention._prefill_kernel
    for fp8 in (False, True):
        cache = "*fp8e4nv" if fp8 else "*bf16"
        for window in (False, True):
            for splits in (1, 4):
                pointers = dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, qo_ptr="*i32", indptr_ptr="*i32",
                                indices_ptr="*i32", last_ptr="*i32", treq_ptr="*i32", ttok_ptr="*i32", tn_ptr="*i32",
                                pos_ptr="*i64", o_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32",
                                vs_ptr="*fp32")
                constexprs = dict(PAGE=16, BLOCK_T=16, GROUP=4, ROWS=64, D=128, BLOCK_N=64, SPLITS=splits,
                                  HAS_WINDOW=window, FP8=fp8)
                sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n == "scale_log2" else "i32")
                       for n in fn.arg_names}
                triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=4, num_stages=2))
                built.append(f"prefill fp8={fp8} window={window} splits={splits}")
    merge = verify_attention._merge_kernel
    sig = {n: "constexpr" if n in ("SPLITS", "SPLITS_PAD", "D") else
           dict(part_ptr="*fp32", lse_ptr="*fp32", o_ptr="*bf16").get(n, "i32") for n in merge.arg_names}
    triton.compile(ASTSource(merge, sig, constexprs=dict(SPLITS=4, SPLITS_PAD=4, D=128)),
                   target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    built.append("merge")
    return built


def test_prefill_attention_compiles_for_sm90():
    triton = pytest.importorskip("triton")
    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")):
        pytest.skip("Triton's NVIDIA backend tools are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(json.loads(run.stdout.strip().splitlines()[-1])) == 9


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
