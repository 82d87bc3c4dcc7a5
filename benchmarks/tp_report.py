"""bench_tp.py's output: the printed summary of one model and the PNG of the run.

    report(name, res["models"][name], W, modes, res["device"])   # rank 0, after each model
    plot(res, W, path)                                            # timings (not --check-only)
"""

from __future__ import annotations

from benchmarks.common import pyplot


def report(name, m, W, modes, device):
    print(f"\n{name}: {m['model']}, {m['layers']} layers on {W} x {device} ({m['layer_reduced']})")
    if m.get("decode"):
        head = " ".join(f"{f'TP={W} {mode}':>16} {'speedup':>8} {'eff':>5}" for mode in modes)
        print(f"{'decode B':>9} {'TP=1 ms':>9} {head}")
        for d in m["decode"]:
            cols = " ".join(f"{d[f'tp{W}_{mode}_ms']:16.2f} {d[f'speedup_{mode}']:8.2f} "
                            f"{d[f'efficiency_{mode}']:5.2f}" for mode in modes)
            print(f"{d['batch']:9d} {d['tp1_ms']:9.2f} {cols}")
    if m.get("prefill"):
        print(f"{'prefill T':>9} {'TP=1 ms':>9} {f'TP={W} ms':>16} {'speedup':>8} {'eff':>5}")
        for p in m["prefill"]:
            print(f"{p['tokens']:9d} {p['tp1_ms']:9.2f} {p[f'tp{W}_ms']:16.2f} {p['speedup']:8.2f} "
                  f"{p['efficiency']:5.2f}")
        for T, rows in m[f"prefill_tp{W}_ms_per_rank"].items():
            print(f"  prefill {T} at TP={W}, each rank's median ms (in the order timed): "
                  + "; ".join(" / ".join(f"{v:.2f}" for v in row) for row in rows))
        for T, tables in m.get(f"prefill_tp{W}_kernels", {}).items():
            for rank, rows in enumerate(tables):
                print(f"  prefill {T}, rank {rank}, top kernels (ms, calls): "
                      + "; ".join(f"{k[:48]} {ms:.2f} x{n}" for k, ms, n in rows[:6]))
    print(f"e4m3 tensors: TP=1 {m.get('e4m3_tensors_tp1')}, TP={W} per rank {m[f'e4m3_tensors_tp{W}_per_rank']}")
    for mode, c in m["correctness"].items():
        what = "fp8" if m["fp8"] else "bf16"
        gp, gd = c[f"tp{W}_graph_vs_eager_prefill_decode"]
        sp, sd = c[f"tp{W}_same_kernels_prefill_decode"]
        print(f"correctness ({mode}): TP=1 err {c[f'tp1_{what}_err']:.4f}, "
              f"TP={W} graphs {c[f'tp{W}_{what}_err']:.4f} / "
              f"eager {c[f'tp{W}_eager_{what}_err']:.4f} (bound {c['bound']:.4f}: {'PASS' if c['pass'] else 'FAIL'}); "
              f"top-1 TP={W} vs TP=1 {c[f'top1_tp{W}_vs_tp1']:.2f}; ranks identical: {c['ranks_identical']}; "
              f"eager run to run identical: {c['eager_deterministic']}")
        print(f"  graph vs eager, default graphs (mixed-step prefill graph, Triton decode): "
              f"{c[f'tp{W}_graph_vs_eager']:.4f} (prefill rows {gp:.4f}, decode rows {gd:.4f}; pair bound "
              f"{c['pair_bound']:.4f}); same kernels (prefill eager, FlashInfer decode in the graphs): "
              f"{c[f'tp{W}_same_kernels_graph_vs_eager']:.4f} (prefill rows {sp:.4f}, decode rows {sd:.4f}), "
              f"bit-identical: {'PASS' if c['graph_eq_eager'] else 'FAIL'}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in m["seconds"].items()), flush=True)


def plot(res, W, path):
    plt = pyplot()
    if plt is None or not res["models"]:
        return
    names = list(res["models"])
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 4 * len(names)), squeeze=False)
    for (a, b), name in zip(axes, names):
        m = res["models"][name]
        if m["decode"]:
            _decode_panel(a, name, m, W, res["all_reduce_modes"])
        if m["prefill"]:
            _prefill_panel(b, name, m, W)
    fig.suptitle(f"TP=1 vs TP={W} on {res['device']} (speedup labels)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _decode_panel(a, name, m, W, modes):
    dec = m["decode"]
    x = [d["batch"] for d in dec]
    a.plot(x, [d["tp1_ms"] for d in dec], "o-", color="C0", label="TP=1")
    for i, mode in enumerate(modes):
        a.plot(x, [d[f"tp{W}_{mode}_ms"] for d in dec], "s-", color=f"C{i + 1}", label=f"TP={W} ({mode})")
        for d in dec:
            a.annotate(f"x{d[f'speedup_{mode}']:.2f}", (d["batch"], d[f"tp{W}_{mode}_ms"]),
                       textcoords="offset points", xytext=(0, -12 - 9 * i), ha="center", fontsize=7,
                       color=f"C{i + 1}")
    a.set(xlabel="batch (requests)", ylabel="ms / decode step", xscale="log",
          title=f"{name} ({m['layers']} layers): decode at context {dec[0]['context']}, graphs")
    a.set_xticks(x, [str(v) for v in x])
    a.minorticks_off()
    a.legend(fontsize=8)


def _prefill_panel(b, name, m, W):
    pre = m["prefill"]
    x = [p["tokens"] for p in pre]
    b.plot(x, [p["tp1_ms"] for p in pre], "o-", label="TP=1")
    b.plot(x, [p[f"tp{W}_ms"] for p in pre], "s-", label=f"TP={W}")
    for p in pre:
        b.annotate(f"x{p['speedup']:.2f} (eff {p['efficiency']:.2f})", (p["tokens"], p[f"tp{W}_ms"]),
                   textcoords="offset points", xytext=(0, -12), ha="center", fontsize=7)
    b.set(xlabel="prompt tokens (batch 1)", ylabel="ms / prefill", xscale="log", yscale="log",
          title=f"{name}: prefill")
    b.set_xticks(x, [str(v) for v in x])
    b.minorticks_off()
    b.legend(fontsize=8)
