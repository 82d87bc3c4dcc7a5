"""Loader fuzz: seeded random corruptions of a valid tiny checkpoint.

Every case must end in a coded ModelLoadError, or load and match transformers loaded from the
same (mutated) folder, and no single tensor the loader creates may be larger than a small
multiple of the checkpoint file (a config that lies about sizes is refused before allocating).
Seeded, so a failure names a case that reproduces; the case counts keep the module under a
minute on two CPU cores.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conftest import PagedHarness, hf_model
from model_wrapper import ModelErrorCode, ModelLoadError
from text_generator import TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")

CASES_PER_KIND = 24
TOKENS = [3, 1, 4, 1, 5]
DTYPE_TAGS = ["F16", "BF16", "F32", "F64", "F8_E4M3", "I32", "I64", "BOOL", "U8", "F7", "", None, 3]
VALUES = [0, -1, 1, 2, 3, 7, 2**31, 10**12, 1.5, -0.5, "x", "", None, [], [1], {}, True, False,
          float("nan"), float("inf"), 1e-3, 5e5]
CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
                 "tie_word_embeddings", "architectures", "dtype", "sliding_window", "quantization_config",
                 "hidden_act", "attention_bias", "mlp_bias"]


class LargestTensor(TorchDispatchMode):
    """Records the largest storage (bytes) of any non-meta tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


# -- mutations: (rng, folder) -> None, editing the folder's files in place ----------------------

def _header(path):
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _write_header(path, header, data):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def _weights(folder):
    return os.path.join(folder, "model.safetensors")


def truncate(rng, folder):
    path = _weights(folder)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(rng.randrange(size))


def header_byte(rng, folder):
    path = _weights(folder)
    blob = bytearray(open(path, "rb").read())
    n = int.from_bytes(blob[:8], "little")
    for _ in range(rng.randint(1, 3)):
        blob[8 + rng.randrange(n)] = rng.choice(b'0123456789[]{}",: x\x00\xff')
    open(path, "wb").write(bytes(blob))


def header_length(rng, folder):
    path = _weights(folder)
    blob = bytearray(open(path, "rb").read())
    n = int.from_bytes(blob[:8], "little")
    new = rng.choice([0, 1, n - 1, n + 1, len(blob), 2**63, rng.randrange(2**64)])
    open(path, "wb").write(new.to_bytes(8, "little") + bytes(blob[8:]))


def header_entry(rng, folder):
    path = _weights(folder)
    header, data = _header(path)
    name = rng.choice(sorted(k for k in header if k != "__metadata__"))
    entry = header[name]
    what = rng.choice(["shape", "dtype", "offsets", "delete", "rename", "alias", "garbage"])
    if what == "shape":
        shape = entry["shape"]
        entry["shape"] = rng.choice([shape[::-1], shape + [1], shape[:-1], [0] + shape, [10**9] * len(shape),
                                     [d * 2 for d in shape], [-1] + shape[1:], ["4"], 7])
    elif what == "dtype":
        entry["dtype"] = rng.choice(DTYPE_TAGS)
    elif what == "offsets":
        b, e = entry["data_offsets"]
        entry["data_offsets"] = rng.choice([[b, e + 4], [b + 4, e], [e, b], [b, b], [b, 10**12],
                                            [b - 4, e - 4], [0, e - b], "x", [b]])
    elif what == "delete":
        del header[name]
    elif what == "rename":
        header[name + rng.choice(["x", ".extra", "_scale_inv"])] = header.pop(name)
    elif what == "alias":  # a second name for the same bytes
        header[name.replace("layers.0", "layers.7") + ".alias"] = dict(entry)
    else:
        header[name] = rng.choice([None, 3, "x", [], {}])
    _write_header(path, header, data)


