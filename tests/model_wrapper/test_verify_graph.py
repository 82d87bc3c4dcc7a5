"""Multi-token decode steps in CUDA graphs: the Triton verify attention and the graphs that run it.

CPU part: the verify kernel (model_wrapper/kernels/verify_attention.py) under Triton's interpreter
against the torch backend (attention/torch_backend.py over attention/masks.py, the specification of
paged attention) on the same caches: chains and spec_mask trees, q = 1..16 per request, batches
mixing q, pages shuffled among unused ones, sliding windows, GQA groups of 1, 2 and 3, with and
without split KV; padding rows (past a request's q_len in the fixed-stride layout) come out zero.
The runner's host side (buckets, the padded layout) needs no GPU either.

CUDA part (`pytest -m cuda`): graphed verify steps = eager verify steps = transformers' logits on a
tiny model (trees, chains, LoRA, sliding windows), no host sync in a replay, decode graphs unchanged.
"""

from __future__ import annotations

import importlib.util
import math
import random

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, INTERPRET, needs_flashinfer, on_cuda_skip  # before the kernels

from model_wrapper.attention.torch_backend import TorchAttentionBackend
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.verify_attention import causal_bits, mask_bits, paged_verify_attention
from test_masks import tree_rows as tree_mask  # (bool [n, n] ancestor-or-self mask, depth of each node)
from text_generator import TextGenerator

pytestmark = [] if INTERPRET else [pytest.mark.cuda]  # on a GPU machine: with the other `-m cuda` tests

DTYPE = torch.float16 if INTERPRET else torch.bfloat16
PAGE, D = (4, 32) if INTERPRET else (16, 128)
TOL = 2e-3 if DTYPE == torch.float16 else 1.6e-2


