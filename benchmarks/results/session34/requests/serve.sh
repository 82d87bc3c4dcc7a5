# serve (issue 27), FINAL CALL: 1 GPU, <= 3 min (server start ~100 s incl. ~95 mixed-graph captures in the warm-up,
# untimed warm passes ~17 s, 3 interleaved pairs ~50 s; bench killed at 170 s whatever happens).
# Branch h/s34-serve (/work/wt/serve), HEAD. Fixes the 13:41 failure (the ahead-of-time mixed-graph capture ran
# outside inference mode: now MixedGraphRunner.capture is @torch.inference_mode and sets the wrapper's cuBLAS
# front end per bucket, CPU-tested). Expect: no 150-230 ms capture steps in the server's passes (the "server
# quarters" lines), HTTP cost ~1-4% (run2's capture-free pair: 3.4%). New line per pair: "on the server's clock"
# (from the first request in the server's hands): the ~260 ms before the first engine step is mostly the load
# generator building 512 openai requests and opening their connections (CPU: pre-built requests on open
# connections reach a handler within 1-13 ms).
# (If you can: copy /work/gpu_requests/serve_wheels/httptools-*.whl into .gpuserve; else h11 as before.)
# Not in this call (time): `python3 -m pytest -q -m cuda tests/text_generator/test_serve_warmup.py` (~20 s).
mkdir -p $OUT/serve
python3 -m pip install -q --no-index --find-links .gpuserve fastapi uvicorn prometheus_client openai httpx > $OUT/serve/pip.log 2>&1
python3 -m pip install -q --no-index --find-links .gpuserve httptools uvloop >> $OUT/serve/pip.log 2>&1 || echo "(no httptools / uvloop wheels)" >> $OUT/serve/pip.log
echo "cores: $(nproc); $(python3 -c 'import importlib.util as u; print("httptools", bool(u.find_spec("httptools")), "uvloop", bool(u.find_spec("uvloop")))')" | tee $OUT/serve/serve.log
timeout 170 python3 benchmarks/bench_serve.py --num-prompts 512 --repeats 3 --rates --no-paced --out $OUT/serve/serve 2>&1 \
  | grep -v "INFO\|it/s\]\|shards" | tee -a $OUT/serve/serve.log
echo "rc=${PIPESTATUS[0]}" | tee -a $OUT/serve/serve.log
