"""Triton's interpreter for the kernel tests on machines without a GPU (import before the kernels).

Without CUDA this sets TRITON_INTERPRET=1, read when a kernel is decorated (at import) and
launched, and patches two things of Triton 3.6's interpreter:
- Triton's own jit helpers (tl.sum, tl.zeros, tl.cdiv, ...) were made for compilation where
  triton was imported before the variable was set (transformers and peft import it): the
  interpreter runs them as it runs its own functions;
- it turns a loop bound into an int with int() of a 1-element array, which NumPy >= 2.4
  refuses: it reads the element instead (upstream fixed it the same way).
Triton 3.9's interpreter loads and stores in C++, which takes bool masks only, while a mask the
compiler reads as i1 can be an int array here (an `&` with an int operand): it is cast to bool.
The interpreter computes tl.dot of bf16 operands wrongly (it reads their bits as integers), so
kernels are checked in fp32 / fp16 there and in bf16 only on CUDA.
Its float32 -> bfloat16 conversion truncates (the GPU's rounds to nearest even), and its
float -> float8e4nv conversion rounds half up and drops the carry of a mantissa that rounds
over (x/s = 126.9 becomes 64, not 128): conversions to and from e4m3 go through torch's, which
round to nearest even and saturate as the GPU's cvt.rn.satfinite does for the clamped inputs
the kernels convert; float32 -> bfloat16 goes through torch's too.
"""

from __future__ import annotations

import os

import torch

INTERPRET = not torch.cuda.is_available()
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime import interpreter as _interpreter
    from triton.runtime.jit import JITFunction

    _interpreted: dict = {}

    def _call_interpreted(self, *args, **kwargs):
        if self.fn not in _interpreted:
            _interpreted[self.fn] = _interpreter.InterpretedFunction(self.fn)
        return _interpreted[self.fn](*args, **kwargs)

    JITFunction.__call__ = _call_interpreted
    _patch_tensor = _interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        _patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interpreter._patch_lang_tensor = _patch_lang_tensor

    _builder = _interpreter.InterpreterBuilder

    def _bool_mask(mask):
        if getattr(mask.data, "dtype", bool) != bool:  # (3.7 hands some masks over as memoryviews)
            mask = _interpreter.TensorHandle(mask.data.astype(bool), mask.dtype)
        return mask

    import numpy as _np
    import triton.language as _tl

    _fp_to_fp = _builder.create_fp_to_fp
    _np_float = {_tl.float32: _np.float32, _tl.float16: _np.float16}

    def _fp_to_fp_e4m3(self, src, dst_type, rounding_mode):
        src_t, dst_t = src.dtype.scalar, dst_type.scalar
        if dst_t == _tl.float8e4nv and src_t in _np_float:
            x = torch.from_numpy(_np.ascontiguousarray(src.data).astype(_np.float32))
            return _interpreter.TensorHandle(x.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), dst_t)
        if src_t == _tl.float8e4nv and dst_t in _np_float:
            x = torch.from_numpy(_np.ascontiguousarray(src.data)).view(torch.float8_e4m3fn).float()
            return _interpreter.TensorHandle(x.numpy().astype(_np_float[dst_t]), dst_t)
        return _fp_to_fp(self, src, dst_type, rounding_mode)

    _builder.create_fp_to_fp = _fp_to_fp_e4m3
    _fp_trunc = _builder.create_fp_trunc

    def _fp_trunc_bf16(self, src, dst_type):
        if src.dtype.scalar == _tl.float32 and dst_type.scalar == _tl.bfloat16:
            x = torch.from_numpy(_np.ascontiguousarray(src.data).astype(_np.float32)).to(torch.bfloat16)
            return _interpreter.TensorHandle(x.view(torch.int16).numpy().view(_np.uint16), dst_type.scalar)
        return _fp_trunc(self, src, dst_type)

    _builder.create_fp_trunc = _fp_trunc_bf16

    _masked_load, _masked_store = _builder.create_masked_load, _builder.create_masked_store
    _builder.create_masked_load = \
        lambda self, ptrs, mask, *a, **kw: _masked_load(self, ptrs, _bool_mask(mask), *a, **kw)
    _builder.create_masked_store = \
        lambda self, ptrs, value, mask, *a, **kw: _masked_store(self, ptrs, value, _bool_mask(mask), *a, **kw)


# shared by the kernel tests: where they run, their per-dtype tolerance against the float64 product,
# and the marks of their CUDA-only cases (skipped without a GPU, or without FlashInfer where they use it)
DEVICE = "cpu" if INTERPRET else "cuda"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


import pytest  # noqa: E402

on_cuda_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_flashinfer = pytest.mark.skipif(not _has("flashinfer"), reason="needs flashinfer")
