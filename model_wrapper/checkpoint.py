"""A checkpoint folder's files, read and checked before any model memory is allocated.

From a local folder (config.json + model.safetensors, or shards named by
model.safetensors.index.json) this module finds the weight files, refuses any that resolve
outside the folder, and parses every safetensors header itself (the 8-byte length, then JSON:
name -> dtype, shape, data_offsets), so that a truncated file, a header whose offsets run past
the end of the file or whose byte counts do not match the shape, a tensor in two shards, or an
index that disagrees with its shards is a coded ModelLoadError before anything is read or sized
by the config. The loader (loader.py) then compares these shapes with the model it is about to
build and reads the data.

    safetensors file:  [u64 little-endian n][n bytes of JSON header][data ...]
    tensor entry:      {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}
                       bytes [8 + n + begin, 8 + n + end) of the file, end - begin = r * c * 4
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass

from model_wrapper.errors import ModelErrorCode, ModelLoadError

INDEX = "model.safetensors.index.json"
MAX_JSON_BYTES = 64 << 20  # config.json / index / header: real ones are under a few MiB

# safetensors dtype tag -> bytes per element. The float types load (cast to the serving dtype);
# the others are recognised so that the refusal can name them.
FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
OTHER_DTYPES = {"F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4,
                "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry: the file holding it, its dtype tag and its shape."""

    file: str
    dtype: str
    shape: tuple[int, ...]


def resolve_file(folder: str, name: str, what: str) -> str:
    """The real path of `name` inside checkpoint `folder`; refuses anything that leaves it.

    Absolute names, `..` and symlinks resolving outside the folder are refused, except the
    Hugging Face hub cache layout (<repo>/snapshots/<rev>/file -> <repo>/blobs/<hash>), where
    every file of a downloaded snapshot is such a link. Only regular files are accepted (a FIFO
    or a device would block or never end).
    """
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\0" in name:
        raise ModelLoadError(ModelErrorCode.UNSAFE_PATH,
                             f"{what}: expected a file name relative to the checkpoint folder, got {name!r}")
    root = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(root, name))
    allowed = [root]
    if os.path.basename(os.path.dirname(root)) == "snapshots":
        allowed.append(os.path.join(os.path.dirname(os.path.dirname(root)), "blobs"))
    if not any(os.path.commonpath([real, a]) == a for a in allowed):
        raise ModelLoadError(ModelErrorCode.UNSAFE_PATH,
                             f"{what}: expected a file inside the checkpoint folder {folder!r}, got {name!r} "
                             f"(resolves to {real!r})")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise ModelLoadError(ModelErrorCode.MISSING_FILE,
                             f"{what}: {name!r} not found in checkpoint folder {folder!r}") from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(ModelErrorCode.UNSAFE_PATH, f"{what}: expected a regular file, got {name!r}")
    return real


