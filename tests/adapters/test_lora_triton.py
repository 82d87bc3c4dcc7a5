"""The "triton" LoraBatch of LoraManager (the side stream, graph batches, the expand handed to the
consumer kernels, the A stacks folded into the base weights) against the "torch" kernel and exact
references. The kernels themselves: tests/kernels/test_lora_epilogues.py.

Without a GPU the kernels run under Triton's interpreter (tests/triton_interpret.py, CPU
tensors; tl.dot of bf16 is wrong there, so fp32 / fp16 there and bf16 only on CUDA); the module is
skipped where triton is not installed (CI installs only `.[test]`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # before the kernels: sets up the interpreter

import adapters.triton_kernels as tk
import model_wrapper.kernels.ops as tops
import adapters.lora_manager as lora_manager_module  # noqa: E402
from adapters import PEFT_MODULES, LoraError, LoraErrorCode, LoraManager, LoraStateError, PeftAdapter  # noqa: E402
from adapters.lora_batch import LoraDelta  # noqa: E402
from conftest import PagedHarness, rel_err  # noqa: E402
from test_lora_epilogues import delta_reference, reference, rope_reference, silu_mul_reference  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"


# -- LoraManager / LoraBatch with kernel "triton" -------------------------------------------------

SHAPES = dict(num_layers=2, hidden_size=32, q_size=32, kv_size=16, intermediate_size=48)

# manager-level tests on CPU tensors: under the interpreter only (on a GPU the cuda-marked
# model-level tests below run the same paths: graph batches, the side stream, fused and folded)
interpreted = pytest.mark.skipif(not INTERPRET, reason="CPU tensors under Triton's interpreter")


def random_adapter(name, manager, rank, modules=tuple(PEFT_MODULES), layers=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in layers if layers is not None else range(manager.shapes.num_layers):
        for proj in modules:
            in_f, out_f = manager.shapes.peft_shape(proj)
            weights[(layer, proj)] = (torch.randn(rank, in_f, generator=g) / math.sqrt(in_f),
                                      torch.randn(out_f, rank, generator=g) * 0.1)
    return PeftAdapter(name=name, path="<random>", weights=weights)


def loaded_manager(device="cpu", dtype=torch.float32, **kw):
    m = LoraManager(**SHAPES, max_loras=4, max_rank=8, device=device, dtype=dtype, **kw)
    m.add_adapter(random_adapter("r8", m, 8, seed=1))
    m.add_adapter(random_adapter("r2_qv", m, 2, modules=("q_proj", "v_proj"), seed=2))
    m.add_adapter(random_adapter("r5_l1", m, 5, modules=("k_proj", "gate_proj", "down_proj", "o_proj"), layers=[1],
                                 seed=3))
    return m


def fake_batch(q_lens):
    return SimpleNamespace(q_lens_cpu=torch.tensor(q_lens, dtype=torch.int32))


def assert_same_deltas(m, got_batch, want_batch, T, tol=1e-5, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(T)
    for module in ("qkv", "o", "gate_up", "down"):
        x = torch.randn(T, m.shapes.in_features(module), generator=g).to(device, dtype)
        y = torch.randn(T, m.shapes.out_offsets(module)[-1], generator=g).to(device, dtype)
        for layer in range(m.shapes.num_layers):
            got = got_batch.apply(layer, module, x, y.clone())
            want = want_batch.apply(layer, module, x, y.clone())
            assert rel_err(got - y, want - y) < tol, (module, layer)


def test_manager_tracks_true_ranks_per_sub_module():
    m = loaded_manager()
    s = {n: m.slot_of(n) for n in m.list_adapters()}
    assert m.lora_rank["qkv"][0, s["r2_qv"]].tolist() == [2, 0, 2]
    assert m.lora_rank["qkv"][0, s["r5_l1"]].tolist() == [0, 0, 0]
    assert m.lora_rank["gate_up"][1, s["r5_l1"]].tolist() == [5, 0]
    assert m.lora_rank["down"][:, s["r8"]].flatten().tolist() == [8, 8]
    m.unload_adapter("r8")
    assert all(int(r[:, s["r8"]].abs().sum()) == 0 for r in m.lora_rank.values())


def test_a_reused_slot_is_zero_past_the_new_ranks():
    """The fused kernels read B tiles whole (rank-masked s times B): a slot that held a rank-8
    adapter and now holds a rank-2 one on two modules must keep nothing of the first past rank 2,
    nor on the modules the second leaves out."""
    m = loaded_manager()
    slot = m.slot_of("r8")
    m.unload_adapter("r8")
    m.add_adapter(random_adapter("again", m, 2, modules=("q_proj", "down_proj"), seed=9))
    assert m.slot_of("again") == slot
    for module, stacks in m.lora_b.items():
        for sub, b in enumerate(stacks):  # [layers, slots, out, R]
            rank = m.lora_rank[module][:, slot, sub]
            for layer in range(b.shape[0]):
                assert not b[layer, slot, :, int(rank[layer]):].any(), (module, sub, layer)
                assert b[layer, slot, :, :int(rank[layer])].any() == bool(rank[layer])


@interpreted
@pytest.mark.parametrize("schedule", ["segmented", "scan"])
def test_triton_batch_matches_torch_kernel(schedule, monkeypatch):
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="triton")
    for ids, q_lens in [(["r2_qv", None, "r8", "r5_l1", "base", "r8"], [3, 2, 4, 1, 2, 5]),
                        (["r8"], [2, 3]), (["r5_l1", "r8", "r8"], [2, 1, 3])]:
        got = m.make_batch(ids, fake_batch(q_lens))
        want = dataclasses.replace(got, kernel="torch")
        if schedule == "scan":  # what a graph batch does: no host grouping
            got = dataclasses.replace(got, segments=None, perm=None, slot_indptr=None)
        assert_same_deltas(m, got, want, sum(q_lens))


def test_make_batch_for_triton_copies_int32_slots_into_the_preallocated_buffer(monkeypatch):
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="triton", max_num_tokens=16)
    assert m.kernel == "triton"
    s = {n: m.slot_of(n) for n in m.list_adapters()}
    lb = m.make_batch(["r8", None, "r2_qv"], fake_batch([2, 1, 3]))
    assert lb.token_slot.dtype == torch.int32
    assert lb.token_slot.tolist() == [s["r8"]] * 2 + [-1] + [s["r2_qv"]] * 3
    assert lb.token_slot.data_ptr() == m._buffers["token_slot"].data_ptr()
    assert (s["r8"], s["r2_qv"]) == (0, 1) and lb.perm.tolist() == [0, 1, 3, 4, 5]  # grouped by slot
    assert lb.slot_indptr.tolist() == [0, 2, 5, 5, 5]  # slot s: perm[indptr[s]:indptr[s+1]]
    assert lb.slot_indptr.data_ptr() == m._buffers["slot_indptr"].data_ptr()
    assert lb.seg_indptr is None and lb.seg_slots is None  # the segment GEMM's, not needed here
    assert m.slots_for(["r5_l1", None, "base"]) == [s["r5_l1"], -1, -1]
    with pytest.raises(LoraError) as e:
        m.slots_for(["r8", "nope"])
    assert e.value.code == LoraErrorCode.NOT_LOADED and "'nope'" in str(e.value)


class FakeSide:
    """The manager's side stream where there are no streams (the interpreter): records what runs
    inside a fork and when the joins come."""

    def __init__(self):
        self.log, self.forked = [], False

    @contextlib.contextmanager
    def fork(self):
        self.log.append("fork")
        self.forked = True
        yield
        self.forked = False

    def join(self):
        self.log.append("join")


def record_launches(monkeypatch, side):
    """Log each kernel launch (and each s allocation): on the side stream or not, and with PDL or not."""

    class Launch:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                side.log.append((self.name, "side" if side.forked else "current", kwargs["PDL"],
                                 kwargs.get("launch_pdl", False)))
                return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("_shrink", "_expand"):
        monkeypatch.setattr(tk, name, Launch(name, getattr(tk, name)))
    alloc = tk.lora_shrink_out

    def shrink_out(*args, **kwargs):
        side.log.append(("alloc s", "side" if side.forked else "current"))
        return alloc(*args, **kwargs)

    monkeypatch.setattr(tk, "lora_shrink_out", shrink_out)


@interpreted
@pytest.mark.parametrize("schedule", ["segmented", "scan"])
def test_begin_forks_the_shrink_and_finish_joins_it_before_the_expand(schedule, monkeypatch):
    """The overlapping path: s allocated on the current stream, the shrink alone on the side stream,
    the join before the expand, no PDL for either; the numbers of apply() / the torch kernel."""
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="triton")
    assert not m.overlap  # CPU: no side stream
    m.side = side = FakeSide()
    assert m.overlap
    record_launches(monkeypatch, side)
    ids, q_lens = ["r2_qv", None, "r8", "r5_l1", "base", "r8"], [3, 2, 4, 1, 2, 5]
    got = m.make_batch(ids, fake_batch(q_lens))
    want = dataclasses.replace(got, kernel="torch")
    if schedule == "scan":
        got = dataclasses.replace(got, segments=None, perm=None, slot_indptr=None)
    T = sum(q_lens)
    g = torch.Generator().manual_seed(0)
    for module in ("qkv", "o", "gate_up", "down"):
        x = torch.randn(T, m.shapes.in_features(module), generator=g)
        y = torch.randn(T, m.shapes.out_offsets(module)[-1], generator=g)
        for layer in range(m.shapes.num_layers):
            side.log.clear()
            pending = got.begin(layer, module, x)
            assert pending.s is not None
            assert side.log == [("alloc s", "current"), "fork", ("_shrink", "side", False, False)]
            out = got.finish(pending, y.clone())
            assert side.log[3:] == ["join", ("_expand", "current", False, False)]
            assert rel_err(out - y, want.apply(layer, module, x, y.clone()) - y) < 1e-5, (module, layer)
            side.log.clear()  # apply(): the same numbers, all on the current stream
            assert torch.equal(out, got.apply(layer, module, x, y.clone()))
            assert [e[:2] for e in side.log] == [("_shrink", "current"), ("_expand", "current")]
    base_only = m.make_batch([None, "base"], fake_batch([2, 3]))  # no LoRA token: nothing launched
    side.log.clear()
    assert torch.equal(base_only.finish(base_only.begin(0, "down", x[:5]), y[:5].clone()), y[:5])
    assert side.log == []


def test_auto_picks_triton_only_where_it_runs(monkeypatch):
    assert loaded_manager().kernel == "torch"  # CPU
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    assert loaded_manager().kernel == "triton"
    assert loaded_manager(kernel="torch").kernel == "torch"


@interpreted
def test_graph_batch_reads_the_runners_buffer_at_every_apply(monkeypatch):
    """What a CUDA graph replays: apply() on a fixed buffer whose contents change between calls."""
    with pytest.raises(LoraError) as e:
        loaded_manager().make_graph_batch(torch.zeros(8, dtype=torch.int32))
    assert e.value.code == LoraErrorCode.INVALID_ARGUMENT  # CPU: no triton kernel to run
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="torch")  # its make_batch is the oracle; graph batches are triton anyway
    for bad in (torch.zeros(8, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int32), [0, 1]):
        with pytest.raises(LoraError) as e:
            m.make_graph_batch(bad)
        assert e.value.code == LoraErrorCode.INVALID_ARGUMENT
    buf = torch.full((12,), 7, dtype=torch.int32)  # stale values beyond T must not matter
    for bad in (torch.zeros(m.max_loras, 13, dtype=torch.int32), torch.zeros(m.max_loras + 1, 13),
                torch.zeros(m.max_loras + 1, 12, dtype=torch.int32), [[0]]):
        with pytest.raises(LoraError) as e:
            m.make_graph_batch(buf, bad)
        assert e.value.code == LoraErrorCode.INVALID_ARGUMENT and "groups_buffer" in str(e.value)
    gb = m.make_graph_batch(buf)
    assert gb.kernel == "triton" and gb.num_lora_tokens is None
    for ids in (["r8", None, "r2_qv", "r5_l1", "r8", None, "r8", "r2_qv"], ["r5_l1"] * 8, [None] * 8):
        buf[:8] = torch.tensor(m.slots_for(ids), dtype=torch.int32)
        assert_same_deltas(m, gb, m.make_batch(ids, fake_batch([1] * 8)), 8)
    # a slot reloaded with another adapter between replays: the graph batch sees the new weights
    m.unload_adapter("r2_qv")
    m.add_adapter(random_adapter("new", m, 3, seed=9))
    ids = ["new", "r8", None, "new", "new", "r5_l1", None, "r8"]
    buf[:8] = torch.tensor(m.slots_for(ids), dtype=torch.int32)
    assert_same_deltas(m, gb, m.make_batch(ids, fake_batch([1] * 8)), 8)


def test_forward_tensor_with_triton_kernel_matches_torch_kernel(checkpoint_dir, monkeypatch):
    """Prefill then decode of a mixed batch through the whole model (interpreter on CPU)."""
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    dtype = torch.float32 if INTERPRET else torch.bfloat16
    base = checkpoint_dir("llama") if INTERPRET else checkpoint_dir("llama", hidden_size=256,
                                                                    intermediate_size=512, head_dim=64)
    outs = []
    for kernel, overlap in (("torch", False), ("triton", True), ("triton", False)):
        gen = TextGenerator.from_pretrained(base, device=DEVICE, dtype=dtype)
        m = gen.enable_lora(max_loras=4, max_rank=8, kernel=kernel, overlap=overlap)
        if INTERPRET and overlap:
            m.side = FakeSide()
        assert m.overlap == overlap
        m.add_adapter(random_adapter("r8", m, 8, seed=1))
        m.add_adapter(random_adapter("r2_qv", m, 2, modules=("q_proj", "v_proj"), seed=2))
        m.add_adapter(random_adapter("r5_l1", m, 5, modules=("k_proj", "up_proj", "o_proj"), layers=[1], seed=3))
        assert m.kernel == kernel
        h = PagedHarness(gen, num_blocks=32, block_size=4)
        ids = ["r8", None, "r2_qv", "r5_l1", "r8"]
        g = torch.Generator().manual_seed(0)
        prompts = {i: torch.randint(0, 96, (n,), generator=g).tolist() for i, n in enumerate([5, 3, 4, 2, 6])}
        steps = [h.step(prompts, is_prefill=True, adapter_ids=ids)]
        for _ in range(2):
            steps.append(h.step({i: [7 + i] for i in prompts}, is_prefill=False, adapter_ids=ids))
        outs.append(torch.cat(steps))
        if INTERPRET and overlap:  # every projection of every step: its fork, then its join
            assert m.side.log == ["fork", "join"] * (len(steps) * gen.config.num_layers * 4)
    for out in outs[1:]:
        assert rel_err(out, outs[0]) < (1e-5 if INTERPRET else 2e-2)


# -- CUDA ------------------------------------------------------------------------------------------


def capture(step) -> "torch.cuda.CUDAGraph":
    """step() run once on a side stream (warm-up: Triton compiles there), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@pytest.mark.cuda
