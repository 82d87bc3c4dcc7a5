"""Mixed and small prefill steps in CUDA graphs (model_wrapper/mixed_graph.py).

CPU part: which graph a step replays (decode, verify, mixed or none) and its bucket, from the
call's arguments only; the attention side of a mixed bucket on the host (the replay hook's metadata
in attention/prefill_graph.py and the captured step's attention over the prefill kernel, under
Triton's interpreter) against the torch backend, two different steps through the same buffers.
The kernel itself: tests/kernels/test_prefill_attention.py.

CUDA part (`pytest -m cuda`): graphed mixed steps = eager steps = transformers' logits on a tiny
model (Llama-3.1 GQA, Mistral's window, Qwen3's q/k norm), LoRA (against eager and peft's logits),
run-ahead ids, no host sync in a replay, the switches off.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, INTERPRET  # before the kernels

from model_wrapper.attention.kv_store import KVStore
from model_wrapper.cuda_graph import DecodeGraphRunner
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.config import KernelConfig
from test_prefill_attention import DTYPE, TOL, D
from test_prefill_attention import Step as KernelStep
from test_verify_graph import gpu, gpu_ckpt  # noqa: F401 - the fixture, shared with the verify graphs' tests
from test_verify_graph import lora_generator
from text_generator import TextGenerator


def _batch(q_lens, prefixes, *, is_prefill=True, lm=True, spec=False):
    """A host ForwardBatch of requests with prefixes[r] cached tokens and q_lens[r] new ones
    (lm: one logit row per request, its last token; spec: a causal spec_mask)."""
    T = sum(q_lens)
    lens = [p + q for p, q in zip(prefixes, q_lens)]
    pos = torch.cat([torch.arange(p, p + q) for p, q in zip(prefixes, q_lens)])
    last = torch.cumsum(torch.tensor(q_lens), 0) - 1
    mask = None
    if spec:
        mq = max(q_lens)
        mask = torch.cat([torch.nn.functional.pad(torch.ones(q, q, dtype=torch.bool).tril(), (0, mq - q))
                          for q in q_lens])
    return ForwardBatch.build(
        input_ids=torch.zeros(T, dtype=torch.int64), input_ids_cpu=torch.zeros(T, dtype=torch.int64), positions=pos,
        slots=torch.arange(T), is_prefill=is_prefill, block_size=16,
        q_lens_cpu=torch.tensor(q_lens, dtype=torch.int32), seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
        block_tables_cpu=torch.zeros(len(q_lens), 8, dtype=torch.int32), lm_head_indices=last if lm else None,
        spec_mask=mask, atten_mask=None, device=torch.device("cpu"))


def _runner(config=None, max_batch=256):
    """A DecodeGraphRunner over a stand-in wrapper: what routing reads of a ModelWrapper (its dtype, a
    backend with verify graphs); kv: a fp16 cache of 2 layers the kernels can read."""

    class Wrapper:
        dtype = torch.float16
        backend = SimpleNamespace(supports_verify_graphs=lambda kv, cfg: cfg.verify_graphs)

    wrapper = Wrapper()
    runner = DecodeGraphRunner(wrapper, max_batch=max_batch, config=config)
    kv = [(torch.zeros(4, 16, 2, D, dtype=torch.float16), torch.zeros(4, 16, 2, D, dtype=torch.float16))
          for _ in range(2)]
    return runner, kv, wrapper


def test_which_graph_a_step_replays():
    """Decode steps: decode graphs. Prefill steps (a chunk with decodes, small prompts) with one
    logit row per request: mixed graphs, even where the verify graphs could take them. Multi-token
    decode steps (speculative verify) of <= 16 tokens a request: verify graphs; longer ones: mixed.
    No lm_head_indices, a spec_mask longer than 16, more tokens than the largest bucket: eager.
    Steps that use adapters: the same, but eager with KernelConfig(mixed_lora_graphs=False)."""
    runner, kv, keep = _runner()  # (the runner holds its wrapper weakly)
    route = runner._route
    assert route(_batch([1, 1, 1], [5, 9, 2], is_prefill=False), kv) == "decode"
    assert route(_batch([1] * 8 + [64], [512] * 9), kv) == "mixed"
    assert route(_batch([1, 1, 3], [5, 9, 0]), kv) == "mixed"
    assert route(_batch([1, 1, 3], [5, 9, 0], lm=False), kv) == "verify"  # all rows: the verify graphs
    assert route(_batch([1, 70], [5, 0], lm=False), kv) is None
    assert route(_batch([4, 4], [5, 9], is_prefill=False), kv) == "verify"
    assert route(_batch([4, 4], [5, 9], is_prefill=False, spec=True), kv) == "verify"
    assert route(_batch([40, 4], [5, 9], is_prefill=False), kv) == "mixed"
    assert route(_batch([40, 4], [5, 9], spec=True), kv) is None
    assert route(_batch([2000, 49], [0, 0]), kv) is None  # 2049 tokens > 2048
    assert route(_batch([1] * 300, [3] * 300), kv) is None  # more requests than the largest bucket
    assert route(_batch([1, 1, 3], [5, 9, 0]), None) is None  # no cache named: nothing to check
    with_adapters = _batch([1] * 8 + [64], [512] * 9)
    with_adapters.lora = object()  # a step naming adapters (uses_lora): mixed, eager with mixed_lora_graphs off
    assert route(with_adapters, kv) == "mixed"
    lora_off, kv, keep_lora = _runner(KernelConfig(mixed_lora_graphs=False))
    assert lora_off._route(with_adapters, kv) is None
    # the switch, and a smaller bound on the tokens
    off, kv, keep_off = _runner(KernelConfig(mixed_graphs=False))
    assert off._route(_batch([1] * 8 + [64], [512] * 9), kv) is None
    assert off._route(_batch([1, 1, 3], [5, 9, 0]), kv) == "verify"
    small, kv, keep_small = _runner(KernelConfig(mixed_max_tokens=512))
    assert small._route(_batch([1] * 8 + [504], [512] * 9), kv) == "mixed"
    assert small._route(_batch([1] * 8 + [505], [512] * 9), kv) is None
    # a cache the kernel does not read (head_dim not a power of two): eager
    odd = [(torch.zeros(4, 16, 2, 48, dtype=torch.float16),) * 2]
    assert runner._route(_batch([1] * 8 + [64], [512] * 9), odd) is None


def test_bucket_choice():
    """The smallest token bucket >= T and request bucket >= max(requests, logit rows); request
    buckets stop at the runner's max_batch, which is one."""
    runner, _, keep = _runner(max_batch=64)
    mixed = runner.mixed
    assert mixed.bucket_for(72, 9) == (96, 32)
    assert mixed.bucket_for(32, 1) == (32, 8) and mixed.bucket_for(33, 3) == (64, 8)
    assert mixed.bucket_for(300, 9) == (320, 32) and mixed.bucket_for(1032, 9) == (1152, 32)
    assert mixed.bucket_for(2048, 33) == (2048, 64) and mixed.request_buckets == [8, 32, 64]
    for t in range(257, 2049):  # past 256 tokens (compute-bound GEMMs) a step pads at most 1/8 of its rows
        assert mixed.bucket_for(t, 1)[0] - t <= t / 8
    assert 256 in mixed.token_buckets  # a bucket's steps stay on one side of the cuBLASLt switch


