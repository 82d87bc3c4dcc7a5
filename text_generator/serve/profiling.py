"""TG_SERVE_PROFILE=DIR: cProfile the server's two processes (benchmarks/profile_serve.py sets it).

The HTTP process writes DIR/http.prof when uvicorn returns, the engine process DIR/engine.prof when
its loop ends (`pstats` or snakeviz read them). Unset (the default) costs nothing: `profiled` calls
the function directly.
"""

from __future__ import annotations

import os
from typing import Callable


def profiled(name: str, fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), under cProfile when TG_SERVE_PROFILE names a folder (stats saved to
    DIR/<name>.prof however fn ends)."""
    folder = os.environ.get("TG_SERVE_PROFILE")
    if not folder:
        return fn(*args, **kwargs)
    import cProfile

    os.makedirs(folder, exist_ok=True)
    prof = cProfile.Profile()
    try:
        return prof.runcall(fn, *args, **kwargs)
    finally:
        prof.dump_stats(os.path.join(folder, f"{name}.prof"))