def test_graph_batch_under_cuda_graph_replays_with_new_slots():
    m = loaded_manager(device="cuda", dtype=torch.bfloat16)
    assert m.kernel == "triton"
    T = 8
    buf = torch.full((16,), -1, dtype=torch.int32, device="cuda")
    gb = m.make_graph_batch(buf)
    xs = {mod: torch.randn(T, m.shapes.in_features(mod), device="cuda", dtype=torch.bfloat16) for mod in m.lora_a}
    ys = {mod: torch.randn(T, m.shapes.out_offsets(mod)[-1], device="cuda", dtype=torch.bfloat16)
          for mod in m.lora_a}
    out = {}

    def step():
        for layer in range(m.shapes.num_layers):
            for mod in xs:
                out[(layer, mod)] = gb.apply(layer, mod, xs[mod], ys[mod].clone())

    graph = capture(step)
    # Oracle: the torch kernel in fp32 (same seeded adapters). The graph's bf16 result may be no worse than
    # twice the torch kernel's own bf16 error against it, plus a little.
    m32 = loaded_manager(device="cuda", dtype=torch.float32)
    for ids in (["r8", None, "r2_qv", "r5_l1", "r8", None, "r8", "r2_qv"], [None] * 8, ["r5_l1"] * 7 + ["r8"]):
        buf[:T].copy_(torch.tensor(m.slots_for(ids), dtype=torch.int32))
        graph.replay()
        want = dataclasses.replace(m.make_batch(ids, fake_batch([1] * T)), kernel="torch")
        want32 = dataclasses.replace(m32.make_batch(ids, fake_batch([1] * T)), kernel="torch")
        for (layer, mod), got in out.items():
            if not any(ids):
                assert torch.equal(got, ys[mod])
                continue
            y32 = ys[mod].float()
            exact = want32.apply(layer, mod, xs[mod].float(), y32.clone()) - y32
            expect = want.apply(layer, mod, xs[mod], ys[mod].clone())
            err_graph = rel_err(got.float() - y32, exact)
            err_torch = rel_err(expect.float() - y32, exact)
            assert err_graph <= 2 * err_torch + 2e-3, (ids, layer, mod, err_graph, err_torch)