def test_capture_ahead_takes_every_bucket_a_step_can_replay_with_its_blas_front_end(monkeypatch):
    """MixedGraphRunner.capture (serve's warm-up): the buckets it captures are exactly those that steps of
    at most max_tokens tokens and max_requests requests replay (bucket_for over every such step, B <= T),
    largest first, each under inference mode (as ModelWrapper.forward) and with cuBLASLt preferred for
    buckets of at most BLAS_MAX_TOKENS tokens only (as the wrapper's forward sets it for such steps)."""
    from model_wrapper.model_wrapper import BLAS_MAX_TOKENS

    runner, kv, keep = _runner(max_batch=64)
    keep.blas = "cublaslt"
    mixed = runner.mixed
    monkeypatch.setattr(mixed, "_kernel_fits", lambda kv_cache, block_size: True)
    seen, blas = [], {"lib": "default"}

    def preferred_blas_library(backend=None):  # torch's setter / getter (a CPU build refuses cuBLASLt)
        if backend is not None:
            blas["lib"] = backend
        return blas["lib"]

    def fake_capture(tokens, requests, kv_cache, block_size):
        seen.append((tokens, requests, torch.is_inference_mode_enabled(), blas["lib"]))
        return object()

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred_blas_library)

    monkeypatch.setattr(mixed, "_capture", fake_capture)
    assert mixed.capture(kv, 16, max_tokens=300, max_requests=40) == len(seen)
    want = {mixed.bucket_for(t, b) for b in range(1, 41) for t in range(b, 301)}
    assert {(t, r) for t, r, _, _ in seen} == want
    assert [(t, r) for t, r, _, _ in seen] == sorted(want, reverse=True)
    assert all(inf for _, _, inf, _ in seen)
    for t, _, _, lib in seen:
        assert lib == ("cublaslt" if t <= BLAS_MAX_TOKENS else "default"), (t, lib)
    assert blas["lib"] == "default"  # restored
    assert mixed.capture(kv, 16, max_tokens=300, max_requests=40) == len(seen)  # nothing twice


