"""An OpenAI-compatible HTTP server over the reference engine (the `serve` extra).

args.py        the `serve` subcommand's flags (no HTTP imports: the CLI always builds them)
server.py      flags -> model, engine, app; `run` starts uvicorn
app.py         the FastAPI routes;  protocol.py  the request schema;  params.py  -> SamplingParams
responses.py   response bodies and SSE chunks
engine_client.py  the HTTP process's handle on the engine process;  engine_worker.py  that process
metrics.py     Prometheus metrics;  errors.py  OpenAI error bodies

The library never imports this package; importing it needs fastapi, uvicorn and prometheus_client.
"""

import importlib

# name -> module; loaded on first use, so that the CLI can read args.py without the serve extra
_EXPORTS = {"ServerState": "app", "build_app": "app", "EngineClient": "engine_client", "RequestGroup": "engine_client",
            "build_state": "server", "run": "server"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'text_generator.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"text_generator.serve.{_EXPORTS[name]}"), name)
