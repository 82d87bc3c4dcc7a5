"""The activation-quantization kernels (model_wrapper/kernels/fp8_act.py) compile for Hopper (sm_90)
without spilling and with 16-byte loads and stores, on a machine without a GPU.

The interpreter (test_fp8_act.py) runs their arithmetic, not the compiler. Here the residual add +
RMSNorm + e4m3 kernel (with and without the residual, with and without the bf16 copy), the
SiLU-and-mul + e4m3 kernel and the standalone quantize kernel are compiled as they are launched
for the Llama-3-8B widths (hidden 4096; intermediate 14336, and its TP=4 slice 3584), with the division by
the scale through its reciprocal (RECIP, as on a GPU), pointers,
strides and widths divisible by 16 (as Triton specializes them at launch), with the ptxas that
ships with Triton; cuobjdump reads back their stack (spilled registers) and nvdisasm their SASS
(the widths of the global loads and stores: a 16-bit or byte-wide access per element would take
8-16x the memory instructions), and the PTX the fp32 -> e4m3 conversion (one rounding to nearest
even, cvt.rn.satfinite.e4m3x2.f32, not through fp16). In a child process: in this one the kernels
may already be interpreted functions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from sm90_compile import ROOT, run_child


def _compile_all() -> dict:
    """-> {case: {"stack": bytes, "ops": {SASS global load / store opcode: count}}} (run without
    TRITON_INTERPRET)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from model_wrapper.kernels import fp8_act
    from model_wrapper.kernels.fp8_reference import FP8_MAX, MIN_AMAX

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    out = {}

    def build(case, fn, pointers, constexprs, scalars, num_warps):
        sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in scalars else "i32")
               for n in fn.arg_names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                   if n in pointers or n.startswith("stride") or n in ("n", "K")}
        kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=aligned),
                                target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=1))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
                                   capture_output=True, text=True, check=True).stdout
            sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                                  check=True).stdout
        ops: dict = {}
        for op in re.findall(r"\b((?:LDG|STG)\.E[.\w]*)", sass):
            ops[op] = ops.get(op, 0) + 1
        cvts = sorted(set(re.findall(r"\bcvt(?:\.\w+)+", kernel.asm["ptx"])))
        out[case] = dict(stack=int(re.search(r"STACK:(\d+)", usage).group(1)), ops=ops, cvts=cvts)

    for has_res in (True, False):
        for write_x in (False, True):
            n, group = 4096, 128
            kg = triton.next_power_of_2(triton.cdiv(n, group))
            build(f"norm res={has_res} write_x={write_x}", fp8_act._norm_quant_kernel,
                  dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", xo_ptr="*bf16"),
                  dict(GROUP=group, GP=group, KG=kg, HAS_RES=has_res, WRITE_X=write_x, FMAX=FP8_MAX, AMIN=MIN_AMAX,
                       RECIP=True),
                  ("eps",), 8 if kg * group >= 4096 else 4)
    for n in (14336, 3584):
        gp, kg = 128, triton.cdiv(n, 128)
        bg = max(1, min(triton.next_power_of_2(kg), 4096 // gp))
        build(f"silu n={n}", fp8_act._silu_quant_kernel,
              dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", xo_ptr="*bf16"),
              dict(GROUP=128, GP=gp, BG=bg, WRITE_X=False, FMAX=FP8_MAX, AMIN=MIN_AMAX, RECIP=True), (),
              4 if bg * gp <= 2048 else 8)
    n = 14336  # one group a row (the row-wise path's per-token activations): the row padded to 16384 lanes
    build(f"silu per-token n={n}", fp8_act._silu_quant_kernel,
          dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", xo_ptr="*bf16"),
          dict(GROUP=n, GP=triton.next_power_of_2(n), BG=1, WRITE_X=False, FMAX=FP8_MAX, AMIN=MIN_AMAX,
               RECIP=True), (), 8)
    build("quantize", fp8_act._fp8_quantize_kernel,
          dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", in_scale_ptr="*fp32"),
          dict(GROUP=128, GP=128, BG=32, STATIC=False, FMAX=FP8_MAX, AMIN=MIN_AMAX, RECIP=True), (), 8)
    return out


def test_quantization_kernels_compile_for_sm90_without_spills_and_with_16_byte_accesses():
    built = run_child(__file__, "cuobjdump")
    assert len(built) == 8, sorted(built)
    spilled = {case: r["stack"] for case, r in built.items() if r["stack"]}
    assert not spilled, spilled
    for case, r in built.items():
        # every load and the e4m3 / bf16 stores 16 bytes wide; the scales' one 4-byte store a group row
        narrow = {op: n for op, n in r["ops"].items() if not op.endswith(".128") and op != "STG.E"}
        assert not narrow and any(op.startswith("LDG") for op in r["ops"]), (case, r["ops"])
        # fp32 -> e4m3 in one rounding to nearest even, not through fp16 (a double rounding)
        assert "cvt.rn.satfinite.e4m3x2.f32" in r["cvts"] and not any(".f16.f32" in c for c in r["cvts"]), r["cvts"]


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
