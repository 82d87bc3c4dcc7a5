"""GPU tests (`pytest -m cuda`): the FlashInfer backend, the models over the fused kernels and decode
CUDA graphs against the torch backend and transformers on the same random checkpoints (the kernels
one by one: tests/kernels/).

bf16 bound (the oracle's own rounding): our error against transformers in fp32 may be at most
twice transformers' own bf16 error against its fp32, plus a small floor. head_dim is 64 or 128,
the sizes the prebuilt kernel pack holds.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PagedHarness, make_checkpoint, rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
flashinfer = pytest.importorskip("flashinfer")

import transformers  # noqa: E402

from model_wrapper.attention.flashinfer_backend import PagedPlan, RaggedPlan  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from test_forward_parity import _script, run_scenario  # noqa: E402
from test_masks import path as tree_path, tree_rows  # noqa: E402

GPU_TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, vocab_size=96, max_position_embeddings=1024)
GPU_FAMILIES = {
    "llama": dict(GPU_TINY),
    "llama31": dict(GPU_TINY, num_attention_heads=8, hidden_size=512),  # group 4: tensor-core decode
    "qwen2": dict(GPU_TINY),
    "qwen3": dict(GPU_TINY, head_dim=128, num_key_value_heads=1),
}


@pytest.fixture(scope="module")
def gpu_ckpt(tmp_path_factory):
    made = {}

    def get(family, **extra):
        key = (family, repr(sorted(extra.items())))
        if key not in made:
            made[key] = make_checkpoint(tmp_path_factory.mktemp(family), family, **{**GPU_FAMILIES.get(family, GPU_TINY), **extra})
        return made[key]

    return get


def hf_cuda(path, dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").cuda().eval()


def _reference(path, full):
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = hf_cuda(path, dtype)
        with torch.no_grad():
            out[dtype] = {r: m(torch.tensor([t], device="cuda")).logits[0].float() for r, t in full.items()}
        del m
    return out


def _err(outputs, ref):
    got = torch.stack([o for _, _, o in outputs])
    want = torch.stack([ref[r][p] for r, p, _ in outputs])
    return rel_err(got, want)


@pytest.mark.parametrize("family", list(GPU_FAMILIES))
def test_flashinfer_matches_torch_backend_and_transformers(gpu_ckpt, family):
    path = gpu_ckpt(family)
    full, steps = _script(seed=4)
    ref = _reference(path, full)
    fi = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    tb = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, attention_backend="torch")
    assert fi.model_wrapper.backend.name == "flashinfer" and fi.model_wrapper.kernels.name == "flashinfer"
    for block_size in (16, 1):
        out_fi = run_scenario(fi, full, steps, block_size)
        out_tb = run_scenario(tb, full, steps, block_size)
        oracle = _err([(r, p, ref[torch.bfloat16][r][p]) for r, p, _ in out_fi], ref[torch.float32])
        e_fi, e_tb = _err(out_fi, ref[torch.float32]), _err(out_tb, ref[torch.float32])
        assert e_fi <= 2 * oracle + 2e-3, (block_size, e_fi, oracle)
        assert e_tb <= 2 * oracle + 2e-3, (block_size, e_tb, oracle)


def test_sliding_window_on_flashinfer(gpu_ckpt):
    path = gpu_ckpt("mistral", sliding_window=6)
    full, steps = _script(seed=9)
    ref = _reference(path, full)
    fi = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    out = run_scenario(fi, full, steps, 4)
    oracle = _err([(r, p, ref[torch.bfloat16][r][p]) for r, p, _ in out], ref[torch.float32])
    assert _err(out, ref[torch.float32]) <= 2 * oracle + 2e-3


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fresh_prompts_attend_over_their_own_kv_with_the_ragged_kernel(gpu_ckpt, family):
    """A prefill of prompts without cached K/V runs FlashInfer's ragged kernel over the step's own
    K/V (fused RoPE + store, and q/k norm unfused); the next chunk of one of them has a prefix and
    reads the paged cache the first step wrote. Every row against transformers, the bf16 bound."""
    path = gpu_ckpt(family)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    h = PagedHarness(gen, 32, 16)
    prompts = {0: list(range(3, 40)), 1: [7, 8, 9, 10, 11], 2: list(range(60, 81))}
    n = sum(len(p) for p in prompts.values())
    first = h.step(prompts, is_prefill=True, lm_head_indices=torch.arange(n))
    assert isinstance(gen.model_wrapper.backend._plan, RaggedPlan)
    more = [90, 91, 92, 93]
    second = h.step({1: more}, is_prefill=True, lm_head_indices=torch.arange(len(more)))
    assert isinstance(gen.model_wrapper.backend._plan, PagedPlan)  # a prefix: the paged kernel
    ref32, ref16 = hf_cuda(path, torch.float32), hf_cuda(path, torch.bfloat16)
    rows, start = [], 0
    for rid, toks in prompts.items():
        rows.append((toks, first[start:start + len(toks)]))
        start += len(toks)
    rows.append((prompts[1] + more, second))
    for toks, got in rows:
        seq = torch.tensor([toks], device="cuda")
        with torch.no_grad():
            w32, w16 = ref32(seq).logits[0, -got.shape[0]:].float(), ref16(seq).logits[0, -got.shape[0]:].float()
        assert rel_err(got, w32) <= 2 * rel_err(w16, w32) + 2e-3, (len(toks), rel_err(got, w32))


@pytest.mark.parametrize("kind", ["spec", "atten"])
def test_tree_masks_on_flashinfer(gpu_ckpt, kind):
    path = gpu_ckpt("llama")
    fi = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    tb = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, attention_backend="torch")
    parents = [-1, 0, 0, 1, 1, 2, 5]
    ctx = list(range(3, 40))
    toks = [50, 51, 52, 53, 54, 55, 56]
    m, depth = tree_rows(parents)
    outs = []
    for gen in (fi, tb):
        h = PagedHarness(gen, 16, 16)
        h.step({0: ctx}, is_prefill=True)
        h.ensure(0, len(ctx) + len(toks))
        L = len(ctx) + len(toks)
        kw = {"spec_mask": m} if kind == "spec" else {
            "atten_mask": torch.cat((torch.ones(len(toks), len(ctx), dtype=torch.bool), m), 1)}
        outs.append(gen.forward_tensor(
            torch.tensor(toks), torch.tensor([len(ctx) + d for d in depth]), False, h.kv_cache,
            torch.tensor([h.tables[0]], dtype=torch.int32), torch.tensor([h.slot(0, len(ctx) + i) for i in range(len(toks))]),
            torch.tensor([L]), 256, q_lens=[len(toks)], **kw))
    ref32 = hf_cuda(path, torch.float32)
    ref16 = hf_cuda(path, torch.bfloat16)
    for i in range(len(toks)):
        seq = torch.tensor([ctx + [toks[j] for j in tree_path(parents, i)]], device="cuda")
        with torch.no_grad():
            w32, w16 = ref32(seq).logits[0, -1].float(), ref16(seq).logits[0, -1].float()
        bound = 2 * rel_err(w16, w32) + 2e-3
        assert rel_err(outs[0][i], w32) <= bound and rel_err(outs[1][i], w32) <= bound


WIDE_LAYERS = 2
WIDE = dict(GPU_TINY, hidden_size=512, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
            head_dim=128, max_position_embeddings=4096, num_hidden_layers=WIDE_LAYERS)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_long_prefill_runs_the_wide_gate_up_silu_and_matches_transformers(gpu_ckpt, family):
    """A 2100-token prompt on Hopper: gate_up with SiLU-and-mul through the wide GEMM (its calls
    logged; a 40-token chunk after it through the skinny GEMM), RoPE and the K/V store (Qwen3: and its
    q / k norms) in the fused kernel's token tiles (its calls logged), then decode steps over the K/V that
    prefill stored. Every step's logits within the bf16 bound of transformers' fp32 logits."""
    from model_wrapper.kernels import kv_store as kv_kernels
    from model_wrapper.kernels import ops as triton_ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide GEMM runs on sm90 only")
    path = gpu_ckpt(family, **WIDE)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    log, rope_log = [], []
    gen.model_wrapper.kernels._triton = _Logged(triton_ops, log, "wide_gate_up_silu")
    gen.model_wrapper.kv_store._kernels = _Logged(kv_kernels, rope_log, "rope_store_kv")
    h = PagedHarness(gen, 160, 16, seed=6)
    g = torch.Generator().manual_seed(6)
    seq = torch.randint(0, 96, (2100,), generator=g).tolist()
    tail = 6
    first = h.step({0: seq}, is_prefill=True, lm_head_indices=torch.arange(len(seq) - tail, len(seq)),
                   max_seq_len=4096)
    assert len(log) == WIDE_LAYERS, len(log)  # every layer's gate_up
    assert [a[0].shape[0] for a, _ in rope_log] == [2100] * WIDE_LAYERS  # every layer's RoPE + store, fused
    rows = [(seq[:len(seq) - tail + 1 + i], first[i]) for i in range(tail)]
    chunk = torch.randint(0, 96, (40,), generator=g).tolist()
    seq = seq + chunk
    rows.append((list(seq), h.step({0: chunk}, is_prefill=True, max_seq_len=4096)[-1]))
    for _ in range(3):
        seq = seq + [int(rows[-1][1].argmax())]
        rows.append((list(seq), h.step({0: seq[-1:]}, is_prefill=False, max_seq_len=4096)[0]))
    assert len(log) == WIDE_LAYERS
    ref32, ref16 = hf_cuda(path, torch.float32), hf_cuda(path, torch.bfloat16)
    with torch.no_grad():
        for toks, got in rows:
            ids = torch.tensor([toks], device="cuda")
            w32, w16 = ref32(ids).logits[0, -1].float(), ref16(ids).logits[0, -1].float()
            assert rel_err(got, w32) <= 2 * rel_err(w16, w32) + 2e-3, (len(toks), rel_err(got, w32))


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_decode_runs_the_gemv_or_skinny_gemm_and_matches_transformers(gpu_ckpt, batch):
    """Decode at batch 1, 2 (triton_ops.gemv) and 5 (triton_ops.skinny_gemm on Hopper; padded to
    the graph bucket of 8 under graphs), eager and under graphs: the projections go through the
    expected kernel (its calls logged) and the logits stay within the bf16 bound of transformers'
    fp32 logits at each step's tokens."""
    from model_wrapper.kernels import ops as triton_ops

    kernel = "gemv" if batch <= KernelConfig().gemv_max_tokens else "skinny_gemm"
    if kernel == "skinny_gemm" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the skinny GEMM runs on sm90 only")
    path = gpu_ckpt("llama31")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (13, 6, 9, 1, 20)[:batch]]
    runs = []
    for graphs in (False, True):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs)
        log = []
        gen.model_wrapper.kernels._triton = _Logged(triton_ops, log, kernel)
        h = PagedHarness(gen, 64, 16, seed=3)
        last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
        logits = h.step(dict(enumerate(prompts)), is_prefill=True, lm_head_indices=last)
        seqs, steps = [list(p) for p in prompts], []
        for _ in range(5):
            for r, seq in enumerate(seqs):
                seq.append(int(logits[r].argmax()))
            logits = h.step({r: seq[-1:] for r, seq in enumerate(seqs)}, is_prefill=False)
            steps += [(list(seq), logits[r]) for r, seq in enumerate(seqs)]
        assert log, f"no step ran {kernel} (cuda_graphs={graphs})"
        assert not graphs or gen.model_wrapper.graphs._graphs, "no graph was captured"
        runs.append(steps)
    ref32, ref16 = hf_cuda(path, torch.float32), hf_cuda(path, torch.bfloat16)
    with torch.no_grad():
        for steps in runs:
            for toks, got in steps:
                ids = torch.tensor([toks], device="cuda")
                w32, w16 = ref32(ids).logits[0, -1].float(), ref16(ids).logits[0, -1].float()
                assert rel_err(got, w32) <= 2 * rel_err(w16, w32) + 2e-3, (len(toks), rel_err(got, w32))


