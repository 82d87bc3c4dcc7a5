"""Bit-identity guard for refactors: CPU logits of every family, saved or compared bit for bit.

Builds a fixed random tiny checkpoint of each family (tests/conftest.make_checkpoint, seed 0),
runs through TextGenerator.forward_tensor on the CPU (torch backend): a prefill of two requests,
a decode step of both, and a multi-token step (q_lens 3 and 2) over the paged harness, and
collects the float32 logits of every step.

    python tests/tools/dump_logits.py save  /tmp/logits_base.pt   # before a change
    python tests/tools/dump_logits.py check /tmp/logits_base.pt   # after: torch.equal per step

Not a test (its oracle is the code before the change); a tool for refactors that must not
change arithmetic.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest's helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the worktree's packages

from conftest import FAMILIES, PagedHarness, make_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402


def run_family(family: str, root: Path) -> dict[str, torch.Tensor]:
    path = make_checkpoint(root / family, family, seed=0)
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch")
    h = PagedHarness(gen, num_blocks=32, block_size=4, seed=0)
    g = torch.Generator().manual_seed(1)

    def toks(n):
        return torch.randint(0, gen.vocab_size, (n,), generator=g).tolist()

    out = {}
    out["prefill"] = h.step({0: toks(7), 1: toks(5)}, is_prefill=True)
    out["decode"] = h.step({0: toks(1), 1: toks(1)}, is_prefill=False)
    out["multi"] = h.step({0: toks(3), 1: toks(2)}, is_prefill=False)
    out["decode2"] = h.step({0: toks(1), 1: toks(1)}, is_prefill=False)
    return {f"{family}/{k}": v.detach().clone() for k, v in out.items()}


def collect() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            res.update(run_family(family, Path(tmp)))
    return res


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "check"):
        print(__doc__)
        return 2
    mode, path = sys.argv[1], sys.argv[2]
    got = collect()
    if mode == "save":
        torch.save(got, path)
        print(f"saved {len(got)} logits tensors to {path}")
        return 0
    base = torch.load(path)
    bad = [k for k in base if k not in got or not torch.equal(base[k], got[k])]
    bad += [k for k in got if k not in base]
    print(f"{len(base) - len(bad)} / {len(base)} bit-identical" + (f"; differ: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
