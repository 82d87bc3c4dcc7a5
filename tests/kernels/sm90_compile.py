"""Triton kernels compiled ahead of time for Hopper (sm_90; Ada's sm_89 and Ampere's sm_80 by arch) on a
machine without a GPU, with the ptxas that ships with Triton (the *_compile tests). The interpreter runs
a kernel's arithmetic but not the compiler, which refuses some constructs the interpreter accepts; so a
test runs its own file as a child process without TRITON_INTERPRET (run_child), which compiles
(compile_sm90) and prints what it built as JSON on its last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_sm90(fn, pointers: dict, constexprs: dict, scalars=(), aligned: bool = False, arch: int = 90,
                 **options):
    """triton.compile of fn for sm_90 (arch: another compute capability, 89 for Ada, 80 for Ampere):
    arguments named in constexprs take those values, those in pointers their pointer types, those in
    scalars fp32 and the rest i32; options (num_warps, num_stages, maxnreg) as given. aligned: every
    pointer and i32 argument marked divisible by 16, as a launch specializes them when their values are
    (torch's allocations, strides of head_dim 128): the vector widths, and so whether loads can be
    asynchronous copies (the pipeliner), follow from it. A constexpr parameter with a default takes it
    unless constexprs names it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in scalars else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if aligned and sig[n] not in ("constexpr", "fp32")}
    return triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


def stack_bytes(kernel) -> int:
    """A compiled kernel's stack frame in bytes (cuobjdump -res-usage of its cubin): 0 unless registers spill."""
    import re
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


def mma_products(kernel) -> str:
    """"wgmma", "mma.sync" or "none": the tensor-core products in a compiled kernel's SASS (nvdisasm of its cubin:
    GMMA instructions, else HMMA)."""
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return "wgmma" if "GMMA" in sass else "mma.sync" if "HMMA" in sass else "none"


def run_child(script: str, tool: str = ""):
    """Runs script (a test file) from the repository root in a process without TRITON_INTERPRET ->
    the JSON on the last line it printed. Skips without Triton or its NVIDIA backend tools (the
    folder of them; tool: that one of them)."""
    triton = pytest.importorskip("triton")
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not (os.path.exists(os.path.join(tools, tool)) if tool else os.path.isdir(tools)):
        pytest.skip("Triton's NVIDIA backend tools are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, os.path.abspath(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