class _Logged:
    """A module's functions, with each call to the one named `logged` appended to log as (args, kwargs)."""

    def __init__(self, module, log, logged="gemv"):
        self._module, self._log, self._logged = module, log, logged

    def __getattr__(self, name):
        fn = getattr(self._module, name)
        if name != self._logged:
            return fn
        return lambda *args, **kw: (self._log.append((args, kw)), fn(*args, **kw))[1]


def _decode_run(gen, prompts, tokens, block_size=16, num_blocks=64):
    """A prefill of prompts, then decode steps feeding tokens[s][r] to request r at step s (the same
    ids to every generator compared); -> (per-step logits, harness)."""
    h = PagedHarness(gen, num_blocks, block_size, seed=3)
    last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
    h.step({r: p for r, p in enumerate(prompts)}, is_prefill=True, lm_head_indices=last)
    steps = [h.step({r: [t] for r, t in enumerate(ts)}, is_prefill=False) for ts in tokens]
    return steps, h


def _assert_steps_agree(a, b):
    """Two runs' per-step logits within bf16 rounding (2e-2 relative), and their greedy tokens the same but where the
    first run's top two are closer than the two steps' logits differ (the kernels need not round alike)."""
    for x, y in zip(a, b):
        assert rel_err(y, x) < 2e-2
        ax, ay = x.argmax(-1, keepdim=True), y.argmax(-1, keepdim=True)
        margin = (x.gather(-1, ax) - x.gather(-1, ay)).squeeze(-1)
        assert torch.all((ax == ay).squeeze(-1) | (margin <= 2 * (x - y).abs().amax(-1)))


