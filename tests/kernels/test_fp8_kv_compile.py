"""The K/V store and decode-attention kernels compile for Hopper (sm_90) with e4m3 and bf16 caches, on a
machine without a GPU.

The decode kernel is built for each way it turns e4m3 into tensor-core operands (fp8_math, the PTX of
the "_vreg" ones included). The interpreter (test_kv_store.py, test_decode_attention.py) runs the kernels' arithmetic but not the
compiler: a construct it accepts and the compiler refuses showed only on a GPU (a @triton.jit helper whose
constexpr branches returned different types). Each kernel is compiled ahead of time for the Llama-3-8B
shapes, with the ptxas that ships with Triton, in a child process without TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import sys

from sm90_compile import ROOT, compile_sm90, run_child


def _compile_all() -> list[str]:
    from model_wrapper.kernels import decode_attention, kv_store

    built = []

    def build(name, fn, pointers, constexprs, scalars=()):
        compile_sm90(fn, pointers, constexprs, scalars, num_warps=4, num_stages=2)
        built.append(name)

    for fp8 in (False, True):
        cache = "*fp8e4nv" if fp8 else "*bf16"
        tag = "e4m3" if fp8 else "bf16"
        build(f"store {tag}", kv_store._store_kv_kernel,
              dict(k_ptr="*bf16", v_ptr="*bf16", kc_ptr=cache, vc_ptr=cache, slot_ptr="*i64", ks_ptr="*fp32",
                   vs_ptr="*fp32"), dict(BLOCK=1024, FP8=fp8))
        for qk_norm in (False, True):  # Qwen3's q / k norms in the kernel
            build(f"rope store {tag}{' qk-norm' if qk_norm else ''}", kv_store._rope_store_kernel,
                  dict(qkv_ptr="*bf16", pos_ptr="*i64", cs_ptr="*fp32", kc_ptr=cache, vc_ptr=cache, slot_ptr="*i64",
                       ks_ptr="*fp32", vs_ptr="*fp32", s_ptr="*bf16", bq_ptr="*bf16", bk_ptr="*bf16", bv_ptr="*bf16",
                       rank_ptr="*i32", lslot_ptr="*i32", ss_ptr="*fp32", qn_ptr="*bf16", kn_ptr="*bf16"),
                  dict(R=16, HQ=32, HK=8, D=128, LORA=False, BLOCK_R=16, RPAD=16, NUM_SPLITS=1, PDL=False,
                       SCALED=False, NB=1, FP8=fp8, QK_NORM=qk_norm), scalars=("inv_n", "eps", "qk_eps"))
        for math_name, math_id in (decode_attention.FP8_MATHS.items() if fp8 else [("", 0)]):
            build(f"decode {tag} {math_name}".strip(), decode_attention._decode_kernel,
                  dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, indptr_ptr="*i32", indices_ptr="*i32", last_ptr="*i32",
                       o_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32", vs_ptr="*fp32"),
                  dict(PAGE=16, GROUP=4, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=4, FP8=fp8, MATH=math_id, INTERPRET=False,
                       PDL=True, PF_LINES=0),
                  scalars=("scale_log2",))
        # the graphs' launch at batch 1-2: metadata read and the first K / V tile prefetched into L2 before the wait
        build(f"decode {tag} prefetch", decode_attention._decode_kernel,
              dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, indptr_ptr="*i32", indices_ptr="*i32", last_ptr="*i32",
                   o_ptr="*bf16", part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32", vs_ptr="*fp32"),
              dict(PAGE=16, GROUP=4, GROUP_PAD=16, D=128, BLOCK_N=64, SPLITS=16, FP8=fp8, MATH=3 if fp8 else 0,
                   INTERPRET=False, PDL=True, PF_LINES=1 if fp8 else 2),
              scalars=("scale_log2",))
    return built


def test_kv_store_and_decode_kernels_compile_for_sm90_with_e4m3_and_bf16_caches():
    built = run_child(__file__)
    from model_wrapper.kernels.decode_attention import FP8_MATHS

    assert len(built) == 9 + len(FP8_MATHS)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