def test_runner_keeps_no_reference_cycle_with_its_mixed_part():
    import gc
    import weakref

    runner, _, wrapper = _runner()
    wrapper.graphs = runner
    ref = weakref.ref(runner)
    del runner
    gc.disable()
    try:
        del wrapper
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("window", [None, 5])
def test_mixed_bucket_attention_is_the_torch_backend(window):
    """The attention side of a mixed bucket of 48 rows and 4 requests, on the host: the replay hook's
    metadata (plan_mixed_replay) and the captured step's attention (MixedGraphAttention over the
    prefill kernel) for a step of a decode, a chunk after a prefix and a plain prompt, then for a
    different step through the same buffers (nothing carries over): real rows equal the torch
    backend's, padding rows are zero."""
    from model_wrapper.attention.prefill_graph import MixedGraphAttention, make_mixed_state, plan_mixed_replay

    heads, kv_heads, page, tokens, requests = 4, 2, 4, 48, 4
    config = KernelConfig(mixed_block_rows=16, mixed_block_n=8 if INTERPRET else 64)
    state = make_mixed_state(heads, kv_heads, tokens, requests, max_pages=32, device=DEVICE, config=config,
                             sms=32, pin=False)
    assert state.splits > 1  # a small machine: the split path too
    backend = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_dim=D, scale=1 / math.sqrt(D),
                              kv_store=KVStore(num_layers=1))
    attn = MixedGraphAttention(backend, state)
    for seed, (prefixes, q_lens) in enumerate([([13, 6, 0], [1, 21, 9]), ([0, 30], [40, 1])]):
        step = KernelStep(prefixes, q_lens, heads, kv_heads, page, seed=seed)
        b = step.batch
        plan_mixed_replay(state, b.q_lens_cpu, b.block_tables_cpu, b.seq_lens_cpu, page)
        qp = torch.randn(tokens, heads, D, generator=torch.Generator().manual_seed(seed)).to(DTYPE) * 50
        qp[: step.T] = step.q
        pos = torch.zeros(tokens, dtype=torch.int64)
        pos[: step.T] = b.positions_cpu
        on = [x.to(DEVICE) for x in (qp, step.k, step.v)]
        out = attn.run(0, *on, window, SimpleNamespace(positions=pos.to(DEVICE))).cpu()
        torch.testing.assert_close(out[: step.T].float(), step.reference(window).float(), atol=TOL, rtol=0)
        assert torch.count_nonzero(out[step.T:]) == 0


# -- CUDA: graphed mixed steps against eager ones and transformers (`pytest -m cuda`) -------------------

CONTEXTS = (13, 4, 40)


def _contexts(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (n,), generator=g).tolist() for n in CONTEXTS], g


def _mixed_steps(gen, contexts, g, adapters=None, **kwargs):
    """Prefill the contexts (itself a mixed-graph step: one logit row per request), then two mixed
    steps: requests 0 and 1 decode a token, request 2 brings a 37-token chunk and a new request 3 a
    20-token prompt; then all four decode and request 3 brings 9 more. adapters: request -> its LoRA
    adapter (None: the base model) for every step. -> (logits of each step, the sequences whose last
    token each logit row predicts after, the harness)."""
    from conftest import PagedHarness

    h = PagedHarness(gen, 64, 16, seed=4)
    seqs = {r: list(c) for r, c in enumerate(contexts)}
    outs, rows = [], []
    steps = [{r: c for r, c in enumerate(contexts)},
             {0: [5], 1: [7], 2: torch.randint(0, 96, (37,), generator=g).tolist(),
              3: torch.randint(0, 96, (20,), generator=g).tolist()},
             {0: [1], 1: [2], 2: [3], 3: torch.randint(0, 96, (9,), generator=g).tolist()}]
    for i, chunks in enumerate(steps):
        if i:
            for r, toks in chunks.items():
                seqs.setdefault(r, []).extend(toks)
        last = torch.cumsum(torch.tensor([len(t) for t in chunks.values()]), 0) - 1
        if adapters is not None:
            kwargs["adapter_ids"] = [adapters[r] for r in chunks]
        outs.append(h.step(chunks, is_prefill=True, lm_head_indices=last, **kwargs))
        rows.append([list(seqs[r]) for r in chunks])
    return outs, rows, h


