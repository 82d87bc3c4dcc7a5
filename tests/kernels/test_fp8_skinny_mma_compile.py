"""The W8A8 skinny FP8 kernel (model_wrapper/kernels/fp8_skinny_mma.py) compiles for Hopper (sm_90) on a machine
without a GPU, as fp8_skinny_mma launches it by default (skinny_mma_launch: rows a program, K split, stages) for
Llama-3-8B's and Qwen3-30B-A3B's projections: block weights (a product per 128 columns, K split into parts whose last
program adds them) and a scale a row (products in place), with and without the SiLU epilogue, at token tiles of 16
(and 32 for 17-32 tokens, 64 where a config allows it).

The interpreter (test_fp8_kernels.py) runs the kernel's arithmetic but not the compiler, which refuses some
constructs the interpreter accepts (a module global read inside the kernel, for one); here each launch is
compiled ahead of time with the ptxas that ships with Triton, in a child process without TRITON_INTERPRET, with a
launch's divisibility hints (pointers and strides of these shapes are multiples of 16), and must not spill
registers (cuobjdump's stack frame; built without the hints, 200-680 bytes spill), each at the pipeline depth
fp8_skinny_mma launches it with (skinny_mma_stages), inside the shared memory a Hopper program may have: 5 stages of
64 tokens a scale a row asked for 240 KiB, and the launch failed on an H100 (session 43).

It also reads which tensor-core products each build makes (its SASS): sm90 builds wgmma e4m3 products (QGMMA) for
tiles of 64 rows or more and mma.sync ones (HMMA, on fp16 conversions of both operands) below; session 42's launch
gave Llama-3-8B's qkv, o and down 32-row tiles, which ran their layer at 1.5-2x the bytes' time (session 45). Every
Llama-3-8B projection's default launch is a wgmma one, with its weight tiles through TMA descriptors too
(KernelConfig.fp8_skinny_mma_tma).
"""

from __future__ import annotations

import json
import sys

from sm90_compile import ROOT, compile_sm90, mma_products, run_child, stack_bytes

# (name, N: the weight's rows, K, SiLU epilogue)
SHAPES = (("8b qkv", 6144, 4096, False), ("8b o", 4096, 4096, False), ("8b gate_up", 28672, 4096, True),
          ("8b down", 4096, 14336, False), ("qwen3 qkv", 5120, 2048, False), ("qwen3 o", 2048, 4096, False))


