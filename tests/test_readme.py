"""The README's Python examples run as they stand, so the README cannot rot.

Every ```python block of README.md must follow an HTML comment marking it runnable:
    <!-- runnable -->              a plain script
    <!-- runnable: torchrun N -->  run as `torchrun --standalone --nproc-per-node N block.py`
The plain blocks run one after another in one subprocess, each with globals of its own (one
torch import for all of them keeps the test short); a torchrun block runs under torchrun. Both
see $TEXT_GENERATOR_CACHE pointing at a temporary folder that holds the demo checkpoint, made
once for the session, so `ensure_demo_checkpoint()` in the blocks finds it there and nothing
touches the user's ~/.cache. A block passes when it runs to the end; the blocks carry their
own checks (asserts on what they compute).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# a marker comment (optional), blank lines, then a python fence up to its closing fence
_BLOCK = re.compile(r"(?:<!--\s*runnable(?::\s*torchrun\s+(\d+))?\s*-->\s*\n)?```python\n(.*?)```", re.S)


def readme_blocks() -> list[tuple[str, int | None, str | None]]:
    """-> (id, torchrun ranks or None, source or None when the block is not marked runnable)."""
    text = README.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start(2))  # 1-based line number of the ```python fence
        runnable = m.group(0).startswith("<!--")
        out.append((f"line{line}", int(m.group(1)) if m.group(1) else None, m.group(2) if runnable else None))
    return out


BLOCKS = readme_blocks()


def test_readme_has_runnable_examples_and_only_those():
    assert len(BLOCKS) >= 5, "expected the README's component examples as ```python blocks"
    unmarked = [bid for bid, _, src in BLOCKS if src is None]
    assert not unmarked, f"python blocks without <!-- runnable --> before them (README.md {unmarked})"


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> str:
    """A $TEXT_GENERATOR_CACHE root holding the demo checkpoint (made here once, not per block)."""
    from text_generator.demo import DEMO_NAME, ensure_demo_checkpoint

    root = tmp_path_factory.mktemp("tg_cache")
    ensure_demo_checkpoint(str(root / DEMO_NAME))
    return str(root)


# Runs in the subprocess: each block in a namespace of its own, compiled under the name README.md
# and padded to its own line numbers, so a traceback points at the README line that failed.
_RUNNER = """
import json, sys
for line, source in json.load(open(sys.argv[1])):
    exec(compile("\\n" * line + source, "README.md", "exec"), {"__name__": "__main__"})
    print(f"README.md block at line {line}: ok", flush=True)
"""


def _run(cmd: list[str], cwd: Path, cache: str) -> None:
    env = dict(os.environ, TEXT_GENERATOR_CACHE=cache, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                                  f"--- stderr\n{proc.stderr[-6000:]}")


def test_readme_python_blocks_run(demo_cache, tmp_path):
    """The plain blocks, in README order, in one interpreter (one torch import instead of one a
    block), each with fresh globals: a block that leans on another's imports or names fails."""
    blocks = [(int(bid[4:]), src) for bid, ranks, src in BLOCKS if src is not None and ranks is None]
    todo = tmp_path / "blocks.json"
    todo.write_text(json.dumps(blocks))
    _run([sys.executable, "-c", _RUNNER, str(todo)], tmp_path, demo_cache)


@pytest.mark.parametrize("bid, ranks, source", [b for b in BLOCKS if b[1] is not None and b[2] is not None],
                         ids=[b[0] for b in BLOCKS if b[1] is not None and b[2] is not None])
def test_readme_torchrun_block_runs(bid, ranks, source, demo_cache, tmp_path):
    script = tmp_path / "example.py"
    # the block runs to its end, then each rank leaves at once: a normal interpreter exit after
    # destroy_process_group aborts now and then on the shared 2-core machines (a gloo thread's
    # "terminate called without an active exception" at teardown), after the example has done its work
    script.write_text(source + "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_sys.stderr.flush()\n_os._exit(0)\n")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
          str(script)], tmp_path, demo_cache)
