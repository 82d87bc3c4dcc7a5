import os, sys, re, subprocess, tempfile
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "tests/kernels")
import triton
from sm90_compile import compile_sm90, stack_bytes, mma_products
from model_wrapper.kernels import decode_attention as da
P = dict(q_ptr="*bf16", indptr_ptr="*i32", indices_ptr="*i32", last_ptr="*i32", o_ptr="*bf16",
         part_ptr="*fp32", lse_ptr="*fp32", ks_ptr="*fp32", vs_ptr="*fp32", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv")
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
for math in sys.argv[1:]:
    for bn, st in ((64, 5),):
        k = compile_sm90(da._decode_kernel, P, dict(PAGE=16, GROUP=4, GROUP_PAD=int(os.environ.get("GP", 16)), D=128, BLOCK_N=bn, SPLITS=4, FP8=True,
                         MATH=da.FP8_MATHS[math], INTERPRET=False, PDL=True, PF_LINES=0), scalars=("scale_log2",),
                         aligned=True, num_warps=4, num_stages=st, maxnreg=128)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"]); f.flush()
            sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout
        ins = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/\s+[A-Z@]", l)]
        mm = sorted(set(re.findall(r"\b(HMMA\.\S+|QMMA\.\S+|HGMMA\S*|QGMMA\S*)", sass)))
        print(math, bn, st, "instr", len(ins), "stack", stack_bytes(k), mm[:4])
        open(f"/tmp/sass_{math}.txt", "w").write(sass)