def _assert_written_only_at_named_slots(h):
    used = {blk for t in h.tables.values() for blk in t}
    for k, _ in h.kv_cache:
        untouched = [i for i in range(k.shape[0]) if i not in used]
        assert torch.count_nonzero(k[untouched]) == 0, "a graph replay wrote outside the named slots"


@pytest.mark.parametrize("triton_decode", [True, False])
@pytest.mark.parametrize("batch", [3, 8, 17])
def test_graph_replay_equals_eager_and_writes_only_named_slots(gpu_ckpt, batch, triton_decode):
    """Graph replays (decode attention on the Triton kernel, or on FlashInfer's graph wrappers)
    against eager steps (FlashInfer's decode wrapper); buckets 4, 8 and 24 (split KV and not)."""
    path = gpu_ckpt("llama31")
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (batch,), generator=g)]
    eager = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    graph = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                          kernel_config=KernelConfig(triton_decode=triton_decode))
    tokens = torch.randint(0, 96, (6, batch), generator=g).tolist()
    a, ha = _decode_run(eager, prompts, tokens)
    b, hb = _decode_run(graph, prompts, tokens)
    buckets = graph.model_wrapper.graphs._graphs
    assert buckets, "no graph was captured"
    assert all(bk.attn_state.triton == triton_decode for bk in buckets.values())
    _assert_steps_agree(a, b)  # (the graphs' attention kernel need not round as the eager one does)
    _assert_written_only_at_named_slots(hb)