def tree_parents(n: int, g: torch.Generator) -> list[int]:
    """A random tree of n nodes, parents before children (node 0 the root)."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


class Step:
    """One multi-token decode step of B requests (prefix_r cached keys, q_r new tokens each), its
    caches with every request's pages scattered among unused ones, packed as forward_tensor takes it
    (for the torch backend) and in the fixed-stride layout of Q rows per request (for the kernel)."""

    def __init__(self, prefixes, q_lens, heads, kv_heads, *, trees=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.B, self.heads, self.kv_heads = len(q_lens), heads, kv_heads
        lens = [p + q for p, q in zip(prefixes, q_lens)]
        pages = [-(-n // PAGE) for n in lens]
        blocks = sum(pages) + 5
        self.k = torch.randn(blocks, PAGE, kv_heads, D, generator=g).to(DTYPE)
        self.v = torch.randn(blocks, PAGE, kv_heads, D, generator=g).to(DTYPE)
        order = torch.randperm(blocks, generator=g).tolist()
        tables, at = [], 0
        for n in pages:
            tables.append(order[at:at + n])
            at += n
        width = max(pages)
        self.block_tables = torch.full((self.B, width), -1, dtype=torch.int32)
        for r, t in enumerate(tables):
            self.block_tables[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
        positions, masks = [], []
        max_q = max(q_lens)
        self.spec = None
        for p, q in zip(prefixes, q_lens):
            if trees:
                m, depth = tree_mask(tree_parents(q, g))
                positions += [p + d for d in depth]
                masks.append(torch.nn.functional.pad(m, (0, max_q - q)))
            else:
                positions += list(range(p, p + q))
        if trees:
            self.spec = torch.cat(masks)
        T = sum(q_lens)
        self.q = torch.randn(T, heads, D, generator=g).to(DTYPE)
        self.batch = ForwardBatch.build(
            input_ids=torch.zeros(T, dtype=torch.int64), input_ids_cpu=torch.zeros(T, dtype=torch.int64),
            positions=torch.tensor(positions), slots=torch.full((T,), -1), is_prefill=False, block_size=PAGE,
            q_lens_cpu=torch.tensor(q_lens, dtype=torch.int32), seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
            block_tables_cpu=self.block_tables, lm_head_indices=None, spec_mask=self.spec, atten_mask=None,
            device=torch.device("cpu"))
        self.lens, self.q_lens, self.pages, self.tables = lens, q_lens, pages, tables

    def reference(self, window=None) -> torch.Tensor:
        """The torch backend's output [T, heads, D] (float32 inside, rounded to DTYPE)."""
        backend = TorchAttentionBackend(self.heads, self.kv_heads, D)
        backend.plan(self.batch)
        return backend.run(0, self.q, self.k, self.v, window, self.batch)

    def padded(self, Q: int, g: torch.Generator):
        """-> (q [B*Q, H, D] with random padding rows, bits [B*Q] int32, positions [B*Q], rows [T]:
        the padded row of each packed token)."""
        rows = torch.cat([r * Q + torch.arange(q) for r, q in enumerate(self.q_lens)])
        qp = torch.randn(self.B * Q, self.heads, D, generator=g).to(DTYPE) * 100  # padding: anything
        qp[rows] = self.q
        bits = torch.full((self.B * Q,), -1, dtype=torch.int32)  # padding: every bit set
        if self.spec is not None:
            bits[rows] = mask_bits(self.spec)
        else:
            bits[rows] = torch.cat([causal_bits(q) for q in self.q_lens])
        pos = torch.full((self.B * Q,), 10**6, dtype=torch.int64)
        pos[rows] = self.batch.positions_cpu
        return qp, bits, pos, rows

    def metadata(self):
        indptr = torch.tensor([0] + self.pages).cumsum(0).to(torch.int32)
        indices = torch.cat([torch.tensor(t) for t in self.tables]).to(torch.int32)
        last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(self.lens, self.pages)], dtype=torch.int32)
        return indptr, indices, last

    def kernel(self, Q, window=None, splits=1, seed=0):
        qp, bits, pos, rows = self.padded(Q, torch.Generator().manual_seed(seed))
        on = [x.to(DEVICE) for x in (qp, self.k, self.v, *self.metadata(),
                                     torch.tensor(self.q_lens, dtype=torch.int32), bits, pos)]
        out = paged_verify_attention(*on, 1 / math.sqrt(D), q_per_req=Q, window=window, splits=splits,
                                     block_n=8 if INTERPRET else 64).cpu()
        pad = torch.ones(self.B * Q, dtype=torch.bool)
        pad[rows] = False
        return out[rows], out[pad]


def _check(step, Q, window=None, splits=1):
    got, pad = step.kernel(Q, window, splits)
    want = step.reference(window)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL, rtol=0)
    assert torch.count_nonzero(pad) == 0, "a padding row has output"