SPIN = 1_000_000  # GPU clock cycles (~0.6 ms): long enough that a missing wait shows as wrong numbers


class SlowSide:
    """The manager's side stream with a spin before each forked shrink: an expand that did not wait
    for its shrink would read s before the shrink wrote it."""

    def __init__(self, side):
        self.side = side

    @contextlib.contextmanager
    def fork(self):
        with self.side.fork():
            torch.cuda._sleep(SPIN)
            yield

    def join(self):
        self.side.join()


@pytest.mark.cuda
def test_side_stream_shrinks_under_cuda_graph_replay_with_new_slots():
    """begin / base GEMM / finish captured in a CUDA graph: the shrinks fork onto the side stream and
    join back inside the capture. A replay gives what the same calls give eagerly, bit for bit, and
    stays within the bf16 bound of the fp32 oracle; eager segmented batches give apply()'s numbers."""
    m = loaded_manager(device="cuda", dtype=torch.bfloat16)
    assert m.kernel == "triton" and m.overlap
    m.side = SlowSide(m.side)
    T = 8
    buf = torch.full((16,), -1, dtype=torch.int32, device="cuda")
    gb = m.make_graph_batch(buf)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    src = {mod: torch.randn(T, m.shapes.in_features(mod), **bf16) for mod in m.lora_a}
    ws = {mod: torch.randn(m.shapes.out_offsets(mod)[-1], m.shapes.in_features(mod), **bf16) for mod in m.lora_a}
    xs, base, out = {}, {}, {}

    def step():
        for layer in range(m.shapes.num_layers):
            for mod in src:
                torch.cuda._sleep(2 * SPIN)  # x comes late: a shrink that did not wait for it reads garbage
                x = xs[(layer, mod)] = src[mod] * 1
                pending = gb.begin(layer, mod, x)
                y = torch.nn.functional.linear(x, ws[mod])  # the base GEMM the shrink overlaps
                base[(layer, mod)] = y.clone()
                out[(layer, mod)] = gb.finish(pending, y)

    graph = capture(step)
    m32 = loaded_manager(device="cuda", dtype=torch.float32, overlap=False)
    for ids in (["r8", None, "r2_qv", "r5_l1", "r8", None, "r8", "r2_qv"], [None] * 8, ["r5_l1"] * 7 + ["r8"]):
        buf[:T].copy_(torch.tensor(m.slots_for(ids), dtype=torch.int32))
        graph.replay()
        want = dataclasses.replace(m.make_batch(ids, fake_batch([1] * T)), kernel="torch")
        want32 = dataclasses.replace(m32.make_batch(ids, fake_batch([1] * T)), kernel="torch")
        for key, got in out.items():
            layer, mod = key
            x, y = xs[key], base[key]
            eager = gb.finish(gb.begin(layer, mod, x), y.clone())  # the same calls, eagerly, on the replay's x and y
            assert torch.equal(got, eager), (ids, key)
            if not any(ids):
                assert torch.equal(got, y)
                continue
            y32 = y.float()
            exact = want32.apply(layer, mod, x.float(), y32.clone()) - y32
            expect = want.apply(layer, mod, x, y.clone())
            err_graph = rel_err(got.float() - y32, exact)
            err_torch = rel_err(expect.float() - y32, exact)
            assert err_graph <= 2 * err_torch + 2e-3, (ids, key, err_graph, err_torch)
    g = torch.Generator().manual_seed(3)
    for ids, q_lens in [(["r2_qv", None, "r8", "r5_l1", "base", "r8"], [30, 2, 70, 1, 9, 5]), (["r8"], [200])]:
        lb = m.make_batch(ids, fake_batch(q_lens))  # eager: the host's grouping (segmented schedule)
        for mod in src:
            x = torch.randn(sum(q_lens), m.shapes.in_features(mod), generator=g).to(**bf16)
            y = torch.randn(sum(q_lens), m.shapes.out_offsets(mod)[-1], generator=g).to(**bf16)
            for layer in range(m.shapes.num_layers):
                got = lb.finish(lb.begin(layer, mod, x), y.clone())
                assert torch.equal(got, lb.apply(layer, mod, x, y.clone())), (ids, mod, layer)


