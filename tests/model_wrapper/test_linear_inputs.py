"""What a projection reads off its input before choosing a path (layers/linear._like: rows, dtype,
device): a plain tensor, the PendingNorm a norm hands to a GEMV that computes it (KernelConfig.gemv_add_norm,
decode sizes), or the QuantizedActivation a norm / SiLU-and-mul kernel made (FP8 prefill). GateUpLinear.silu
asks the next projection's input_quant with these before its FP8 method runs; a PendingNorm reaching it
(FP8 gate_up at one token on CUDA) once raised AttributeError there (found by test_add_norm_cuda.py on an
H100 after the two features met)."""

from __future__ import annotations

import torch

from model_wrapper.kernels.fp8_reference import QuantizedActivation
from model_wrapper.layers.linear import _like
from model_wrapper.layers.norm import PendingNorm


def test_rows_dtype_device_of_each_input_kind():
    h = torch.randn(3, 8, dtype=torch.bfloat16)
    assert _like(h) == (3, torch.bfloat16, h.device)
    pending = PendingNorm(h, torch.randn(3, 8, dtype=torch.bfloat16), torch.ones(8), 1e-6, torch.empty(3, 8))
    assert _like(pending) == (3, torch.bfloat16, h.device)  # the rows the GEMV normalizes
    q = torch.zeros(16, 128, dtype=torch.float8_e4m3fn)
    act = QuantizedActivation(q=q, scale=torch.ones(16, 1), rows=5, group=128, dtype=torch.float16, x=None)
    assert _like(act) == (5, torch.float16, q.device)  # the step's rows, not the padded ones
