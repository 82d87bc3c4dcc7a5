"""The bf16 GEMV (model_wrapper/kernels/gemv.py) compiles for Hopper (sm_90) without spilling, with and
without its add + RMSNorm prologue (add_norm), on a machine without a GPU.

The prologue holds the norm weight's row beside the weights' tile and reduces h + residual over the row
in every program: the interpreter (test_norm_prologue.py) checks its arithmetic, not whether the
registers still hold the tile. Each case is compiled ahead of time as gemv launches it for the
Llama-3-8B projections that follow a norm (qkv; gate_up with its SiLU epilogue) at 1 and 2 tokens, and
without the norm as two row blocks a program at 1 token (gemv_rounds)
under the default KernelConfig, with the ptxas that ships with Triton; cuobjdump reads back its stack
(spilled registers). In a child process: in this one the kernel may already be an interpreted function.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from sm90_compile import ROOT, compile_sm90, run_child

sys.path.insert(0, ROOT)
from model_wrapper.kernels.config import KernelConfig  # noqa: E402

SHAPES = {"qkv": (6144, 4096, False), "gate_up": (28672, 4096, True)}
# also compiled with two row blocks a program (gemv_rounds; at 1 token: gemv_rounds_max_tokens)
ROUNDS = KernelConfig(gemv_rounds=2)


def _compile_all() -> dict:
    """-> {case: stack bytes} (run without TRITON_INTERPRET)."""
    import triton

    from model_wrapper.kernels import gemv, norm
    from model_wrapper.kernels.config import KernelConfig

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cfg = KernelConfig()
    out = {}

    def stack(kernel) -> int:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                                   text=True, check=True).stdout
        return int(re.search(r"STACK:(\d+)", usage).group(1))

    pointers = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", o_ptr="*bf16", r_ptr="*bf16", nw_ptr="*bf16",
                    ro_ptr="*bf16")
    for name, (N, K, silu) in SHAPES.items():
        for M in range(1, cfg.gemv_max_tokens + 1):
            for add_norm, c in ((False, cfg), (True, cfg), (False, ROUNDS)):
                plan = gemv.gemv_plan(M, K, silu, add_norm, c)
                if c is ROUNDS and plan["ROUNDS"] == 1:
                    continue
                constexprs = dict(K=K, M=M, HAS_BIAS=False, SILU=silu, NORM=add_norm, PDL=True,
                                  FENCE=plan["ROUNDS"] > 1, **plan)
                kernel = compile_sm90(gemv._gemv_kernel, pointers, constexprs, ("eps",), num_warps=gemv.gemv_warps(M, cfg),
                                      num_stages=1)
                out[f"{name} M={M}{' +norm' if add_norm else ''}{' rounds' if c is ROUNDS else ''}"] = stack(kernel)
    kernel = compile_sm90(norm._add_rms_norm_kernel, dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16"),
                          dict(BLOCK=4096, PDL=True), ("eps",), num_warps=8, num_stages=1)
    out["add_rms_norm"] = stack(kernel)
    return out


def test_gemv_compiles_for_sm90_without_spills_with_and_without_the_norm_prologue():
    built = run_child(__file__, "cuobjdump")
    assert len(built) == len(SHAPES) * (2 * 2 + 1) + 1, sorted(built)
    assert {case: s for case, s in built.items() if s} == {}


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print(json.dumps(_compile_all()))