@pytest.mark.cuda
def test_side_stream_decode_graphs_within_the_bf16_bound(checkpoint_dir):
    """A small model with LoRA: shrinks on the side stream in eager prefill steps and folded into
    the base GEMMs in the decode graphs (the default), eagerly only, on one stream (overlap=False),
    and on the side stream inside the graphs too (fold=False). Each is no
    further from the fp32 oracle (torch kernel, torch attention, fp32) than twice the bf16 torch
    kernel's own error plus 2e-3, and graph replay = eager steps as far as bf16 lets them agree."""
    base = checkpoint_dir("llama", hidden_size=256, intermediate_size=512, head_dim=64)
    g = torch.Generator().manual_seed(0)
    prompts = {i: torch.randint(0, 96, (n,), generator=g).tolist() for i, n in enumerate([5, 9, 3, 12, 7, 4])}
    ids = ["r8", None, "r2_qv", "r5_l1", "base", "r8"]

    def run(dtype=torch.bfloat16, kernel="triton", overlap=True, graphs=True, attention="auto", fold="auto"):
        gen = TextGenerator.from_pretrained(base, device="cuda", dtype=dtype, cuda_graphs=graphs,
                                            attention_backend=attention)
        m = gen.enable_lora(max_loras=4, max_rank=8, kernel=kernel, overlap=overlap, fold=fold)
        assert m.kernel == kernel and m.overlap == overlap
        assert bool(m.folded) == (kernel == "triton" and fold is not False and graphs)  # 4 x 8 <= 256
        m.add_adapter(random_adapter("r8", m, 8, seed=1))
        m.add_adapter(random_adapter("r2_qv", m, 2, modules=("q_proj", "v_proj"), seed=2))
        m.add_adapter(random_adapter("r5_l1", m, 5, modules=("k_proj", "up_proj", "o_proj"), layers=[1], seed=3))
        h = PagedHarness(gen, num_blocks=64, block_size=16, seed=1)
        steps = [h.step(prompts, is_prefill=True, adapter_ids=ids)]
        for t in range(4):
            steps.append(h.step({i: [7 + i + t] for i in prompts}, is_prefill=False, adapter_ids=ids))
        if graphs:
            assert gen.model_wrapper.graphs._graphs, "the LoRA decode steps did not replay a graph"
        return torch.cat(steps)

    exact = run(torch.float32, "torch", False, False, "torch")
    bound = 2 * rel_err(run(kernel="torch", overlap=False, graphs=False), exact) + 2e-3
    outs = {"graph": run(), "eager": run(graphs=False), "one stream": run(overlap=False, fold=False),
            "graph, side stream": run(fold=False)}
    for name, out in outs.items():
        assert rel_err(out, exact) <= bound, (name, rel_err(out, exact), bound)
    assert rel_err(outs["graph"], outs["eager"]) < 2e-2