@pytest.mark.parametrize("q", [1, 2, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("trees", [False, True])
def test_one_request_every_q(q, trees):
    """One request, cached prefix over several pages (the last part-filled), q new tokens, each Q
    bucket it could go to (q itself, the next power of two, 16)."""
    step = Step([9 * PAGE + 3], [q], heads=8, kv_heads=2, trees=trees, seed=q)
    for Q in sorted({q, 1 << (q - 1).bit_length(), 16}):
        _check(step, Q)


@pytest.mark.parametrize("heads,kv_heads,splits", [(8, 2, 1), (4, 4, 3), (6, 2, 16)])
@pytest.mark.parametrize("trees", [False, True])
def test_batch_mixing_q_and_prefixes(heads, kv_heads, splits, trees):
    """Requests of q = 1, 4, 16, 7, 2 over prefixes of 0 (the step's own tokens only), one key, a
    page, a page and a bit, several pages; more splits than some requests have key blocks."""
    step = Step([0, 1, PAGE, 17 * PAGE + 1, 2 * PAGE + 3], [1, 4, 16, 7, 2], heads, kv_heads, trees=trees,
                seed=heads + splits)
    _check(step, 16, splits=splits)


@pytest.mark.parametrize("trees", [False, True])
@pytest.mark.parametrize("window", [1, 3, 6, 40])
def test_sliding_window(trees, window):
    """A window shorter than the new tokens, one that reaches into the prefix, and one longer
    than everything; in trees the window counts positions (depths), not kv indices."""
    step = Step([23, 5, 0], [8, 3, 6], heads=4, kv_heads=2, trees=trees, seed=window)
    _check(step, 8, window=window)
    _check(step, 8, window=window, splits=4)


def test_strided_q_rows():
    """q as the model hands it over: a view of the fused qkv rows (row stride > heads * D)."""
    step = Step([10, 3], [4, 2], heads=8, kv_heads=2, seed=11)
    Q = 4
    qp, bits, pos, rows = step.padded(Q, torch.Generator().manual_seed(0))
    qkv = torch.zeros(step.B * Q, (8 + 4) * D, dtype=DTYPE)
    qkv[:, : 8 * D] = qp.reshape(step.B * Q, -1)
    q = qkv.to(DEVICE)[:, : 8 * D].view(step.B * Q, 8, D)
    assert q.stride(0) == 12 * D
    on = [x.to(DEVICE) for x in (step.k, step.v, *step.metadata(), torch.tensor(step.q_lens, dtype=torch.int32),
                                 bits, pos)]
    got = paged_verify_attention(q, *on, 1 / math.sqrt(D), q_per_req=Q, splits=2,
                                 block_n=8 if INTERPRET else 64).cpu()
    torch.testing.assert_close(got[rows].float(), step.reference().float(), atol=TOL, rtol=0)


def test_mask_bits_encode_spec_mask_columns():
    """Bit c of a token's word is column c of its spec_mask row; a chain's are bits 0..i."""
    rng = random.Random(0)
    rows = torch.tensor([[rng.random() < 0.5 for _ in range(16)] for _ in range(20)])
    bits = mask_bits(rows)
    for t in range(20):
        assert [(int(bits[t]) >> c) & 1 == 1 for c in range(16)] == rows[t].tolist()
    assert causal_bits(3).tolist() == [0b1, 0b11, 0b111]
    assert int(causal_bits(16)[15]) == 0xFFFF


def _verify_state(size: int, Q: int, max_pages: int):
    """A verify bucket's DecodeGraphState laid out as flashinfer_graph.make_state lays it out, its
    staging in plain host memory (make_state pins it and asks the GPU for its SM count)."""
    from model_wrapper.attention.flashinfer_graph import DecodeGraphState

    n = 2 * size + 1 + size + size * Q
    state = DecodeGraphState(size, True, torch.zeros(size * max_pages, dtype=torch.int32),
                             torch.zeros(size * max_pages, dtype=torch.int32, device=DEVICE), q_per_req=Q, splits=2)
    state.meta_staging, state.meta = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32, device=DEVICE)
    state.kv_indptr, state.kv_last = state.meta[: size + 1], state.meta[size + 1: 2 * size + 1]
    state.q_lens, state.bits = state.meta[2 * size + 1: 3 * size + 1], state.meta[3 * size + 1:]
    return state


@pytest.mark.parametrize("trees", [False, True])
@pytest.mark.parametrize("window", [None, 4])
def test_verify_bucket_attention_is_the_torch_backend(trees, window):
    """The attention side of a verify graph bucket, on the host: the runner's token rows
    (cuda_graph.token_rows), the replay hook's metadata (flashinfer_graph.plan_replay: pages, q_lens,
    mask bits) and the captured step's attention (GraphAttention over the verify kernel), for 3
    requests of q = 5, 1, 3 in a bucket of 4 requests x 8 tokens (one padding request): every real
    row equals the torch backend's, every padding row is zero; then the same bucket refilled for a
    different step (the buffers carry nothing over)."""
    from types import SimpleNamespace

    from model_wrapper.attention.flashinfer_graph import GraphAttention, plan_replay
    from model_wrapper.cuda_graph import token_rows

    size, Q, heads, kv_heads = 4, 8, 4, 2
    backend = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_dim=D, scale=1 / math.sqrt(D),
                              kv_store=None)
    state = _verify_state(size, Q, max_pages=32)
    attn = GraphAttention(backend, state)
    for seed, (prefixes, q_lens) in enumerate([([13, 2, 30], [5, 1, 3]), ([0, 9], [8, 2])]):
        step = Step(prefixes, q_lens, heads, kv_heads, trees=trees, seed=seed)
        batch = step.batch
        rows = token_rows(batch, Q)
        assert rows.tolist() == [r * Q + i for r, q in enumerate(q_lens) for i in range(q)]
        plan_replay(backend, state, batch.block_tables_cpu, batch.seq_lens_cpu, PAGE, batch.q_lens_cpu,
                    batch.spec_mask, rows)
        qp = torch.randn(size * Q, heads, D, generator=torch.Generator().manual_seed(seed)).to(DTYPE)
        qp[rows] = step.q
        pos = torch.zeros(size * Q, dtype=torch.int64)
        pos[rows] = batch.positions_cpu
        on = [x.to(DEVICE) for x in (qp, step.k, step.v)]
        out = attn.run(0, *on, window, SimpleNamespace(positions=pos.to(DEVICE))).cpu()
        torch.testing.assert_close(out[rows].float(), step.reference(window).float(), atol=TOL, rtol=0)
        pad = torch.ones(size * Q, dtype=torch.bool)
        pad[rows] = False
        assert torch.count_nonzero(out[pad]) == 0