@pytest.mark.parametrize("batch", [17, 40])
def test_graph_decode_with_a_program_a_sm_equals_the_default_launch(gpu_ckpt, batch):
    """KernelConfig.decode_attention_fat (decode_attention.decode_plan): buckets 24 and 40 of a model with 2 KV heads
    (48 / 80 (request, KV head) pairs: 2 / 1 splits of one program a SM on a GPU of 66-132 SMs) against the same
    graphs with it off: the planned launch taken where on (its buckets' state), none where off; every decode step's
    logits within bf16 rounding of each other (the same attention in other key blocks and splits), the greedy tokens
    the same but where the top two are closer than the steps differ; the caches written only at the named slots."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability()[0] != 9 or not 80 <= sms <= 132:
        pytest.skip(f"the launch is Hopper's and the rule's bounds assume 80-132 SMs (this GPU: {sms})")
    path = gpu_ckpt("llama31")
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (batch,), generator=g)]
    tokens = torch.randint(0, 96, (4, batch), generator=g).tolist()
    runs = {}
    for fat in (False, True):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                            kernel_config=KernelConfig(decode_attention_fat=fat))
        runs[fat] = _decode_run(gen, prompts, tokens, num_blocks=256)
        states = [bk.attn_state for bk in gen.model_wrapper.graphs._graphs.values()]
        assert states and any(s.launch for s in states) == fat
        del gen
    _assert_steps_agree(runs[False][0], runs[True][0])
    _assert_written_only_at_named_slots(runs[True][1])


@pytest.mark.parametrize("family", ["llama31", "qwen3"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_graph_decode_with_rope_and_the_store_in_the_attention_kernel(gpu_ckpt, family, kv_dtype, batch, monkeypatch):
    """KernelConfig.decode_rope_attention_min_batch: the graphs' decode steps with RoPE (Qwen3: its q / k norms too),
    the K/V store and the decode attention in one kernel. Against transformers (a bf16 cache: its fp32 logits, within
    twice transformers' own bf16 error plus a floor) and against the same graphs with RoPE + store and attention apart:
    without q / k norms the same logits bit for bit (the same rotation per value, the same attention), with them
    within bf16 rounding (the norm's sum of squares in another order). Every decode step's logits; the caches written
    only at the named slots. The one kernel ran (its calls counted at capture); an e4m3 cache from
    KernelConfig.fp8_kv_decode_cuda_min_batch rows takes the CUDA e4m3 kernel instead, with RoPE + store apart."""
    import model_wrapper.kernels.decode_attention as da

    if kv_dtype == torch.float8_e4m3fn and batch >= KernelConfig().fp8_kv_decode_cuda_min_batch:
        pytest.skip("the CUDA e4m3 decode kernel's batches")
    calls = []
    real = da.rope_decode_attention
    monkeypatch.setattr(da, "rope_decode_attention", lambda *a, **k: (calls.append(a[0].shape[0]), real(*a, **k))[1])
    path = gpu_ckpt(family)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (batch,), generator=g)]
    tokens = torch.randint(0, 96, (5, batch), generator=g).tolist()
    runs = {}
    for name, least in (("apart", 1 << 30), ("one", 1)):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                            kernel_config=KernelConfig(decode_rope_attention_min_batch=least))
        h = PagedHarness(gen, 64, 16, seed=3)
        h.kv_cache = gen.allocate_kv_cache(64, 16, dtype=kv_dtype)
        last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
        h.step({r: p for r, p in enumerate(prompts)}, is_prefill=True, lm_head_indices=last)
        before = len(calls)
        runs[name] = ([h.step({r: [t] for r, t in enumerate(ts)}, is_prefill=False) for ts in tokens], h)
        assert (len(calls) > before) == (name == "one"), name
        del gen
    assert len(calls) >= transformers.AutoConfig.from_pretrained(path).num_hidden_layers
    one, h1 = runs["one"]
    for x, y in zip(runs["apart"][0], one):
        if family == "qwen3":
            assert rel_err(y, x) < 2e-2
        else:
            assert torch.equal(y, x)
    if kv_dtype == torch.bfloat16:
        full = {r: prompts[r] + [ts[r] for ts in tokens] for r in range(batch)}
        ref = _reference(path, full)
        at = [(r, len(prompts[r]) + s, one[s][r]) for s in range(len(tokens)) for r in range(batch)]
        oracle = _err([(r, p, ref[torch.bfloat16][r][p]) for r, p, _ in at], ref[torch.float32])
        assert _err(at, ref[torch.float32]) <= 2 * oracle + 2e-3
    used = {blk for t in h1.tables.values() for blk in t}
    for k, v in h1.kv_cache:
        untouched = [i for i in range(k.shape[0]) if i not in used]
        assert torch.count_nonzero(k[untouched].view(torch.uint8)) == 0, "a replay wrote outside the named slots"
        assert torch.count_nonzero(v[untouched].view(torch.uint8)) == 0


def test_padding_slots_under_graphs(gpu_ckpt):
    """A decode row with slot -1 writes nothing, in graph replay as in eager mode."""
    gen = TextGenerator.from_pretrained(gpu_ckpt("llama"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    kv = gen.allocate_kv_cache(8, 16)
    bt = torch.tensor([[2], [5]], dtype=torch.int32)
    out = gen.forward_tensor(torch.tensor([4, 9]), torch.tensor([0, 0]), False, kv, bt, torch.tensor([32, -1]),
                             torch.tensor([1, 1]), 64)
    assert out.shape == (2, 96) and gen.model_wrapper.graphs._graphs
    assert all(torch.count_nonzero(k[5]) == 0 and torch.count_nonzero(v[5]) == 0 for k, v in kv)
    assert all(torch.count_nonzero(k[2, 0]) > 0 for k, _ in kv)


def test_no_host_device_sync_in_replayed_decode(gpu_ckpt):
    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    h = PagedHarness(gen, 64, 16)
    h.step({0: list(range(20)), 1: list(range(5))}, is_prefill=True)
    h.step({0: [1], 1: [2]}, is_prefill=False)  # captures
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(3):
            h.step({0: [3 + t], 1: [4 + t]}, is_prefill=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _logged(fn, log):
    """fn, appending the arguments of each call to log."""
    def call(*args):
        log.append(args)
        return fn(*args)
    return call


def test_lora_decode_under_graphs_equals_eager(gpu_ckpt, tmp_path):
    """With LoRA on the Triton kernel, decode graphs carry the adapters: a mixed-adapter batch
    replayed from a graph gives the eager step's logits, and base rows stay base."""
    pytest.importorskip("triton")
    from test_lora import ADAPTERS, MAX_RANK, make_adapters

    path = gpu_ckpt("llama")
    names = list(ADAPTERS)[:3]
    dirs = make_adapters(path, tmp_path, names)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in (5, 9, 3, 12, 7)]
    ids = [names[0], None, names[1], names[2], "base"]
    outs = []
    for graphs in (False, True):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs)
        gen.enable_lora(max_loras=4, max_rank=MAX_RANK)
        assert gen.lora_manager.kernel == "triton"
        for n in names:
            gen.load_adapter(n, dirs[n])
        made = []  # the steps that built an eager LoraBatch (host work a replay skips)
        gen.lora_manager.make_batch = _logged(gen.lora_manager.make_batch, made)
        h = PagedHarness(gen, 64, 16, seed=1)
        h.step({r: p for r, p in enumerate(prompts)}, is_prefill=True, adapter_ids=ids)
        steps = [h.step({r: [7 + t] for r in range(len(prompts))}, is_prefill=False, adapter_ids=ids)
                 for t in range(3)]
        outs.append(torch.stack(steps))
        # with graphs every step replays: the decodes, and the prefill of <= 16 tokens a prompt (a verify graph)
        assert len(made) == (0 if graphs else 4)
        if graphs:
            assert gen.model_wrapper.graphs._graphs, "the LoRA decode steps did not replay a graph"
    assert rel_err(outs[1], outs[0]) < 2e-2