# -- the expand handed to the consumer kernels that read y -----------------------------------------


@interpreted
def test_finish_deferred_hands_qkv_and_gate_up_to_their_consumer_kernels(monkeypatch):
    """A graph batch defers the qkv and gate_up expands (y untouched, the delta handed over), and
    the fused consumers then give what the expand followed by the plain kernel gives; o (and down)
    the same into the residual-add + RMSNorm. Without the runner's groups, gate_up and o, and with
    fuse_expand=False or a rank above FUSE_MAX_RANK every module, add the delta themselves."""
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="triton")
    assert m.fuse_modules == {"qkv", "o", "gate_up", "down"}
    assert loaded_manager(kernel="triton", fuse_expand=False).fuse_modules == set()
    assert LoraManager(**SHAPES, max_loras=2, max_rank=32, device="cpu", dtype=torch.float32,
                       kernel="triton").fuse_modules == set()
    buf = torch.tensor(m.slots_for(["r8", None, "r2_qv", "r5_l1", "r8", None, "r8"]), dtype=torch.int32)
    gb, T = m.make_graph_batch(buf, m.groups_for(buf)), buf.shape[0]
    no_groups = m.make_graph_batch(buf)  # gate_up's consumer reads the groups: without them, added here
    g = torch.Generator().manual_seed(5)
    HQ, HK, D = 2, 1, 16  # SHAPES: q_size 32, kv_size 16
    for layer in range(m.shapes.num_layers):
        x = torch.randn(T, m.shapes.hidden_size, generator=g)
        y = torch.randn(T, 2 * m.shapes.intermediate_size, generator=g)
        y0 = y.clone()
        d = gb.finish_deferred(gb.begin(layer, "gate_up", x), y)
        assert isinstance(d, LoraDelta) and torch.equal(y, y0)
        want = silu_mul_reference(gb.apply(layer, "gate_up", x, y0.clone()))
        assert rel_err(tops.silu_and_mul_lora(y, d), want) < 1e-5
        assert no_groups.finish_deferred(no_groups.begin(layer, "gate_up", x), y) is None
        assert rel_err(silu_mul_reference(y), want) < 1e-5
        qkv = torch.randn(T, (HQ + 2 * HK) * D, generator=g)
        d = gb.finish_deferred(gb.begin(layer, "qkv", x), qkv)
        ref = gb.apply(layer, "qkv", x, qkv.clone())
        pos = torch.arange(T) * 3
        freqs = torch.arange(32).float()[:, None] * (1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))[None, :]
        table = torch.cat((freqs.cos(), freqs.sin()), -1)
        kc, vc = torch.zeros(2, 8, HK, D), torch.zeros(2, 8, HK, D)
        slots = torch.arange(T)
        tops.rope_store_kv(qkv, pos, table, HQ, HK, D, kc, vc, slots, d)
        q, k, v = ref.split([HQ * D, HK * D, HK * D], 1)
        assert rel_err(qkv[:, :HQ * D].view(T, HQ, D), rope_reference(q.view(T, HQ, D), pos, table)) < 1e-5
        assert rel_err(kc.view(-1, HK, D)[:T], rope_reference(k.view(T, HK, D), pos, table)) < 1e-5
        assert rel_err(vc.view(-1, HK, D)[:T], v.view(T, HK, D)) < 1e-5
        o_in = torch.randn(T, m.shapes.in_features("o"), generator=g)
        o_out = torch.randn(T, m.shapes.out_offsets("o")[-1], generator=g)
        want_o = gb.apply(layer, "o", o_in, o_out.clone())
        d = gb.finish_deferred(gb.begin(layer, "o", o_in), o_out)
        assert isinstance(d, LoraDelta) and gb.defers_norms and not no_groups.defers_norms
        residual = torch.randn_like(o_out)
        weight = torch.rand(o_out.shape[1], generator=g) + 0.5
        want_res = residual + want_o
        scale = tops.add_lora_rms_norm(o_out, residual, weight, 1e-5, d)
        assert rel_err(residual, want_res) < 1e-6 and rel_err(o_out, weight * want_res) < 1e-6
        assert torch.allclose(scale.ss.sum(1), want_res.square().sum(1), rtol=1e-5)
        o_out = torch.randn(T, m.shapes.out_offsets("o")[-1], generator=g)
        want_o = no_groups.apply(layer, "o", o_in, o_out.clone())
        assert no_groups.finish_deferred(no_groups.begin(layer, "o", o_in), o_out) is None  # added here, in place
        assert rel_err(o_out, want_o) < 1e-6


