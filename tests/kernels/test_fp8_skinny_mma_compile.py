"""The W8A8 skinny FP8 kernel (model_wrapper/kernels/fp8_skinny_mma.py) compiles for Hopper (sm_90) on a machine
without a GPU: block weights (a product per 128 columns) and a scale a row (products in place), with and without
the SiLU epilogue, with K split (the last program of a row tile adding the parts), at the default K steps and token tiles of 16 (and 32 / 64 for 17-64 tokens), as fp8_skinny_mma
launches it for Llama-3-8B's projections.

The interpreter (test_fp8_kernels.py) runs the kernel's arithmetic but not the compiler, which refuses some
constructs the interpreter accepts (a module global read inside the kernel, for one); here each variant is
compiled ahead of time with the ptxas that ships with Triton, in a child process without TRITON_INTERPRET, with a
launch's divisibility hints (pointers and strides of these shapes are multiples of 16), and must not spill
registers (cuobjdump's stack frame; built without the hints, 200-680 bytes spill), each at the pipeline depth
fp8_skinny_mma launches it with (skinny_mma_stages), inside the shared memory a Hopper program may have: 5 stages of
64 tokens a scale a row asked for 240 KiB, and the launch failed on an H100 (session 43).
"""

from __future__ import annotations

import json
import sys

from sm90_compile import ROOT, compile_sm90, run_child, stack_bytes


def _compile_all() -> dict[str, list[int]]:
    from model_wrapper.kernels import fp8_skinny_mma
    from model_wrapper.kernels.common import SM90_SHARED_MEMORY
    from model_wrapper.kernels.config import KernelConfig

    cfg = KernelConfig()
    built = {}  # name -> [stack bytes (spilled registers), shared memory bytes, stages]
    fn = fp8_skinny_mma._fp8_skinny_mma_kernel
    for name, K, group, silu, bm in (("qkv", 4096, 128, False, 16), ("gate_up", 4096, 128, True, 16),
                                     ("down", 14336, 128, False, 16), ("qkv-row", 4096, 4096, False, 16),
                                     ("gate_up-row", 4096, 4096, True, 16), ("down-row", 14336, 14336, False, 16),
                                     ("gate_up-32", 4096, 128, True, 32), ("gate_up-row-64", 4096, 4096, True, 64),
                                     ("down-64", 14336, 128, False, 64), ("down-split", 14336, 128, False, 16),
                                     ("qkv-split", 4096, 128, False, 16), ("gate_up-split", 4096, 128, True, 16)):
        pointers = dict(q_ptr="*fp8e4nv", qs_ptr="*fp32", w_ptr="*fp8e4nv", s_ptr="*fp32", b_ptr="*bf16",
                        o_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32")
        per_group = group < K
        block_k = cfg.fp8_skinny_mma_block_k if per_group else cfg.fp8_skinny_mma_row_block_k
        # the split launches: Llama-3-8B's row tiles (64 rows; gate_up 64 + 64) with K split as split_k does it
        block_n = 64 if name in ("down-split", "qkv-split") else cfg.fp8_skinny_mma_block_n
        split, split_cols = (fp8_skinny_mma.split_k(4096 // 64 if name != "qkv-split" else 6144 // 64, K, block_k, cfg)
                             if name.endswith("split") and name != "gate_up-split" else
                             ((2, K // 2) if name == "gate_up-split" else (1, 0)))
        constexprs = dict(K=K, GROUP=group, PER_GROUP=per_group, BM=bm, BLOCK_N=block_n,
                          BLOCK_K=block_k, HAS_BIAS=False, SILU=silu, PDL=True,
                          SCALES_AHEAD=cfg.fp8_skinny_mma_scales_ahead, SPLIT=split, SPLIT_COLS=split_cols)
        stages = fp8_skinny_mma.skinny_mma_stages(cfg, block_n, bm, block_k, SM90_SHARED_MEMORY)
        kernel = compile_sm90(fn, pointers, constexprs, aligned=True, num_warps=cfg.fp8_skinny_mma_warps,
                              num_stages=stages)
        built[name] = [stack_bytes(kernel), kernel.metadata.shared, stages, split]
        if stages < cfg.fp8_skinny_mma_stages:  # what the clamp keeps out: cfg's depth would not fit
            deeper = compile_sm90(fn, pointers, constexprs, aligned=True, num_warps=cfg.fp8_skinny_mma_warps,
                                  num_stages=cfg.fp8_skinny_mma_stages)
            built[name + " unclamped"] = [stack_bytes(deeper), deeper.metadata.shared, cfg.fp8_skinny_mma_stages, split]
    return built


def test_fp8_skinny_mma_compiles_for_sm90():
    from model_wrapper.kernels.common import SM90_SHARED_MEMORY

    built = run_child(__file__, "cuobjdump")
    launched = {name: v for name, v in built.items() if not name.endswith("unclamped")}
    assert list(launched) == ["qkv", "gate_up", "down", "qkv-row", "gate_up-row", "down-row", "gate_up-32",
                              "gate_up-row-64", "down-64", "down-split", "qkv-split", "gate_up-split"]
    assert {name: stack for name, (stack, *_) in launched.items() if stack} == {}  # no spills, 64-token tiles too
    assert {name: shared for name, (_, shared, *_) in launched.items() if shared > SM90_SHARED_MEMORY} == {}
    # K split as the default launches it: down (64 tiles) in 3 parts, qkv (96 tiles) in 2
    assert [built[n][3] for n in ("down-split", "qkv-split", "gate_up-split", "down")] == [3, 2, 2, 1]
    # the clamp's case: gate_up at 64 tokens a scale a row, 5 stages of (128 + 64) x 256 bytes, over the limit
    assert built["gate_up-row-64 unclamped"][1] > SM90_SHARED_MEMORY >= built["gate_up-row-64"][1]


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
