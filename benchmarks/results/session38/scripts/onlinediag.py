"""Why online FP8 on CUDA does not hold the block checkpoint's bytes: quantize_block_fp8 on CUDA vs CPU, and per tensor."""
import os, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
import torch
import model_wrapper  # noqa: F401
sys.path[:0] = [os.path.join(os.getcwd(), "tests"), os.path.join(os.getcwd(), "tests", "model_wrapper")]
from model_wrapper.online_fp8 import quantize_block_fp8
from fp8_checkpoints import quantize, write_fp8
from conftest import make_checkpoint
from text_generator import TextGenerator

torch.manual_seed(0)
for shape in [(384, 256), (200, 72), (4096, 1000)]:
    w = torch.randn(*shape) * 0.02
    qc, sc = quantize_block_fp8(w, "cuda")
    qh, sh = quantize_block_fp8(w)
    qt, st, _ = quantize(w, "block")
    d = (qc.view(torch.uint8) != qh.view(torch.uint8))
    print(f"ONL {shape}: cuda==cpu bytes {not d.any().item()} ({int(d.sum())} differ), scales {torch.equal(sc, sh)}; "
          f"cpu==test quantizer {torch.equal(qh.view(torch.uint8), qt.view(torch.uint8))}", flush=True)
    if d.any():
        i = d.nonzero()[0].tolist()
        print("   first:", i, w[i[0], i[1]].item(), qc[i[0], i[1]].float().item(), qh[i[0], i[1]].float().item())
root = Path(tempfile.mkdtemp())
src = make_checkpoint(root / "src", "llama")
ckpt, _, _ = write_fp8(src, root / "block", "block", ignore=("lm_head", "gate", "shared_expert_gate"))
a = TextGenerator.from_pretrained(src, device="cuda", dtype=torch.bfloat16, quantization="fp8").model_wrapper.model
b = TextGenerator.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16).model_wrapper.model
pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
for n in pa:
    x, y = pa[n], pb.get(n)
    if y is None or x.shape != y.shape or x.dtype != y.dtype:
        print("ONL param", n, tuple(x.shape), x.dtype, None if y is None else (tuple(y.shape), y.dtype)); continue
    xv, yv = (x.view(torch.uint8), y.view(torch.uint8)) if x.dtype == torch.float8_e4m3fn else (x, y)
    if not torch.equal(xv, yv):
        print("ONL differs", n, x.dtype, int((xv != yv).sum()), "of", x.numel(), flush=True)
print("ONL done")
