"""The varlen causal paged attention of the mixed-step graphs (model_wrapper/kernels/prefill_attention.py)
under Triton's interpreter (on a GPU machine: compiled), against the torch backend
(attention/torch_backend.py over attention/masks.py, the specification of paged attention) on the
same caches: prefill chunks after cached prefixes, plain prefills, decodes, all mixed in one step;
sliding windows; GQA groups of 1, 2, 3 and 4; pages of 1 and 16 keys; chunks that are not a
multiple of the tile; split KV; fp16 / bf16 and e4m3 caches with per-layer scales; padding rows
(past the step's tokens) come out zero.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, INTERPRET  # before the kernels

from model_wrapper.attention.kv_store import KVStore, quantize_fp8
from model_wrapper.attention.torch_backend import TorchAttentionBackend
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.prefill_attention import (max_tiles, paged_prefill_attention, prefill_splits, tile_map,
                                                     tile_tokens)

pytestmark = [] if INTERPRET else [pytest.mark.cuda]

DTYPE = torch.float16 if INTERPRET else torch.bfloat16  # (the interpreter's bf16 dot is wrong)
D = 32 if INTERPRET else 128
TOL = 2e-3 if DTYPE == torch.float16 else 1.6e-2


class Step:
    """A step of requests with prefixes[r] cached keys and q_lens[r] new tokens, causal, packed into
    `tokens` rows (the rest padding), over caches whose pages are shuffled among unused ones."""

    def __init__(self, prefixes, q_lens, heads, kv_heads, page, *, tokens=None, seed=0, fp8_scales=None):
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.page = heads, kv_heads, page
        self.q_lens, self.lens = q_lens, [p + q for p, q in zip(prefixes, q_lens)]
        self.T = sum(q_lens)
        self.tokens = tokens or self.T
        pages = [-(-n // page) for n in self.lens]
        blocks = sum(pages) + 3
        k = torch.randn(blocks, page, kv_heads, D, generator=g)
        v = torch.randn(blocks, page, kv_heads, D, generator=g)
        self.fp8_scales = fp8_scales
        if fp8_scales is None:
            self.k, self.v = k.to(DTYPE), v.to(DTYPE)
        else:
            self.k, self.v = quantize_fp8(k, fp8_scales[0]), quantize_fp8(v, fp8_scales[1])
        order = torch.randperm(blocks, generator=g).tolist()
        self.tables, at = [], 0
        for n in pages:
            self.tables.append(order[at:at + n])
            at += n
        bt = torch.full((len(q_lens), max(pages)), -1, dtype=torch.int32)
        for r, t in enumerate(self.tables):
            bt[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
        positions = torch.cat([torch.arange(p, p + q) for p, q in zip(prefixes, q_lens)])
        self.q = torch.randn(self.T, heads, D, generator=g).to(DTYPE)
        self.batch = ForwardBatch.build(
            input_ids=torch.zeros(self.T, dtype=torch.int64), input_ids_cpu=torch.zeros(self.T, dtype=torch.int64),
            positions=positions, slots=torch.full((self.T,), -1), is_prefill=True, block_size=page,
            q_lens_cpu=torch.tensor(q_lens, dtype=torch.int32), seq_lens_cpu=torch.tensor(self.lens, dtype=torch.int32),
            block_tables_cpu=bt, lm_head_indices=None, spec_mask=None, atten_mask=None, device=torch.device("cpu"))
        self.pages = pages

    def reference(self, window=None) -> torch.Tensor:
        backend = TorchAttentionBackend(self.heads, self.kv_heads, D)
        if self.fp8_scales is not None:
            backend.kv_store = KVStore(num_layers=1)
            backend.kv_store.set_scales([self.fp8_scales[0]], [self.fp8_scales[1]])
        backend.plan(self.batch)
        return backend.run(0, self.q, self.k, self.v, window, self.batch)

    def kernel(self, window=None, splits=1, block_rows=16, requests=None, fp8_math=None):
        """-> (the real rows, the padding rows) of the kernel's output; requests: padded request
        count of the metadata (the graph's request bucket)."""
        R = requests or len(self.q_lens)
        B = len(self.q_lens)
        block_t = tile_tokens(self.heads, self.kv_heads, block_rows)
        tiles = torch.zeros(3, max_tiles(self.tokens, R, block_t), dtype=torch.int32)
        tile_map(self.batch.q_lens_cpu, self.tokens, block_t, out=tiles)
        qo = torch.zeros(R + 1, dtype=torch.int32)
        qo[1:B + 1] = torch.cumsum(torch.tensor(self.q_lens), 0)
        qo[B + 1:] = self.T
        indptr = torch.zeros(R + 1, dtype=torch.int32)
        indptr[1:B + 1] = torch.cumsum(torch.tensor(self.pages), 0)
        indptr[B + 1:] = indptr[B]
        last = torch.zeros(R, dtype=torch.int32)
        last[:B] = torch.tensor([n - (p - 1) * self.page for n, p in zip(self.lens, self.pages)])
        indices = torch.cat([torch.tensor(t) for t in self.tables]).to(torch.int32)
        g = torch.Generator().manual_seed(1)
        qp = torch.randn(self.tokens, self.heads, D, generator=g).to(DTYPE) * 100  # padding: anything
        qp[: self.T] = self.q
        pos = torch.zeros(self.tokens, dtype=torch.int64)
        pos[: self.T] = self.batch.positions_cpu
        scales = {}
        if self.fp8_scales is not None:
            scales = dict(k_scale=torch.tensor([self.fp8_scales[0]], device=DEVICE),
                          v_scale=torch.tensor([self.fp8_scales[1]], device=DEVICE))
        on = [x.to(DEVICE) for x in (qp, self.k, self.v, qo, indptr, indices, last, tiles, pos)]
        out = paged_prefill_attention(*on, 1 / math.sqrt(D), block_t=block_t, window=window, splits=splits,
                                      block_n=8 if INTERPRET else 64, fp8_math=fp8_math, **scales).cpu()
        return out[: self.T], out[self.T:]


def _check(step, window=None, splits=1, block_rows=16, requests=None, tol=TOL, fp8_math=None):
    got, pad = step.kernel(window, splits, block_rows, requests, fp8_math)
    want = step.reference(window)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)
    assert torch.count_nonzero(pad) == 0, "a padding row has output"


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 2), (8, 2)])
def test_mixed_step_of_chunks_prefills_and_decodes(page, heads, kv_heads):
    """Decodes (one token after a prefix), a chunk after a prefix that ends mid-page, a plain prefill
    (no prefix) of a length no tile divides, and a one-token prompt, in one step."""
    step = Step([11, 2 * page + 3, 0, 5, 0], [1, 19, 13, 1, 1], heads, kv_heads, page, seed=page + heads)
    _check(step)