def _mixed_buckets(gen):
    return sorted(gen.model_wrapper.graphs.mixed._graphs)


@gpu
@pytest.mark.parametrize("model", ["llama31", "mistral", "qwen3"])
def test_graphed_mixed_steps_equal_eager_and_transformers(gpu_ckpt, model):  # noqa: F811
    """Llama-3.1 (GQA group 4), Mistral (a window of 6, shorter than the chunks) and Qwen3 (q/k norm,
    head_dim 128): every step replays a mixed graph; its logits equal the eager step's (FlashInfer)
    within bf16 noise and every row is within the bf16 bound of transformers' fp32 logits for the
    request's whole sequence; the replays write only the slots they were given."""
    import transformers

    from conftest import rel_err

    path = gpu_ckpt(model)
    contexts, g = _contexts(len(model))
    graph = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    eager = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    got, seqs, h = _mixed_steps(graph, contexts, g)
    assert _mixed_buckets(graph) == [(32, 8), (64, 8)], _mixed_buckets(graph)
    assert not graph.model_wrapper.graphs._graphs  # no decode or verify graph took them
    want, _, _ = _mixed_steps(eager, contexts, _contexts(len(model))[1])
    ref32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="eager").cuda().eval()
    ref16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                              attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        for step, (a, b, rows) in enumerate(zip(got, want, seqs)):
            assert rel_err(a, b) < 2e-2, step
            for r, seq in enumerate(rows):
                ids = torch.tensor([seq], device="cuda")
                w32, w16 = ref32(ids).logits[0, -1].float(), ref16(ids).logits[0, -1].float()
                assert rel_err(a[r], w32) <= 2 * rel_err(w16, w32) + 2e-3, (step, r, rel_err(a[r], w32))
    used = {blk for t in h.tables.values() for blk in t}
    for k, _ in h.kv_cache:
        untouched = [i for i in range(k.shape[0]) if i not in used]
        assert torch.count_nonzero(k[untouched]) == 0, "a mixed replay wrote outside the named slots"


@gpu
def test_lm_head_rows_in_any_order_and_fewer_than_requests(gpu_ckpt):  # noqa: F811
    """lm_head_indices naming rows in another order, or fewer rows than requests, come back in that
    order (the graph's padding rows dropped)."""
    from conftest import PagedHarness

    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    contexts, _ = _contexts(3)
    h = PagedHarness(gen, 64, 16, seed=4)  # one cache: the three prefills replay one graph
    outs = []
    for k, lm in enumerate((torch.tensor([12, 16, 56]), torch.tensor([56, 3, 12]), torch.tensor([16]))):
        outs.append(h.step({3 * k + r: c for r, c in enumerate(contexts)}, is_prefill=True, lm_head_indices=lm))
    assert _mixed_buckets(gen) == [(64, 8)]
    torch.testing.assert_close(outs[1][0], outs[0][2])
    torch.testing.assert_close(outs[1][2], outs[0][0])
    torch.testing.assert_close(outs[2][0], outs[0][1])


# requests' adapters in the LoRA mixed steps: two adapters of tests/adapters/test_lora.py and the base
LORA_REQUESTS = {0: "a2", 1: None, 2: "b4rs", 3: "a2"}


def _peft_refs(path: str, dirs: dict[str, str], dtype):
    """adapter name (None: the base model) -> transformers' model with that peft adapter, on CUDA."""
    import transformers
    from peft import PeftModel

    def base():
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")

    refs = {None: base().cuda().eval()}
    for name, folder in dirs.items():
        refs[name] = PeftModel.from_pretrained(base(), folder).cuda().eval()
    return refs


@gpu
@pytest.mark.parametrize("lora", [{}, {"fold": False}, {"fuse_expand": False}],
                         ids=["folded_fused", "unfolded", "expand_kernels"])