# -- folding the A stacks into the base weights ------------------------------------------------------

def model_linears(m, seed=7, bias=("qkv",)):
    """{(layer, module): nn.Linear} shaped like a model's projections (random, biases on `bias`)."""
    torch.manual_seed(seed)
    return {(layer, mod): torch.nn.Linear(m.shapes.in_features(mod), m.shapes.out_offsets(mod)[-1],
                                          bias=mod in bias)
            for layer in range(m.shapes.num_layers) for mod in ("qkv", "o", "gate_up", "down")}


def test_fold_into_moves_the_a_stacks_below_the_base_weights(monkeypatch):
    """fold_into keeps the model's weights (now views of W_ext), puts every slot's A below them
    (adapters loaded before and after alike), pads to aligned rows; refusals change nothing."""
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    assert not LoraManager(**SHAPES, max_loras=4, max_rank=8, device="cpu", dtype=torch.float32,
                           kernel="triton").folds  # "auto": CUDA only
    m = loaded_manager(kernel="triton", fold=True)
    linears = model_linears(m)
    before = {k: (lin.weight.detach().clone(), None if lin.bias is None else lin.bias.detach().clone())
              for k, lin in linears.items()}
    a_before = {mod: m.lora_a[mod].clone() for mod in m.lora_a}
    bad = dict(linears)
    bad[(1, "down")] = torch.nn.Linear(3, 3)
    with pytest.raises(LoraError) as e:
        m.fold_into(bad)
    assert e.value.code == LoraErrorCode.INVALID_ARGUMENT and "(1, 'down')" in str(e.value)
    assert not m.folded and all(torch.equal(lin.weight, before[k][0]) for k, lin in linears.items())
    assert m.fold_into(linears) is True
    with pytest.raises(LoraStateError) as e:
        m.fold_into(linears)
    assert e.value.code == LoraErrorCode.ALREADY_FOLDED
    m.add_adapter(random_adapter("late", m, 3, modules=("v_proj", "up_proj", "down_proj"), seed=9))
    late = m.slot_of("late")
    g = torch.Generator().manual_seed(2)
    for (layer, mod), lin in linears.items():
        w, b, N = m.folded[(layer, mod)]
        assert torch.equal(lin.weight, before[(layer, mod)][0]) and lin.weight.data_ptr() == w.data_ptr()
        assert (b is None) == (before[(layer, mod)][1] is None)
        if b is not None:
            assert torch.equal(lin.bias, before[(layer, mod)][1]) and torch.equal(b[N:], torch.zeros_like(b[N:]))
        assert w.shape[0] % 8 == 0 and m.lora_a[mod][layer].data_ptr() == w[N:].data_ptr()
        rows = m.lora_a[mod][layer].shape[1]
        assert not w[N + m.max_loras * rows:].any()  # the padding rows stay zero
        x = torch.randn(5, w.shape[1], generator=g)
        s = (x @ w.T)[:, N:N + m.max_loras * rows].view(5, m.max_loras, rows)
        for slot in range(m.max_loras):
            a = a_before[mod][layer, slot] if slot != late else m.lora_a[mod][layer][slot]
            assert torch.allclose(s[:, slot], x @ a.T, atol=1e-5), (layer, mod, slot)
    # the late adapter's A rows were written into W_ext itself
    assert m.lora_rank["qkv"][0, late].tolist() == [0, 0, 3] and m.lora_a["qkv"][0][late, 16:19].any()