def mantissa(rng, folder):
    """Benign: the low byte of one float32 weight changes; must load and match transformers."""
    path = _weights(folder)
    header, data = _header(path)
    name = rng.choice(sorted(k for k in header if k != "__metadata__"))
    b, e = header[name]["data_offsets"]
    data = bytearray(data)
    i = b + 4 * rng.randrange((e - b) // 4)
    data[i] ^= rng.randrange(1, 256)
    _write_header(path, header, bytes(data))


def nonfinite(rng, folder):
    path = _weights(folder)
    t = load_file(path)
    name = rng.choice(sorted(t))
    flat = t[name].view(-1)
    flat[rng.randrange(flat.numel())] = rng.choice([float("nan"), float("inf"), float("-inf")])
    save_file(t, path, metadata={"format": "pt"})


def config_field(rng, folder):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    for _ in range(rng.randint(1, 2)):
        field = rng.choice(CONFIG_FIELDS)
        if rng.random() < 0.15:
            cfg.pop(field, None)
        else:
            cfg[field] = rng.choice(VALUES)
    json.dump(cfg, open(path, "w"))


def config_bytes(rng, folder):
    path = os.path.join(folder, "config.json")
    text = bytearray(open(path, "rb").read())
    if rng.random() < 0.5:
        text = text[: rng.randrange(len(text))]
    else:
        text[rng.randrange(len(text))] = rng.choice(b'{}[]",:0x\xff')
    open(path, "wb").write(bytes(text))


def index_trick(rng, folder):
    path = os.path.join(folder, "model.safetensors.index.json")
    index = json.load(open(path))
    wm = index["weight_map"]
    files = sorted(set(wm.values()))
    name = rng.choice(sorted(wm))
    what = rng.choice(["dotdot", "absolute", "absent", "other_shard", "drop", "add", "type", "list", "empty"])
    if what == "dotdot":
        shutil.copy(os.path.join(folder, wm[name]), os.path.join(folder, "..", "escaped.safetensors"))
        wm[name] = "../escaped.safetensors"
    elif what == "absolute":
        wm[name] = os.path.abspath(os.path.join(folder, wm[name]))
    elif what == "absent":
        wm[name] = "model-99999-of-99999.safetensors"
    elif what == "other_shard":
        wm[name] = rng.choice([f for f in files if f != wm[name]])
    elif what == "drop":
        del wm[name]
    elif what == "add":
        wm["model.layers.9.mlp.up_proj.weight"] = files[0]
    elif what == "type":
        wm[name] = rng.choice([None, 3, [files[0]], {}])
    elif what == "list":
        index["weight_map"] = sorted(wm.items())
    else:
        index["weight_map"] = {}
    json.dump(index, open(path, "w"))


MUTATIONS = [truncate, header_byte, header_length, header_entry, mantissa, nonfinite, config_field, config_bytes,
             index_trick]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """(single-file llama checkpoint, the same model saved as several shards with an index)."""
    from conftest import make_checkpoint

    base = tmp_path_factory.mktemp("fuzz_src")
    single = make_checkpoint(base / "single", "llama")
    hf_model(single).save_pretrained(str(base / "sharded"), max_shard_size="20KB")
    return single, str(base / "sharded")


def _prefill(gen, tokens):
    return PagedHarness(gen, 16, 8).step({0: tokens}, is_prefill=True)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_loader_fuzz(sources, tmp_path, mutation):
    single, sharded = sources
    src = sharded if mutation is index_trick else single
    limit = 4 * sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    outcomes = {}
    for case in range(CASES_PER_KIND):
        rng = random.Random(f"{mutation.__name__}-{case}")
        folder = str(tmp_path / f"case{case}" / "ckpt")
        shutil.copytree(src, folder)
        mutation(rng, folder)
        where = f"{mutation.__name__} case {case}"
        tracker = LargestTensor()
        try:
            with tracker:
                gen = TextGenerator.from_pretrained(folder, device="cpu")
        except ModelLoadError as e:
            assert isinstance(e.code, ModelErrorCode) and str(e).startswith(f"[{e.code.value}] "), where
            outcomes[e.code.name] = outcomes.get(e.code.name, 0) + 1
        else:
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
            ours = _prefill(gen, TOKENS)
            with torch.no_grad():
                want = hf_model(folder)(torch.tensor([TOKENS])).logits[0]
            scale = want.abs().max()
            assert math.isfinite(scale) and float((ours - want).abs().max()) <= 1e-4 * float(scale), where
        assert tracker.largest <= limit, f"{where}: a {tracker.largest}-byte tensor for a {limit // 4}-byte checkpoint"
        shutil.rmtree(tmp_path / f"case{case}")
    if mutation is mantissa:
        assert outcomes == {"loaded": CASES_PER_KIND}
    elif mutation is nonfinite:
        assert outcomes == {"NONFINITE_WEIGHT": CASES_PER_KIND}