def test_bucket_choice_for_verify_steps():
    """A step of B requests of at most q tokens replays the smallest (batch bucket >= B, Q bucket
    >= q); verify batches stop at max_verify_batch, decode ones at max_batch."""
    from model_wrapper.cuda_graph import DecodeGraphRunner

    class Wrapper:
        backend = None

    runner = DecodeGraphRunner(Wrapper(), max_batch=256, max_verify_batch=64)
    assert runner.bucket_for(1) == (1, 1) and runner.bucket_for(5) == (8, 1)
    assert runner.bucket_for(1, 2) == (1, 2) and runner.bucket_for(1, 3) == (1, 4)
    assert runner.bucket_for(7, 9) == (8, 16) and runner.bucket_for(33, 5) == (40, 8)
    assert runner.verify_buckets[-1] == 64 and runner.buckets[-1] == 256


# -- CUDA: graphed verify steps against eager ones and transformers (`pytest -m cuda`) -------------------

GPU_TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                head_dim=64, vocab_size=96, max_position_embeddings=1024)
GPU_MODELS = {"llama31": ("llama31", {}), "mistral": ("mistral", dict(sliding_window=6)),
              "qwen3": ("qwen3", dict(head_dim=128, num_key_value_heads=1))}


def gpu(test):
    """A CUDA-only test (FlashInfer's eager path is the comparison)."""
    return pytest.mark.cuda(on_cuda_skip(needs_flashinfer(test)))


def lora_generator(path: str, dirs: dict[str, str], cuda_graphs: bool) -> TextGenerator:
    """A bf16 CUDA TextGenerator with LoRA on (4 slots, test_lora.MAX_RANK) and the adapters of
    dirs (name -> folder) loaded."""
    from test_lora import MAX_RANK

    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=cuda_graphs)
    gen.enable_lora(max_loras=4, max_rank=MAX_RANK)
    for n in dirs:
        gen.load_adapter(n, dirs[n])
    return gen


@pytest.fixture(scope="module")
def gpu_ckpt(tmp_path_factory):
    from conftest import make_checkpoint

    made = {}

    def get(name):
        if name not in made:
            family, extra = GPU_MODELS[name]
            made[name] = make_checkpoint(tmp_path_factory.mktemp(name), family, **{**GPU_TINY, **extra})
        return made[name]

    return get


# requests' cached contexts, and per verify step each request's tree (parents) and tokens
CONTEXTS = (13, 4, 40)
TREES = {"chain": [[-1, 0, 1, 2, 3], [-1], [-1, 0, 1, 2, 3, 4, 5, 6, 7]],
         "tree": [[-1, 0, 0, 1, 1, 2], [-1, 0], [-1, 0, 1, 0, 3, 3, 5, 2, 1, 8, 9, 10, 11]]}