def read_json_object(path: str, what: str, *, unique_keys: bool = False) -> dict:
    """A JSON file that must hold an object (config.json, the index); any defect is coded.

    unique_keys: refuse a key given twice in any object (json keeps the last one silently)."""
    try:
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise ModelLoadError(ModelErrorCode.CORRUPT_FILE,
                                 f"{what}: expected at most {MAX_JSON_BYTES} bytes, got {os.path.getsize(path)}")
        with open(path, "rb") as f:
            # NaN / Infinity parse: the config's field checks name them
            raw = json.loads(f.read().decode("utf-8"), object_pairs_hook=_unique_keys if unique_keys else None)
    except ModelLoadError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelLoadError(ModelErrorCode.CORRUPT_FILE, f"{what}: expected valid JSON, got an error: {e}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(ModelErrorCode.CORRUPT_FILE,
                             f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _no_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")  # NaN / Infinity are not JSON


def _unique_keys(pairs: list) -> dict:
    """json object_pairs_hook: a name given twice would silently keep only the last."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def shard_names(folder: str) -> tuple[list[str], dict[str, str] | None]:
    """The weight files to read (relative names) and the index's weight_map (None without one)."""
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        raise ModelLoadError(ModelErrorCode.MISSING_FILE,
                             f"checkpoint path: expected a local folder, got {folder!r}")
    if os.path.lexists(os.path.join(folder, INDEX)):
        weight_map = read_json_object(resolve_file(folder, INDEX, INDEX), INDEX, unique_keys=True).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(ModelErrorCode.BAD_INDEX,
                                 f"{INDEX}: expected a non-empty 'weight_map' object (tensor name -> file), "
                                 f"got {type(weight_map).__name__}")
        bad = [(k, v) for k, v in weight_map.items() if not isinstance(v, str)]
        if bad:
            raise ModelLoadError(ModelErrorCode.BAD_INDEX,
                                 f"{INDEX} weight_map: expected file names, got e.g. {bad[:3]}")
        return sorted(set(weight_map.values())), weight_map
    if os.path.lexists(os.path.join(folder, "model.safetensors")):
        return ["model.safetensors"], None
    names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if names:
        return names, None
    others = sorted(f for f in os.listdir(folder) if f.endswith((".bin", ".pt", ".pth", ".ckpt")))
    if others:
        raise ModelLoadError(
            ModelErrorCode.UNSUPPORTED_FORMAT,
            f"weights: expected *.safetensors (pickle files are never loaded), got {others[:3]} in {folder!r}; "
            "convert once with transformers: AutoModelForCausalLM.from_pretrained(folder)"
            ".save_pretrained(new_folder, safe_serialization=True)")
    raise ModelLoadError(ModelErrorCode.MISSING_FILE, f"no *.safetensors weights in {folder!r}")


def read_header(path: str, name: str) -> dict[str, TensorInfo]:
    """Parse and check one safetensors file's header: tensor name -> TensorInfo.

    Checked: the header fits the file, is a JSON object of entries with a known dtype, a shape
    of non-negative ints and data_offsets whose length is the shape's byte count and that lie
    inside the file's data, one after another without overlap.
    """
    def corrupt(msg: str) -> ModelLoadError:
        return ModelLoadError(ModelErrorCode.CORRUPT_FILE, f"{name}: {msg}")

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise corrupt(f"expected a safetensors file (8-byte header length), got {size} bytes")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, MAX_JSON_BYTES):
                raise corrupt(f"header length {n} runs past the end of the file ({size} bytes)")
            text = f.read(n)
        header = json.loads(text.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except ModelLoadError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise corrupt(f"expected a safetensors JSON header, got an error: {e}") from None
    if not isinstance(header, dict):
        raise corrupt(f"expected a JSON object header, got {type(header).__name__}")
    data_size = size - 8 - n
    out, spans = {}, []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise corrupt(f"tensor {key!r}: expected an object entry, got {entry!r}")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in FLOAT_DTYPES and dtype not in OTHER_DTYPES:
            raise corrupt(f"tensor {key!r}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
            raise corrupt(f"tensor {key!r}: expected a shape of non-negative ints, got {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise corrupt(f"tensor {key!r}: data_offsets {offsets!r} outside the file's {data_size} data bytes")
        nbytes = math.prod(shape) * {**FLOAT_DTYPES, **OTHER_DTYPES}[dtype]
        if offsets[1] - offsets[0] != nbytes:
            raise corrupt(f"tensor {key!r}: shape {shape} of {dtype} needs {nbytes} bytes, "
                          f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
        out[key] = TensorInfo(name, dtype, tuple(shape))
        spans.append((offsets[0], offsets[1], key))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise corrupt(f"tensors {a!r} and {b!r} overlap in the data section")
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_checkpoint(folder: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """All tensors of the checkpoint from the headers (name -> TensorInfo), and name -> real path.

    Raises DUPLICATE_TENSOR when two shards hold one name and BAD_INDEX when the index's
    weight_map and the shards' headers disagree.
    """
    names, weight_map = shard_names(folder)
    paths = {n: resolve_file(folder, n, INDEX if weight_map is not None else "weights") for n in names}
    tensors: dict[str, TensorInfo] = {}
    for n in names:
        for key, info in read_header(paths[n], n).items():
            if key in tensors:
                raise ModelLoadError(ModelErrorCode.DUPLICATE_TENSOR,
                                     f"tensor {key!r}: expected in one shard, got it in {tensors[key].file!r} "
                                     f"and {n!r}")
            tensors[key] = info
    if weight_map is not None:
        wrong = sorted(k for k in set(weight_map) | set(tensors)
                       if k not in tensors or weight_map.get(k) != tensors[k].file)
        if wrong:
            shown = [(k, weight_map.get(k), tensors[k].file if k in tensors else None) for k in wrong[:3]]
            raise ModelLoadError(ModelErrorCode.BAD_INDEX,
                                 f"{INDEX}: weight_map disagrees with the shards' headers for {len(wrong)} "
                                 f"tensor(s), e.g. (name, index says, shard holds) {shown}")
    return tensors, paths