def folded_delta_reference(d: LoraDelta, dtype) -> torch.Tensor:
    """[T, sum(outs)] float32 of a folded LoraDelta: token t's own slot's columns of s, rank-masked."""
    T = d.token_slot.shape[0]
    slot = d.token_slot.long().clamp_min(0)
    sv = d.s[0].view(T, -1, d.slot_stride)[torch.arange(T), slot].to(dtype).float()
    return delta_reference(d._replace(s=sv[None], slot_stride=0), dtype)


@interpreted
def test_folded_graph_batch_is_the_base_gemm_plus_each_tokens_delta(monkeypatch):
    """A graph batch of a folded manager: project_folded gives x @ W^T + b plus each token's own
    adapter's delta (a direct float64 computation, reference()), handed to the fused consumers
    (o / down: the residual add + RMSNorm, on a strided y) as LoraDeltas that read s by slot."""
    monkeypatch.setattr(lora_manager_module, "_triton_runs", lambda device, dtype: True)
    m = loaded_manager(kernel="triton", fold=True)
    linears = model_linears(m)
    m.fold_into(linears)
    buf = torch.tensor(m.slots_for(["r8", None, "r2_qv", "r5_l1", "r8", None, "r5_l1"]), dtype=torch.int32)
    gb, T = m.make_graph_batch(buf, m.groups_for(buf)), buf.shape[0]
    eager = m.make_batch(["r8"], fake_batch([3]))
    assert not eager.folds(0, "qkv") and all(gb.folds(layer, mod) for layer, mod in linears)
    g = torch.Generator().manual_seed(4)
    for (layer, mod), lin in linears.items():
        x = torch.randn(T, m.shapes.in_features(mod), generator=g)
        base = torch.nn.functional.linear(x, lin.weight, lin.bias)
        a, bs, ranks, offsets = m.layer_weights(layer, mod)
        want = reference(x, a, bs, buf, ranks, m.max_rank, offsets, base)
        y, d = gb.project_folded(layer, mod, x, defer=True)
        assert y.shape == base.shape and y.stride(0) == m.folded[(layer, mod)][0].shape[0]
        assert isinstance(d, LoraDelta) and d.slot_stride == len(bs) * m.max_rank
        assert torch.allclose(y, base, atol=1e-5)  # untouched: the consumer adds the delta
        if mod in ("o", "down"):  # into the residual add + RMSNorm, on the strided y
            residual = torch.randn(T, y.shape[1], generator=g)
            res_want = residual + want
            weight = torch.rand(y.shape[1], generator=g) + 0.5
            scale = tops.add_lora_rms_norm(y, residual, weight, 1e-5, d)
            assert rel_err(residual, res_want) < 1e-5 and rel_err(y, weight * res_want) < 1e-5, (layer, mod)
            assert torch.allclose(scale.ss.sum(1).double(), res_want.square().sum(1), rtol=1e-5)
            continue
        assert rel_err(base.double() + folded_delta_reference(d, torch.float32).double(), want) < 1e-5
        if mod == "gate_up":
            assert rel_err(tops.silu_and_mul_lora(y, d), silu_mul_reference(want.float())) < 1e-5
        else:
            HQ, HK, D = 2, 1, 16  # SHAPES: q_size 32, kv_size 16
            pos = torch.arange(T) * 3
            inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
            table = torch.cat(((torch.arange(32).float()[:, None] * inv).cos(),
                               (torch.arange(32).float()[:, None] * inv).sin()), -1)
            kc, vc = torch.zeros(2, 8, HK, D), torch.zeros(2, 8, HK, D)
            tops.rope_store_kv(y, pos, table, HQ, HK, D, kc, vc, torch.arange(T), d)
            q, k, v = want.float().split([HQ * D, HK * D, HK * D], 1)
            assert rel_err(y[:, :HQ * D].reshape(T, HQ, D), rope_reference(q.reshape(T, HQ, D), pos, table)) < 1e-5
            assert rel_err(kc.view(-1, HK, D)[:T], rope_reference(k.reshape(T, HK, D), pos, table)) < 1e-5
            assert rel_err(vc.view(-1, HK, D)[:T], v.reshape(T, HK, D)) < 1e-5
        y2, d2 = gb.project_folded(layer, mod, x)  # not deferred: the expand adds it here
        assert d2 is None and rel_err(y2, want) < 1e-5