def _verify_step(gen, h, trees, toks, lm_head_indices=None, **kwargs):
    """One multi-token decode step through forward_tensor: request r's new tokens toks[r] arranged
    as the tree trees[r] (parents before children; a chain is causal, no spec_mask) after what the
    harness h holds. The harness's lengths do not advance (the tokens are drafts)."""
    chain = all(p == i - 1 for parents in trees for i, p in enumerate(parents))
    ids, pos, slots, q_lens, lens, masks = [], [], [], [], [], []
    max_q = max(len(p) for p in trees)
    for r, parents in enumerate(trees):
        start = h.lens[r]
        h.ensure(r, start + len(parents))
        m, depth = tree_mask(parents)
        ids += toks[r]
        pos += [start + d for d in depth]
        slots += [h.slot(r, start + i) for i in range(len(parents))]
        q_lens.append(len(parents))
        lens.append(start + len(parents))
        masks.append(torch.nn.functional.pad(m, (0, max_q - len(parents))))
    width = max(len(h.tables[r]) for r in range(len(trees)))
    bt = torch.full((len(trees), width), -1, dtype=torch.int32)
    for r in range(len(trees)):
        bt[r, :len(h.tables[r])] = torch.tensor(h.tables[r], dtype=torch.int32)
    if not chain:
        kwargs["spec_mask"] = torch.cat(masks)
    return gen.forward_tensor(torch.tensor(ids), torch.tensor(pos), False, h.kv_cache, bt, torch.tensor(slots),
                              torch.tensor(lens, dtype=torch.int32), 512, lm_head_indices, q_lens=q_lens, **kwargs)


def _paths(contexts, trees, toks):
    """The plain sequence of every new token: its request's context, then its root-to-node path."""
    out = []
    for ctx, parents, tk in zip(contexts, trees, toks):
        for i in range(len(parents)):
            path, j = [], i
            while j >= 0:
                path.append(tk[j])
                j = parents[j]
            out.append(ctx + path[::-1])
    return out


def _run(gen, contexts, trees, toks, lm_head_indices=None, **kwargs):
    from conftest import PagedHarness

    h = PagedHarness(gen, 64, 16, seed=4)
    h.step({r: c for r, c in enumerate(contexts)}, is_prefill=True, **kwargs)
    return _verify_step(gen, h, trees, toks, lm_head_indices, **kwargs), h


def _verify_buckets(gen):
    return [key for key in gen.model_wrapper.graphs._graphs if key[1] > 1]


@gpu
@pytest.mark.parametrize("model", list(GPU_MODELS))
@pytest.mark.parametrize("kind", list(TREES))
def test_graphed_verify_equals_eager_and_transformers(gpu_ckpt, model, kind):
    """Three requests verifying chains (causal) or trees (spec_mask) of 1..13 tokens in one step, on
    Llama-3.1 (GQA group 4), Mistral (a window of 6, shorter than the drafts) and Qwen3 (q/k norm,
    head_dim 128): the step replays a verify graph, its logits equal the eager step's (FlashInfer's
    masked prefill) within bf16 noise and every row is within the bf16 bound of transformers' fp32
    logits for the token's root-to-node path; the replay writes only the slots it was given; a
    subset of rows (lm_head_indices, in any order) comes back in that order."""
    import transformers

    from conftest import rel_err

    path = gpu_ckpt(model)
    g = torch.Generator().manual_seed(len(model))
    contexts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in CONTEXTS]
    trees = TREES[kind]
    toks = [torch.randint(0, 96, (len(p),), generator=g).tolist() for p in trees]
    graph = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    eager = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    got, h = _run(graph, contexts, trees, toks)
    assert _verify_buckets(graph), "the verify step did not replay a graph"
    want, _ = _run(eager, contexts, trees, toks)
    assert rel_err(got, want) < 2e-2
    ref32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="eager").cuda().eval()
    ref16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                              attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        for row, seq in enumerate(_paths(contexts, trees, toks)):
            ids = torch.tensor([seq], device="cuda")
            w32, w16 = ref32(ids).logits[0, -1].float(), ref16(ids).logits[0, -1].float()
            assert rel_err(got[row], w32) <= 2 * rel_err(w16, w32) + 2e-3, (row, rel_err(got[row], w32))
    used = {blk for t in h.tables.values() for blk in t}
    for k, _ in h.kv_cache:
        untouched = [i for i in range(k.shape[0]) if i not in used]
        assert torch.count_nonzero(k[untouched]) == 0, "a verify replay wrote outside the named slots"
    pick = torch.tensor([7, 0, 5, 2])
    sub, _ = _run(graph, contexts, trees, toks, lm_head_indices=pick)
    torch.testing.assert_close(sub, got[pick])


