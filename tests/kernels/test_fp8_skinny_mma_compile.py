"""The W8A8 skinny FP8 kernel (model_wrapper/kernels/fp8_skinny_mma.py) compiles for Hopper (sm_90) on a machine
without a GPU: block weights (a product per 128 columns) and a scale a row (products in place), with and without
the SiLU epilogue, at the default K steps and token tiles of 16 (and 32 / 64 for 17-64 tokens), as fp8_skinny_mma
launches it for Llama-3-8B's projections.

The interpreter (test_fp8_kernels.py) runs the kernel's arithmetic but not the compiler, which refuses some
constructs the interpreter accepts (a module global read inside the kernel, for one); here each variant is
compiled ahead of time with the ptxas that ships with Triton, in a child process without TRITON_INTERPRET, with a
launch's divisibility hints (pointers and strides of these shapes are multiples of 16), and must not spill
registers (cuobjdump's stack frame; built without the hints, 200-680 bytes spill).
"""

from __future__ import annotations

import json
import sys

from sm90_compile import ROOT, compile_sm90, run_child, stack_bytes


def _compile_all() -> dict[str, int]:
    from model_wrapper.kernels import fp8_skinny_mma
    from model_wrapper.kernels.config import KernelConfig

    cfg = KernelConfig()
    built = {}  # name -> stack bytes (spilled registers)
    fn = fp8_skinny_mma._fp8_skinny_mma_kernel
    for name, K, group, silu, bm in (("qkv", 4096, 128, False, 16), ("gate_up", 4096, 128, True, 16),
                                     ("down", 14336, 128, False, 16), ("qkv-row", 4096, 4096, False, 16),
                                     ("gate_up-row", 4096, 4096, True, 16), ("down-row", 14336, 14336, False, 16),
                                     ("gate_up-32", 4096, 128, True, 32), ("gate_up-row-64", 4096, 4096, True, 64),
                                     ("down-64", 14336, 128, False, 64)):
        pointers = dict(q_ptr="*fp8e4nv", qs_ptr="*fp32", w_ptr="*fp8e4nv", s_ptr="*fp32", b_ptr="*bf16",
                        o_ptr="*bf16")
        per_group = group < K
        constexprs = dict(K=K, GROUP=group, PER_GROUP=per_group, BM=bm, BLOCK_N=cfg.fp8_skinny_mma_block_n,
                          BLOCK_K=cfg.fp8_skinny_mma_block_k if per_group else cfg.fp8_skinny_mma_row_block_k,
                          HAS_BIAS=False, SILU=silu, PDL=True)
        kernel = compile_sm90(fn, pointers, constexprs, aligned=True, num_warps=cfg.fp8_skinny_mma_warps,
                              num_stages=cfg.fp8_skinny_mma_stages)
        built[name] = stack_bytes(kernel)
    return built


def test_fp8_skinny_mma_compiles_for_sm90():
    built = run_child(__file__, "cuobjdump")
    assert list(built) == ["qkv", "gate_up", "down", "qkv-row", "gate_up-row", "down-row", "gate_up-32",
                           "gate_up-row-64", "down-64"]
    assert {name: stack for name, stack in built.items() if stack} == {}  # no spills, token tiles of 64 included


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
