"""The mixed-step prefill attention kernel compiles for Hopper (sm_90) on a machine without a GPU:
bf16 and e4m3 caches (the e4m3 ones in the q_dtype and fp16_vreg maths), with and without a sliding
window, one split and several.

The interpreter (test_prefill_attention.py) runs the kernel's arithmetic but not the compiler, which
refuses some constructs the interpreter accepts; here each variant is compiled ahead of time for the
Llama-3-8B shape (GQA group 4, head_dim 128, pages of 16) with the ptxas that ships with Triton, in a
child process without TRITON_INTERPRET (as tests/kernels/test_fp8_kv_compile.py does for the others).
"""

from __future__ import annotations

import json
import sys

from sm90_compile import ROOT, compile_sm90, run_child


def _compile_all() -> list[str]:
    from model_wrapper.kernels import prefill_attention, verify_attention

    built = []
    fn = prefill_attention._prefill_kernel
    from model_wrapper.kernels.decode_attention import FP8_MATHS

    # a bf16 cache; an e4m3 cache in q_dtype (prefill_attention.E4M3_MATH) and in fp16_vreg
    for fp8, math in ((False, "q_dtype"), (True, "q_dtype"), (True, "fp16_vreg")):
        cache = "*fp8e4nv" if fp8 else "*bf16"
        for window in (False, True):
            for splits in (1, 4):
                pointers = dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, qo_ptr="*i32", indptr_ptr="*i32",
                                indices_ptr="*i32", last_ptr="*i32", treq_ptr="*i32", ttok_ptr="*i32", tn_ptr="*i32",
                                pos_ptr="*i64", o_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32",
                                vs_ptr="*fp32")
                constexprs = dict(PAGE=16, BLOCK_T=16, GROUP=4, ROWS=64, D=128, BLOCK_N=64, SPLITS=splits,
                                  HAS_WINDOW=window, FP8=fp8, MATH=FP8_MATHS[math] if fp8 else 0, INTERPRET=False)
                compile_sm90(fn, pointers, constexprs, scalars=("scale_log2",), num_warps=4, num_stages=2)
                built.append(f"prefill fp8={fp8} math={math} window={window} splits={splits}")
    merge = verify_attention._merge_kernel
    compile_sm90(merge, dict(part_ptr="*fp32", lse_ptr="*fp32", o_ptr="*bf16"), dict(SPLITS=4, SPLITS_PAD=4, D=128),
                 num_warps=4)
    built.append("merge")
    return built


def test_prefill_attention_compiles_for_sm90():
    assert len(run_child(__file__)) == 13


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