@pytest.mark.parametrize("splits", [2, 5])
def test_split_kv_equals_one_split(splits):
    """More splits than some tiles have keys (empty splits merge with weight 0)."""
    step = Step([40, 0, 3], [9, 22, 1], 4, 2, 4, seed=splits)
    _check(step, splits=splits)


@pytest.mark.parametrize("window", [1, 4, 9, 100])
@pytest.mark.parametrize("splits", [1, 3])
def test_sliding_window(window, splits):
    """Windows shorter than a tile, one reaching into the prefix, one longer than everything."""
    step = Step([17, 0, 30], [12, 10, 1], 4, 2, 4, seed=window)
    _check(step, window=window, splits=splits)


def test_padding_rows_and_padding_requests():
    """The step packed into more rows than it has (a token bucket) and metadata for more requests
    than it has (a request bucket): real rows as before, padding rows zero."""
    step = Step([6, 0, 13], [3, 14, 1], 4, 2, 4, tokens=45, seed=3)
    _check(step, requests=8)
    _check(step, requests=8, splits=2)


@pytest.mark.parametrize("block_rows", [16, 64])
def test_long_chunk_several_tiles(block_rows):
    """A 70-token chunk after a 25-key prefix: many tiles, the causal edge inside every one."""
    step = Step([25, 4], [70, 1], 4, 1, 16, seed=block_rows)
    _check(step, block_rows=block_rows)


@pytest.mark.parametrize("fp8_math", ["q_dtype", "fp16", "fp16_vreg", "bits_vreg"])
def test_e4m3_cache_with_scales(fp8_math):
    """An FP8 cache read as e4m3 * the layer's K / V scales, as the torch backend reads it, whichever way the
    e4m3 values reach the tensor cores (decode_attention.FP8_MATHS: the "_vreg" ones' PTX on CUDA, their
    Triton stand-ins under the interpreter); a window too."""
    step = Step([9, 0, 21], [6, 11, 1], 4, 2, 4, seed=5, fp8_scales=(0.05, 0.02))
    _check(step, tol=5e-3 if INTERPRET else TOL, fp8_math=fp8_math)
    _check(step, splits=3, tol=5e-3 if INTERPRET else TOL, fp8_math=fp8_math)
    _check(step, window=4, tol=5e-3 if INTERPRET else TOL, fp8_math=fp8_math)


def test_tile_map_covers_every_row_once():
    """Each packed row (real or padding) belongs to exactly one tile; tiles stay within their
    request; the buffer has room for the worst case (max_tiles)."""
    for q_lens, tokens, bt in [([1, 37, 5], 64, 16), ([16, 16], 32, 16), ([3], 3, 16), ([1] * 7, 8, 4),
                               ([5, 1, 9, 2], 100, 8)]:
        q = torch.tensor(q_lens)
        m = tile_map(q, tokens, bt, out=torch.zeros(3, max_tiles(tokens, len(q_lens), bt), dtype=torch.int32))
        cover = torch.zeros(tokens, dtype=torch.int64)
        qo = torch.cumsum(q, 0) - q
        for req, t0, n in m.T.tolist():
            cover[t0:t0 + n] += 1
            assert 0 <= n <= bt
            if req >= 0:
                assert qo[req] <= t0 and t0 + n <= qo[req] + q[req]
            elif n:
                assert t0 >= int(q.sum())
        assert cover.tolist() == [1] * tokens, (q_lens, tokens)


def test_splits_fill_the_machine_only_when_short():
    assert prefill_splits(200, 8, 132) == 1
    assert prefill_splits(12, 8, 132) == 4  # 96 programs -> 2 x 132 wanted
    assert prefill_splits(1, 1, 132) == 8  # capped
