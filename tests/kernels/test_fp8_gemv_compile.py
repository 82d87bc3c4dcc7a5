"""The weight-only FP8 GEMV (model_wrapper/kernels/fp8_gemv.py) compiles for Hopper (sm_90) without
spilling, and with 16-byte weight loads, on a machine without a GPU.

The interpreter (test_fp8_kernels.py) runs the kernel's arithmetic but not the compiler: a tile too
large for the registers, or a layout that splits a thread's 16 e4m3 bytes into narrower loads, shows
only as time on a GPU. Here the kernel is compiled ahead of time as fp8_gemv launches it for the
Llama-3-8B projections (qkv, o, gate_up with its SiLU epilogue, down; block scales of 128 and one
scale a row; qkv and gate_up also with the add + RMSNorm prologue, add_norm; qkv and o at 1 token also
with one row block a program, the fp8_gemv_rounds A/B arm) at 1 and 2 tokens under the
default KernelConfig (pointers and strides divisible by
16, as Triton specializes them at launch), with the ptxas that ships with Triton; cuobjdump reads
back its stack (spilled registers) and its SASS the widths of its global loads. In a child process: in this one the kernel may already be an interpreted function.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

from sm90_compile import ROOT, run_child

SHAPES = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (28672, 4096, True),
          "down": (4096, 14336, False)}
NORMED = ("qkv", "gate_up")  # the projections after a norm: compiled with the add_norm prologue too
ROUNDED = ("qkv", "o")  # at 1 token by default two row blocks a program (fp8_gemv_rounds); also compiled with one


def _compile_all() -> dict:
    """-> {case: {"stack": bytes, "loads": {SASS global-load opcode: count}}} (run without TRITON_INTERPRET)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from model_wrapper.kernels import fp8_gemv
    from model_wrapper.kernels.config import KernelConfig

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    fn = fp8_gemv._fp8_gemv_kernel
    out = {}
    default = KernelConfig()
    # x's other load (fp8_gemv_x_rows_max: a copy a row, or one for all rows), at 1 token without the norm
    # (and x once a round, where x once for the rounds would take precedence over either load)
    other = dataclasses.replace(default, fp8_gemv_x_rows_max=0 if default.fp8_gemv_x_rows_max else 4,
                                fp8_gemv_x_once=False)
    once = dataclasses.replace(default, fp8_gemv_x_once=not default.fp8_gemv_x_once)
    for name, (N, K, silu) in SHAPES.items():
        for group in (128, K):
            cases = [(m, nm, fp8_gemv.gemv_rounds(m, K, nm, default.fp8_gemv_rounds, default), default)
                     for m in range(1, default.fp8_gemv_max_tokens + 1)
                     for nm in ((False, True) if name in NORMED else (False,))]
            # one row block a program (fp8_gemv_rounds 1)
            cases += [(1, False, 1, default)] if name in ROUNDED else []
            cases += [(1, False, fp8_gemv.gemv_rounds(1, K, False, default.fp8_gemv_rounds, default), other)]
            if name in ROUNDED or name == "gate_up":  # x once for the rounds or once a round (fp8_gemv_x_once toggled)
                cases += [(1, False, fp8_gemv.gemv_rounds(1, K, False, default.fp8_gemv_rounds, default), once)]
            for M, norm, rounds, cfg in cases:
                ch = fp8_gemv.gemv_chunk(K, group, cfg.fp8_gemv_chunk)
                block_n = fp8_gemv.gemv_block_n(M, K, group, silu, cfg, rounds)
                constexprs = dict(K=K, GROUP=group, CH=ch, NCH=triton.next_power_of_2(K // ch), M=M,
                                  BLOCK_N=block_n, ROUNDS=rounds, HAS_BIAS=False, SILU=silu, NORM=norm, PDL=True,
                                  FENCE=rounds > 1, XROWS=fp8_gemv.gemv_x_rows(block_n, norm, cfg),
                                  XONCE=fp8_gemv.gemv_x_once(M, rounds, norm, cfg))
                pointers = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", b_ptr="*bf16", o_ptr="*bf16",
                                r_ptr="*bf16", nw_ptr="*bf16", ro_ptr="*bf16")
                sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n == "eps" else "i32")
                       for n in fn.arg_names}
                aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                           if n in pointers or n.startswith("stride")}
                kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=aligned),
                                        target=GPUTarget("cuda", 90, 32),
                                        options=dict(num_warps=cfg.fp8_gemv_warps, num_stages=1))
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(kernel.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
                                           capture_output=True, text=True, check=True).stdout
                    sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True,
                                          text=True, check=True).stdout
                loads: dict = {}
                for op in re.findall(r"\b(LDG\.E[.\w]*)", sass):
                    loads[op] = loads.get(op, 0) + 1
                case = f"{name} group={'row' if group == K else group} M={M}{' +norm' if norm else ''}"
                case += " one block" if name in ROUNDED and M == 1 and not norm and rounds == 1 else ""
                if cfg is once:
                    case += " x once" if cfg.fp8_gemv_x_once else " x each round"
                case += " other x load" if cfg is other else ""
                out[case] = dict(stack=int(re.search(r"STACK:(\d+)", usage).group(1)), loads=loads)
    return out


def test_fp8_gemv_compiles_for_sm90_without_spills_and_with_16_byte_weight_loads():
    built = run_child(__file__)
    # the defaults' cases, one row block a program, the other x load, x once toggled (qkv, o, gate_up): two scales
    # each
    want = (len(SHAPES) + len(NORMED)) * 2 * 2 + len(ROUNDED) * 2 + len(SHAPES) * 2 + (len(ROUNDED) + 1) * 2
    assert len(built) == want, sorted(built)
    spilled = {case: r["stack"] for case, r in built.items() if r["stack"]}
    assert not spilled, spilled
    for case, r in built.items():
        # the weights: 16 e4m3 a thread a load (LDG.E.128); x, scales and bias are a few narrower loads
        wide = sum(n for op, n in r["loads"].items() if op.endswith(".128"))
        assert wide >= sum(r["loads"].values()) // 2, (case, r["loads"])


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
