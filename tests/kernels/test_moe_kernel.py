"""The fused MoE kernels (model_wrapper/kernels/moe.py) against the reference experts (layers/moe.py).

Under Triton's interpreter on the CPU (fp32: the interpreter mishandles bf16 dots) and on CUDA in bf16
(marked cuda). Token counts cover one token, a few, a block's worth and more; expert counts and top-k vary,
with experts that receive no token and every token routed to one expert.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import INTERPRET  # noqa: E402  (sets the interpreter up before the kernels import)
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe, moe_align  # noqa: E402
from model_wrapper.layers.moe import MoESpec, experts_reference, route  # noqa: E402


def _case(T, E, k, H, inter, dtype, device, skew=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).to(device)
    gate_up = (torch.randn(E, 2 * inter, H, generator=g) * H ** -0.5).to(dtype).to(device)
    down = (torch.randn(E, H, inter, generator=g) * inter ** -0.5).to(dtype).to(device)
    logits = torch.randn(T, E, generator=g).to(dtype).to(device)
    if skew:  # every token prefers the same experts: the others receive nothing
        logits[:, :k] += 20.0
    weights, ids = route(logits, MoESpec(E, k, inter, norm_topk_prob=True))
    return x, weights, ids, gate_up, down


def test_align_groups_pairs_by_expert_and_pads_blocks():
    ids = torch.tensor([[3, 0], [0, 2], [3, 1], [0, 3]])
    pairs, block_expert = moe_align(ids, 5, 4)
    P = ids.numel()
    rows = pairs.tolist()
    # expert 0: pairs 1, 2, 6 (ids[0,1], ids[1,0], ids[3,0]); 1: 5; 2: 3; 3: 0, 4, 7; 4: none
    assert rows[:4] == [1, 2, 6, P] and rows[4:8] == [5, P, P, P] and rows[8:12] == [3, P, P, P]
    assert rows[12:16] == [0, 4, 7, P] and all(r == P for r in rows[16:])
    assert block_expert.tolist()[:4] == [0, 1, 2, 3] and all(e == 5 for e in block_expert.tolist()[4:])


@pytest.mark.parametrize("T,E,k,skew", [(1, 8, 2, False), (3, 8, 3, False), (16, 4, 2, False), (37, 16, 4, False),
                                        (20, 8, 2, True)])
def test_fused_moe_matches_reference_interpreter(T, E, k, skew):
    if not INTERPRET:
        pytest.skip("interpreter case")
    x, w, ids, gate_up, down = _case(T, E, k, 32, 24, torch.float32, "cpu", skew)
    cfg = KernelConfig(moe_block_m=16, moe_block_n=16, moe_block_k=16, moe_stages=1, moe_small_pairs=40,
                       moe_large_block_m=32, moe_large_block_n=16, moe_large_block_k=16, moe_large_stages=1)
    got = fused_moe(x, w, ids, gate_up, down, cfg)
    ref = experts_reference(x, w, ids, gate_up, down)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 3, 16, 257, 4096])
@pytest.mark.parametrize("E,k", [(8, 2), (64, 8), (128, 8)])
def test_fused_moe_matches_reference_cuda(T, E, k):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, w, ids, gate_up, down = _case(T, E, k, 256, 128, torch.bfloat16, "cuda", skew=(T == 257))
    got = fused_moe(x, w, ids, gate_up, down)
    ref = experts_reference(x, w, ids, gate_up, down)
    exact = experts_reference(x.double(), w.double(), ids, gate_up.double(), down.double())
    # bounded by the reference's own bf16 error against float64, with slack for the fp32 final sum
    err, ref_err = (got.double() - exact).abs().max(), (ref.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-3, (err, ref_err)