def test_lora_mixed_steps_under_graphs_equal_eager_and_peft(gpu_ckpt, tmp_path, lora):  # noqa: F811
    """Mixed steps of requests on two adapters and the base model replay mixed graphs carrying the LoRA
    kernels (folded A stacks or the shrink kernel; the deltas in the fused epilogues or in expand
    kernels of their own): every logit row is within the bf16 bound of its peft model's fp32 logits
    (twice the bf16 peft model's error, plus a floor, as the base model's test; the base model's logits
    are far outside it on the adapters' rows) and the eager step's row is within the same bound of the
    graph's. The table of every row's errors is printed (-rA). (Session 32's failure: graph against
    eager at a fixed 2e-2, bf16 noise of the norms' deferred division; 0.007-0.015 on an H100.)"""
    from conftest import rel_err
    from test_lora import make_adapters

    path = gpu_ckpt("llama31")
    names = sorted({a for a in LORA_REQUESTS.values() if a is not None})
    torch.manual_seed(0)  # peft draws the A matrices from the global generator
    dirs = make_adapters(path, tmp_path, names)
    outs = {}
    for graphs in (False, True):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs)
        gen.enable_lora(max_loras=4, max_rank=8, **lora)
        for n in names:
            gen.load_adapter(n, dirs[n])
        contexts, g = _contexts(7)
        outs[graphs], seqs, _ = _mixed_steps(gen, contexts, g, adapters=LORA_REQUESTS)
        if graphs:
            assert _mixed_buckets(gen) == [(32, 8), (64, 8)], _mixed_buckets(gen)
            assert not gen.model_wrapper.graphs._graphs  # no decode or verify graph took them
    ref32, ref16 = _peft_refs(path, dirs, torch.float32), _peft_refs(path, dirs, torch.bfloat16)
    table, bad = [], []
    with torch.no_grad():
        for step, rows in enumerate(seqs):
            for r, seq in enumerate(rows):
                a = LORA_REQUESTS[r]
                ids = torch.tensor([seq], device="cuda")
                w32, w16 = ref32[a](ids).logits[0, -1].float(), ref16[a](ids).logits[0, -1].float()
                got, eager = outs[True][step][r], outs[False][step][r]
                errs = (rel_err(got, eager), rel_err(got, w32), rel_err(eager, w32), rel_err(w16, w32))
                base = rel_err(ref32[None](ids).logits[0, -1].float(), w32)
                bound = 2 * errs[3] + 2e-3
                table.append(f"step {step} row {r} ({a}): graph-eager {errs[0]:.4f} graph-fp32 {errs[1]:.4f} "
                             f"eager-fp32 {errs[2]:.4f} peft bf16-fp32 {errs[3]:.4f} base-fp32 {base:.4f}")
                if errs[0] > bound or errs[1] > bound or (a is not None and base <= 2 * bound):
                    bad.append(table[-1])
    print("\n".join(table))
    assert not bad, "\n".join(bad)


@gpu
def test_lora_mixed_steps_stay_eager_with_the_switch_off(gpu_ckpt, tmp_path):  # noqa: F811
    """KernelConfig(mixed_lora_graphs=False): steps that use adapters capture no mixed graph (eager)."""
    from test_lora import make_adapters

    path = gpu_ckpt("llama31")
    dirs = make_adapters(path, tmp_path, ["a2"])
    gen = lora_generator(path, dirs, True)
    gen.model_wrapper.set_kernel_config(dataclasses.replace(gen.model_wrapper.kernel_config, mixed_lora_graphs=False))
    contexts, g = _contexts(7)
    _mixed_steps(gen, contexts, g, adapters={0: "a2", 1: None, 2: "a2", 3: None})
    assert not _mixed_buckets(gen), "LoRA mixed steps replayed mixed graphs"


@gpu
def test_run_ahead_ids_and_no_host_sync_in_a_replay(gpu_ckpt):  # noqa: F811
    """A mixed step whose decode ids come from the device (prev_token_ids: an engine running ahead)
    gives the logits of the same step with the real ids; replays of a captured bucket make no
    host-device sync."""
    from conftest import PagedHarness

    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    contexts, g = _contexts(5)
    chunk = torch.randint(0, 96, (30,), generator=g).tolist()
    h = PagedHarness(gen, 64, 16, seed=4)  # three copies of the requests in one cache
    h.step({3 * k + r: c for k in range(3) for r, c in enumerate(contexts)}, is_prefill=True,
           lm_head_indices=torch.tensor([0]))
    outs = []
    for k, prev in enumerate((False, True, True)):
        kw = {}
        ids = {3 * k: [11], 3 * k + 1: [22], 3 * k + 2: chunk}
        if prev:  # rows 0 and 1 take tokens [3] and [1] of a device tensor
            ids = {3 * k: [0], 3 * k + 1: [0], 3 * k + 2: chunk}
            kw["prev_token_ids"] = (torch.tensor([9, 22, 4, 11], device="cuda"), torch.tensor([0, 1]),
                                    torch.tensor([3, 1]))
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            outs.append(h.step(ids, is_prefill=True, lm_head_indices=torch.tensor([0, 1, 31]), **kw))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(outs[2], outs[0])


