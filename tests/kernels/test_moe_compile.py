"""The MoE kernels compile for Hopper (sm_90) without spilling, on a machine without a GPU.

Triton's interpreter (test_moe_kernel.py) runs the kernels' arithmetic but not the compiler: a construct the
interpreter accepts and the compiler refuses, or a tile too large for the registers, shows only on a GPU.
Here each kernel is compiled ahead of time as its host function launches it for Qwen3-30B-A3B under the
default KernelConfig (pointers and strides divisible by 16, as Triton specializes them at launch), with the
ptxas that ships with Triton, and its resource use read back with cuobjdump: no stack (spilled registers).
The compiler runs in a child process: in this one the kernels may already be interpreted functions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from sm90_compile import ROOT, mma_products, run_child


def _compile_all() -> dict:
    """-> {"stacks": {kernel case: stack bytes}, "loads": {gate_up GEMV case: [16-byte loads before the first
    FMA, all of them, the tile's and x's]}}, compiling every case (run in a process without TRITON_INTERPRET)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from model_wrapper.kernels import moe, moe_align, moe_decode, moe_gemv, moe_route
    from model_wrapper.kernels.config import KernelConfig

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cfg = KernelConfig()
    stacks, loads, products = {}, {}, {}

    def build(name, fn, pointers, constexprs, num_warps, num_stages):
        constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
        sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n == "eps" else "i32")
               for n in fn.arg_names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                   if n not in constexprs and not sig[n].startswith("tensordesc")
                   and (n in pointers or n.startswith("stride") or n in ("N", "K", "I", "H"))}
        kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=aligned),
                                target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                                num_stages=num_stages))
        if " w8a8" in name:  # the tensor-core products: wgmma or mma.sync
            products[name] = mma_products(kernel)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                                   text=True, check=True).stdout
            stacks[name] = int(re.search(r"STACK:(\d+)", usage).group(1))
            if name.startswith("gemv gate_up"):  # 16-byte loads issued before the first product
                sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", f.name], capture_output=True,
                                      text=True, check=True).stdout
                first = sass.find("FFMA")
                lane_bytes = 16 * 32 * num_warps  # a 16-byte load by every thread of the program
                loads[name] = [sass.count("LDG.E.128", 0, first), sass.count("LDG.E.128"),
                               constexprs["BLOCK_N"] * 2 * 2048 * (1 if constexprs["FP8"] else 2) // lane_bytes
                               + max(1, 2048 * 2 // lane_bytes)]

    for fp8 in (False, True):
        dt = "fp8" if fp8 else "bf16"
        weights = dict(w_ptr="*fp8e4nv" if fp8 else "*bf16", s_ptr="*fp32" if fp8 else "*bf16")
        wide = 2 if fp8 else 1  # FP8 decode tiles span twice the columns (moe_decode)
        tile, down_tile = (cfg.moe_fp8_gemv_tile, cfg.moe_fp8_gemv_down_tile) if fp8 else (cfg.moe_gemv_tile,
                                                                                          cfg.moe_gemv_down_tile)
        launch = (cfg.moe_decode_warps, cfg.moe_decode_stages)
        build(f"decode gate_up {dt}", moe_decode._gate_up_kernel,
              dict(x_ptr="*bf16", ids_ptr="*i64", act_ptr="*bf16", **weights),
              dict(TOP_K=8, FP8=fp8, GROUP=128, BLOCK_N=cfg.moe_decode_block_n,
                   BLOCK_K=cfg.moe_decode_block_k * wide), *launch)
        build(f"decode down {dt}", moe_decode._down_kernel,
              dict(act_ptr="*bf16", ids_ptr="*i64", rw_ptr="*bf16", y_ptr="*bf16", **weights),
              dict(TOP_K=8, KP=8, FP8=fp8, GROUP=128, BLOCK_N=cfg.moe_decode_down_block_n,
                   BLOCK_K=cfg.moe_decode_down_block_k * wide), *launch)
        gemv_launch = (cfg.moe_gemv_warps, 1)
        block_n = tile // (2 * 2048)  # kernels/moe_gemv.moe_gemv's row counts
        block_n_down = down_tile // (8 * 1024)
        for packed in (True, False) if fp8 else (False,):  # FP8: the packed rounding (default) and Triton's
            case = "" if not fp8 or packed == cfg.moe_fp8_packed_round else f" packed={packed}"
            build(f"gemv gate_up {dt}{case}", moe_gemv._gate_up_gemv_kernel,
                  dict(x_ptr="*bf16", ids_ptr="*i64", act_ptr="*bf16", **weights),
                  dict(TOP_K=8, KP=2048, FP8=fp8, GROUP=128, BLOCK_N=block_n, PDL=True,
                       LOADS_FIRST=cfg.moe_gemv_loads_first and not fp8, PACKED=packed), *gemv_launch)
            build(f"gemv down {dt}{case}", moe_gemv._down_gemv_kernel,
                  dict(act_ptr="*bf16", ids_ptr="*i64", rw_ptr="*bf16", y_ptr="*bf16", **weights),
                  dict(TOP_K=8, SLOTS=8, KP=1024, FP8=fp8, GROUP=128, BLOCK_N=block_n_down, PDL=True, PACKED=packed),
                  *gemv_launch)
        for tile_d in (16384, 32768) if fp8 else ():  # FP8 tiles kept e4m3 (moe_fp8_direct; default 16k)
            build(f"gemv gate_up {dt} direct {tile_d}", moe_gemv._gate_up_gemv_kernel,
                  dict(x_ptr="*bf16", ids_ptr="*i64", act_ptr="*bf16", **weights),
                  dict(TOP_K=8, KP=2048, FP8=fp8, GROUP=128, BLOCK_N=tile_d // (2 * 2048), PDL=True,
                       LOADS_FIRST=cfg.moe_gemv_loads_first, PACKED=False, DIRECT=True), *gemv_launch)
            build(f"gemv down {dt} direct {tile_d}", moe_gemv._down_gemv_kernel,
                  dict(act_ptr="*bf16", ids_ptr="*i64", rw_ptr="*bf16", y_ptr="*bf16", **weights),
                  dict(TOP_K=8, SLOTS=8, KP=1024, FP8=fp8, GROUP=128, BLOCK_N=tile_d // (8 * 1024), PDL=True,
                       PACKED=False, DIRECT=True), *gemv_launch)
        if not fp8:  # the 16-bit GEMVs at 2+ tokens' warp count (moe_gemv_multi_warps)
            w = cfg.moe_gemv_multi_warps
            build(f"gemv gate_up {dt} w{w}", moe_gemv._gate_up_gemv_kernel,
                  dict(x_ptr="*bf16", ids_ptr="*i64", act_ptr="*bf16", **weights),
                  dict(TOP_K=8, KP=2048, FP8=fp8, GROUP=128, BLOCK_N=block_n, PDL=True,
                       LOADS_FIRST=cfg.moe_gemv_loads_first, PACKED=False), w, 1)
            build(f"gemv down {dt} w{w}", moe_gemv._down_gemv_kernel,
                  dict(act_ptr="*bf16", ids_ptr="*i64", rw_ptr="*bf16", y_ptr="*bf16", **weights),
                  dict(TOP_K=8, SLOTS=8, KP=1024, FP8=fp8, GROUP=128, BLOCK_N=block_n_down, PDL=True, PACKED=False),
                  w, 1)
        if fp8:  # the direct GEMVs at 2+ tokens' warp count (moe_fp8_direct_multi_warps; 1 token: gemv_launch)
            other = cfg.moe_fp8_direct_multi_warps
            tile_d, down_d = cfg.moe_fp8_direct_tile, cfg.moe_fp8_direct_down_tile
            build(f"gemv gate_up {dt} direct w{other}", moe_gemv._gate_up_gemv_kernel,
                  dict(x_ptr="*bf16", ids_ptr="*i64", act_ptr="*bf16", **weights),
                  dict(TOP_K=8, KP=2048, FP8=fp8, GROUP=128, BLOCK_N=tile_d // (2 * 2048), PDL=True,
                       LOADS_FIRST=cfg.moe_gemv_loads_first, PACKED=False, DIRECT=True), other, 1)
            build(f"gemv down {dt} direct w{other}", moe_gemv._down_gemv_kernel,
                  dict(act_ptr="*bf16", ids_ptr="*i64", rw_ptr="*bf16", y_ptr="*bf16", **weights),
                  dict(TOP_K=8, SLOTS=8, KP=1024, FP8=fp8, GROUP=128, BLOCK_N=down_d // (8 * 1024), PDL=True,
                       PACKED=False, DIRECT=True), other, 1)
        for pre, pairs in (("moe_", 1), ("moe_large_", cfg.moe_small_pairs + 1)):
            for silu in (True, False):
                for w8a8 in (False, True) if fp8 else (False,):  # FP8: weight-only, and KernelConfig.moe_fp8_w8a8
                    bm, bn, bk, warps, stages = moe.grouped_tile(cfg, pairs, fp8, w8a8)
                    # also with the weights through TMA descriptors (KernelConfig.moe_tma_weights, _small_weights);
                    # W8A8's small tiles also as W a^T (KernelConfig.moe_w8a8_swap)
                    for tma in (False, True):
                        for swap in (False, True) if w8a8 and pre == "moe_" else (False,):
                            desc = dict(w_desc=f"tensordesc<{'fp8e4nv' if fp8 else 'bf16'}[{bn}, {bk}]>") if tma else {}
                            build(f"grouped {pre}{'gate_up' if silu else 'down'} {dt}{' w8a8' if w8a8 else ''}"
                                  f"{' tma' if tma else ''}{' swap' if swap else ''}", moe._moe_gemm_kernel,
                                  dict(a_ptr="*fp8e4nv" if w8a8 else "*bf16", as_ptr="*fp32" if w8a8 else "*bf16",
                                       o_ptr="*bf16", pairs_ptr="*i32", block_expert_ptr="*i32", rw_ptr="*bf16",
                                       **weights, **desc),
                                  dict(TOP_K=8, SILU=silu, WEIGHTED=not silu, FP8=fp8, W8A8=w8a8, GROUP=128,
                                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=True, TMA_W=tma, SWAP=swap), warps,
                                  stages)
    for sort in (False, True):  # the [E, E] rank and the bitonic top-k (KernelConfig.moe_route_sort)
        tag = " sort" if sort else ""
        build("route" + tag, moe_route._route_kernel, dict(logits_ptr="*bf16", w_ptr="*bf16", ids_ptr="*i64"),
              dict(TOP_K=8, KP=8, EP=128, RENORM=True, PDL=True, SORT=sort), cfg.moe_route_warps, 1)
        for m in (1, 2):  # the router's projection and the routing in one (moe_route.moe_router_route); with the
            # sort also with the add + RMSNorm prologue (moe_route.moe_router_route_norm)
            for norm in (False, True) if sort else (False,):
                build(f"router + route x{m}{tag}{' norm' if norm else ''}", moe_route._router_route_kernel,
                      dict(x_ptr="*bf16", g_ptr="*bf16", logits_ptr="*bf16", w_ptr="*bf16", ids_ptr="*i64",
                           count_ptr="*i32", r_ptr="*bf16", nw_ptr="*bf16", ro_ptr="*bf16", xn_ptr="*bf16"),
                      dict(M=m, HP=2048, BLOCK_E=cfg.gemv_tile // 2048, TOP_K=8, KP=8, EP=128, RENORM=True, PDL=True,
                           SORT=sort, NORM=norm), cfg.gemv_warps, 1)
    pointers = dict(ids_ptr="*i64", counts_ptr="*i32", pairs_ptr="*i32", block_expert_ptr="*i32")
    for tag, chunk in (("", cfg.moe_align_chunk), (" decode", cfg.moe_align_small_chunk)):
        build(f"align count{tag}", moe_align._count_kernel, pointers, dict(EP=128, CHUNK=chunk, PDL=True), 4, 3)
        build(f"align scatter{tag}", moe_align._scatter_kernel, pointers,
              dict(EP=128, CHUNK=chunk, CHUNK_TILE=32, BLOCK_TILE=64, BLOCK_M=cfg.moe_block_m, PDL=True), 4, 3)
    build("sum over k", moe._sum_k_kernel, dict(out_ptr="*bf16", y_ptr="*bf16"),
          dict(TOP_K=8, KP=8, BLOCK_N=cfg.moe_sum_block, PDL=True), 4, 1)
    return dict(stacks=stacks, loads=loads, products=products)


@pytest.fixture(scope="module")
def built():
    return run_child(__file__, "cuobjdump")


def test_every_moe_kernel_compiles_for_sm90_without_spills(built):
    stacks = built["stacks"]
    assert len(stacks) == 59
    assert {name: s for name, s in stacks.items() if s} == {}


def test_w8a8_small_tiles_take_wgmma_products_swapped(built):
    """The W8A8 grouped GEMM's small tiles (16 pairs x 64 weight rows) build mma.sync products on fp16 conversions
    of both e4m3 operands; swapped (KernelConfig.moe_w8a8_swap: W a^T, the 64 weight rows on the M side) wgmma e4m3
    ones, with pointer loads or TMA weight tiles. The prefill tiles (64 x 64) are wgmma either way."""
    small = {name: p for name, p in built["products"].items() if "grouped moe_" in name and "large" not in name}
    assert small == {f"grouped moe_{part} fp8 w8a8{tma}{swap}": "wgmma" if swap else "mma.sync"
                     for part in ("gate_up", "down") for tma in ("", " tma") for swap in ("", " swap")}
    assert {p for name, p in built["products"].items() if "large" in name} == {"wgmma"}


def test_gate_up_gemv_issues_its_tile_loads_before_its_products(built):
    """The register-tile gate_up GEMV (bf16 with KernelConfig.moe_gemv_loads_first, FP8 as it is) has every
    16-byte load of its tile (and x's) in flight before its first FMA: without the fence ptxas interleaves the
    bf16 loads with the products."""
    for name, (before, total, want) in built["loads"].items():
        # the tile's bytes over the program's threads in 16-byte loads, and x's (2048 bf16: one a thread at 8 warps)
        assert total == want and before == total, (name, before, total, want)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