def _compile_all() -> dict[str, list]:
    from model_wrapper.kernels import fp8_skinny_mma
    from model_wrapper.kernels.common import SM90_SHARED_MEMORY
    from model_wrapper.kernels.config import KernelConfig

    cfg = KernelConfig()
    built = {}  # name -> [stack bytes (spilled registers), shared memory bytes, stages, rows, split, products]
    fn = fp8_skinny_mma._fp8_skinny_mma_kernel
    pointers = dict(q_ptr="*fp8e4nv", qs_ptr="*fp32", w_ptr="*fp8e4nv", s_ptr="*fp32", b_ptr="*bf16", o_ptr="*bf16",
                    ws_ptr="*fp32", cnt_ptr="*i32")
    cases = [(name, N, K, silu, fmt, 16) for name, N, K, silu in SHAPES for fmt in ("block", "row")]
    cases += [(name, N, K, silu, fmt, 32) for name, N, K, silu in SHAPES[:4] for fmt in ("row", "block")]  # 17-32
    cases.append(("8b gate_up", 28672, 4096, True, "row", 64))  # (where a config allows 64 tokens: the clamp's case)
    for name, N, K, silu, fmt, M in cases:
        group = 128 if fmt == "block" else K
        launch = fp8_skinny_mma.skinny_mma_launch(M, N // 2 if silu else N, K, group, silu, cfg, SM90_SHARED_MEMORY)
        constexprs = dict(K=K, **launch.constexprs(K, group, silu, False, True, cfg))
        kernel = compile_sm90(fn, pointers, constexprs, aligned=True, num_warps=launch.warps, num_stages=launch.stages)
        key = f"{name} {fmt} x{M}"
        built[key] = [stack_bytes(kernel), kernel.metadata.shared, launch.stages, launch.rows, launch.split,
                      mma_products(kernel)]
        if name.startswith("8b") and M == 16:  # the weight tiles through TMA (KernelConfig.fp8_skinny_mma_tma)
            desc = f"tensordesc<fp8e4nv[{launch.rows}, {128 if group < K else launch.block_k}]>"
            tma = compile_sm90(fn, dict(pointers, w_desc=desc), dict(constexprs, TMA_W=True), aligned=True,
                               num_warps=launch.warps, num_stages=launch.stages)
            built[key + " tma"] = [stack_bytes(tma), tma.metadata.shared, launch.stages, launch.rows, launch.split,
                                   mma_products(tma)]
        if launch.stages < cfg.fp8_skinny_mma_stages:  # what the clamp keeps out: cfg's depth would not fit
            deeper = compile_sm90(fn, pointers, constexprs, aligned=True, num_warps=launch.warps,
                                  num_stages=cfg.fp8_skinny_mma_stages)
            built[key + " unclamped"] = [stack_bytes(deeper), deeper.metadata.shared, cfg.fp8_skinny_mma_stages,
                                         launch.rows, launch.split, None]
    return built


def test_fp8_skinny_mma_compiles_for_sm90():
    from model_wrapper.kernels.common import SM90_SHARED_MEMORY

    built = run_child(__file__, "nvdisasm")
    launched = {name: v for name, v in built.items() if not name.endswith("unclamped")}
    assert len(launched) == 2 * len(SHAPES) + 9 + 8
    assert {name: stack for name, (stack, *_) in launched.items() if stack} == {}  # no spills, 32- / 64-token tiles too
    assert {name: shared for name, (_, shared, *_) in launched.items() if shared > SM90_SHARED_MEMORY} == {}
    # the clamp's case: gate_up at 64 tokens a scale a row, 5 stages of (128 + 64) x 256 bytes, over the limit
    assert built["8b gate_up row x64 unclamped"][1] > SM90_SHARED_MEMORY >= built["8b gate_up row x64"][1]
    # wgmma e4m3 products exactly where a program has 64 rows or more (the compiler's rule the launch follows)
    assert {name: (rows, products) for name, (*_, rows, _, products) in launched.items()
            if (products == "wgmma") != (rows >= 64) or products == "none"} == {}
    # Llama-3-8B: every projection on wgmma; block weights' K split where the row tiles are fewer than 132 (qkv 96
    # tiles in 2 parts, o and down 64 in 3), gate_up's 224 tiles whole; a scale a row never split
    # ... and with TMA weight tiles the same launches (wgmma, no spills: above), within 128 bytes of shared memory
    assert {name: (v[3:], abs(v[1] - launched[name[:-4]][1]) <= 128) for name, v in launched.items()
            if name.endswith(" tma")} == {name + " tma": (launched[name][3:], True) for name in launched
                                          if name.startswith("8b") and name.endswith("x16")}
    assert {name: v[3:] for name, v in launched.items() if name.startswith("8b") and name.endswith("x16")} == {
        "8b qkv block x16": [64, 2, "wgmma"], "8b qkv row x16": [64, 1, "wgmma"],
        "8b o block x16": [64, 3, "wgmma"], "8b o row x16": [64, 1, "wgmma"],
        "8b gate_up block x16": [64, 1, "wgmma"], "8b gate_up row x16": [64, 1, "wgmma"],
        "8b down block x16": [64, 3, "wgmma"], "8b down row x16": [64, 1, "wgmma"]}
    # Qwen3-30B-A3B's o (2048 rows): block weights keep 64-row tiles and split K in 5 parts; a scale a row, unsplit,
    # halves to 32-row mma.sync tiles for 64 programs
    assert launched["qwen3 o block x16"][3:] == [64, 5, "wgmma"]
    assert launched["qwen3 o row x16"][3:] == [32, 1, "mma.sync"]


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