@gpu
def test_switch_off_runs_mixed_steps_eagerly(gpu_ckpt):  # noqa: F811
    """KernelConfig(mixed_graphs=False): mixed steps run eagerly (the same logits within bf16 noise)."""
    from conftest import rel_err

    gen = TextGenerator.from_pretrained(gpu_ckpt("llama31"), device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    contexts, g = _contexts(9)
    on, _, _ = _mixed_steps(gen, contexts, g)
    assert _mixed_buckets(gen)
    mw = gen.model_wrapper
    mw.set_kernel_config(dataclasses.replace(mw.kernel_config, mixed_graphs=False))
    off, _, _ = _mixed_steps(gen, contexts, _contexts(9)[1])
    assert not _mixed_buckets(gen)
    for a, b in zip(on, off):
        assert rel_err(a, b) < 2e-2


@gpu
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_moe_mixed_steps_replay_graphs(checkpoint_dir, family):
    """Mixture-of-experts models (Qwen3-MoE, Mixtral; routing on the device): the mixed steps capture and
    replay (the fused MoE makes no host sync), and their logits stay within the bf16 bound of
    transformers' fp32 logits on average (a router near-tie may route a token apart, as any rounding
    change may: tests/model_wrapper/test_moe.py's criterion)."""
    import transformers

    from conftest import rel_err
    from test_moe import _cuda_ckpt

    path = _cuda_ckpt(checkpoint_dir, family)
    contexts, g = _contexts(11)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    got, seqs, _ = _mixed_steps(gen, contexts, g)
    assert _mixed_buckets(gen) == [(32, 8), (64, 8)]
    refs = [transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation="eager").cuda().eval()
            for dt in (torch.float32, torch.bfloat16)]
    ours, oracle = [], []
    with torch.no_grad():
        for logits, rows in zip(got, seqs):
            for r, seq in enumerate(rows):
                ids = torch.tensor([seq], device="cuda")
                w32, w16 = (m(ids).logits[0, -1].float() for m in refs)
                ours.append(rel_err(logits[r], w32))
                oracle.append(rel_err(w16, w32))
    ours, oracle = torch.tensor(ours), torch.tensor(oracle)
    assert ours.mean() <= 2 * oracle.mean() + 1e-3, (ours.mean(), oracle.mean())
    assert ours.median() <= 2 * oracle.median() + 1e-3, (ours.median(), oracle.median())


@gpu
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_fp8_cache_mixed_graphs_match_the_torch_backend(family, tmp_path):
    """Over an e4m3 cache with calibrated per-layer scales, the forward-parity scenario (prefill, chunked
    prefill, mixed, decode, multi-token decode) with CUDA graphs on, its steps with lm_head_indices replaying
    mixed graphs: at most twice as far from the fp32 torch backend over the same e4m3 cache as the bf16
    torch backend, plus a small floor (test_fp8_kv_cuda.py's bound for the eager FlashInfer path)."""
    from conftest import make_checkpoint, rel_err
    from test_forward_parity import _script
    from test_fp8_kv_cuda import GPU_TINY, _gen, _run, _scales

    path = make_checkpoint(tmp_path / family, family, **GPU_TINY, **({"sliding_window": 6} if family == "mistral" else {}))
    full, steps = _script(seed=4)
    steps = [(p, spans, True) for p, spans, _ in steps[:3]] + steps[3:]  # logit rows asked on the prefills too
    scales = _scales(path, list(full.values()))
    ref = _run(_gen(path, torch.float32, scales, attention_backend="torch"), full, steps, 16)
    tb = _run(_gen(path, torch.bfloat16, scales, attention_backend="torch"), full, steps, 16)
    gen = _gen(path, torch.bfloat16, scales, cuda_graphs=True)
    for block_size in (16, 1):
        got = _run(gen, full, steps, block_size)
        assert _mixed_buckets(gen), "no step replayed a mixed graph"
        assert rel_err(got, ref) <= 2 * rel_err(tb, ref) + 2e-3, (block_size, rel_err(got, ref), rel_err(tb, ref))