def test_long_lora_prefill_takes_the_token_tiles_and_matches_peft(gpu_ckpt, tmp_path):
    """A LoRA step past KernelConfig.rope_store_lora_max_tokens (two prompts of 700 and 600 tokens, two
    adapters) on Qwen3: the projections add their own deltas and the fused kernel's token tiles still take
    RoPE, the store and the q / k norms (rope_store_kv logged: every layer, all 1300 tokens, no delta handed
    over). Each request's last logits within the bf16 bound of its peft model's fp32 logits."""
    import copy

    from model_wrapper.kernels import kv_store as kv_kernels
    from test_lora import ADAPTERS, MAX_RANK, make_adapter

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide GEMM's shapes are sm90's")
    path = gpu_ckpt("qwen3", **WIDE)
    names = list(ADAPTERS)[:2]
    oracles = {n: make_adapter(path, tmp_path / n, i + 1, **ADAPTERS[n]) for i, n in enumerate(names)}
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    gen.enable_lora(max_loras=2, max_rank=MAX_RANK)
    for n in names:
        gen.load_adapter(n, str(tmp_path / n))
    rope_log = []
    gen.model_wrapper.kv_store._kernels = _Logged(kv_kernels, rope_log, "rope_store_kv")
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (700, 600)]
    assert sum(map(len, prompts)) > KernelConfig().rope_store_lora_max_tokens
    h = PagedHarness(gen, 128, 16, seed=2)
    last = [697, 698, 699, 1297, 1298, 1299]
    out = h.step({0: prompts[0], 1: prompts[1]}, is_prefill=True, adapter_ids=names, max_seq_len=1024,
                 lm_head_indices=torch.tensor(last))
    assert [(a[0].shape[0], a[9]) for a, _ in rope_log] == [(1300, None)] * WIDE_LAYERS
    with torch.no_grad():
        for r, (n, prompt) in enumerate(zip(names, prompts)):
            ids = torch.tensor([prompt])
            w32 = oracles[n](ids).logits[0, -3:].float()
            w16 = copy.deepcopy(oracles[n]).to(torch.bfloat16)(ids).logits[0, -3:].float()
            got = out[3 * r:3 * r + 3].float().cpu()
            assert rel_err(got, w32) <= 2 * rel_err(w16, w32) + 2e-3, (n, rel_err(got, w32), rel_err(w16, w32))


def test_engine_running_ahead_on_cuda_equals_the_plain_order(gpu_ckpt):
    """On CUDA the engine runs ahead of its sampled tokens by default (graph replays take the ids
    from the device): the same greedy outputs as the plain order, token for token (length-limited
    requests: both orders run the same batches through the same kernels). The plain order itself
    is checked against transformers in tests/text_generator/test_engine.py."""
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    path = gpu_ckpt("llama")
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (3, 17, 40, 9, 64, 5, 23, 31)]
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (12, 30, 7, 25, 16, 40, 9, 21)]
    outs = {}
    for mode in (False, True):
        engine = LLMEngine(gen, num_blocks=128, block_size=16, max_num_batched_tokens=48, async_scheduling=mode)
        assert engine.async_scheduling is mode
        outs[mode] = [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)]
        assert engine.block_manager.num_used_blocks == 0
    assert outs[True] == outs[False]
    assert [len(o) for o in outs[True]] == [p.max_new_tokens for p in params]
    assert LLMEngine(gen, num_blocks=8, block_size=16).async_scheduling  # the CUDA default