@gpu
def test_lora_verify_under_graphs_equals_eager(gpu_ckpt, tmp_path):
    """With LoRA on the Triton kernel, verify graphs carry the adapters: a chain step of requests on
    two adapters and the base model replays a graph and gives the eager step's logits (the eager
    LoRA path is held to peft in tests/adapters/test_lora.py)."""
    from conftest import rel_err
    from test_lora import ADAPTERS, make_adapters

    path = gpu_ckpt("llama31")
    names = list(ADAPTERS)[:2]
    dirs = make_adapters(path, tmp_path, names)
    g = torch.Generator().manual_seed(7)
    contexts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in CONTEXTS]
    trees = TREES["chain"]
    toks = [torch.randint(0, 96, (len(p),), generator=g).tolist() for p in trees]
    outs = []
    for graphs in (False, True):
        gen = lora_generator(path, dirs, graphs)
        out, _ = _run(gen, contexts, trees, toks, adapter_ids=[names[0], None, names[1]])
        outs.append(out)
        assert not graphs or _verify_buckets(gen), "the LoRA verify step did not replay a graph"
    assert rel_err(outs[1], outs[0]) < 2e-2


@gpu
def test_no_host_device_sync_in_replayed_verify(gpu_ckpt):
    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    from conftest import PagedHarness

    h = PagedHarness(gen, 64, 16)
    h.step({0: list(range(20)), 1: list(range(5))}, is_prefill=True)
    trees = [[-1, 0, 0, 1], [-1, 0, 1]]
    _verify_step(gen, h, trees, [[1, 2, 3, 4], [5, 6, 7]])  # captures
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(3):
            _verify_step(gen, h, trees, [[1 + t, 2, 3, 4], [5, 6 + t, 7]])
            _verify_step(gen, h, [[-1, 0, 1, 2, 3], [-1, 0]], [[1, 2, 3, 4, 5], [6, 7]])  # a chain
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert sorted(_verify_buckets(gen)) == [(2, 4), (2, 8)]


@gpu
def test_decode_steps_still_replay_decode_graphs_and_verify_graphs_turn_off(gpu_ckpt):
    """KernelConfig(verify_graphs=False) sends multi-token steps back to the eager path (the same
    logits within bf16 noise); a decode step still takes its one-token bucket."""
    import dataclasses

    from conftest import PagedHarness, rel_err

    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    mw = gen.model_wrapper
    h = PagedHarness(gen, 64, 16)
    h.step({0: list(range(20)), 1: list(range(5))}, is_prefill=True)
    on = _verify_step(gen, h, [[-1, 0, 1], [-1, 0]], [[1, 2, 3], [4, 5]])
    assert sorted(mw.graphs._graphs) == [(2, 4)]
    mw.set_kernel_config(dataclasses.replace(mw.kernel_config, verify_graphs=False))
    off = _verify_step(gen, h, [[-1, 0, 1], [-1, 0]], [[1, 2, 3], [4, 5]])
    assert not mw.graphs._graphs  # dropped by the new config, nothing captured since
    assert rel_err(on, off) < 2e-2
    h.step({0: [9], 1: [8]}, is_prefill=False)
    assert sorted(mw.graphs._graphs) == [(2, 1)]
