"""P3 option ``weight_bytes``: the bytes of the weights themselves, read from file headers.

Seed 001 sizes models by their files (its known limitation 1). With this option a ``.safetensors``
file counts the byte ranges its header lists, and a ``.gguf`` file counts its tensors by their
quantisation types (block size and bytes per block as ggml defines them), so metadata such as a
tokenizer vocabulary does not count. A diffusion model loaded with ``weight_dtype`` fp8 counts one byte
per floating-point element, as ComfyUI casts it. Only the header is read (never the weights), and only
from a file the scan has already found inside a model folder. Other formats fall back to the file size.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

# ggml type id -> (elements per block, bytes per block); the table of gguf-py's GGML_QUANT_SIZES
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FN": 1, "F8_E5M2FNUZ": 1, "F8_E4M3FNUZ": 1, "F8_E8M0": 1,
    "I8": 1, "U8": 1, "BOOL": 1,
}
_FLOAT_WIDE = {"F64", "F32", "F16", "BF16"}
FP8_WEIGHT_DTYPES = {"fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"}
MAX_SAFETENSORS_HEADER = 256 * 1024 * 1024  # the safetensors format's own limit is 100 MB
_MAX_GGUF_COUNT = 10_000_000

_CACHE: dict[tuple[str, int, int, str], WeightInfo] = {}


@dataclass(frozen=True)
class WeightInfo:
    """Weight bytes of one file and how they were found."""

    bytes: int
    method: str  # safetensors | gguf | file_size
    tensors: int = 0
    note: str | None = None


class HeaderError(ValueError):
    """A model file's header cannot be read."""


def safetensors_weight_bytes(f: BinaryIO, file_size: int, cast_fp8: bool = False) -> WeightInfo:
    """Sum of the tensors' byte ranges in a safetensors header (``cast_fp8``: floats as 1 byte)."""
    raw = f.read(8)
    if len(raw) != 8:
        raise HeaderError("file shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_SAFETENSORS_HEADER or n + 8 > file_size:
        raise HeaderError(f"safetensors header length {n} is not plausible for a {file_size}-byte file")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise HeaderError("safetensors header is not an object")
    total = count = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or not isinstance(t.get("data_offsets"), list) or len(t["data_offsets"]) != 2:
            raise HeaderError(f"safetensors tensor {name!r} has no data_offsets")
        begin, end = t["data_offsets"]
        size = int(end) - int(begin)
        if cast_fp8 and t.get("dtype") in _FLOAT_WIDE:
            numel = 1
            for d in t.get("shape") or []:
                numel *= int(d)
            size = numel
        total += size
        count += 1
    return WeightInfo(total, "safetensors", count, "fp8 cast: float tensors at 1 byte" if cast_fp8 else None)


class _Reader:
    """Little-endian reads over a buffered file, for the GGUF header."""

    def __init__(self, f: BinaryIO):
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise HeaderError("GGUF header ends early")
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def skip_string(self) -> None:
        n = self.u64()
        if n > 1 << 30:
            raise HeaderError("GGUF string length not plausible")
        self.f.seek(n, os.SEEK_CUR)

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 20:
            raise HeaderError("GGUF key length not plausible")
        return self.take(n).decode("utf-8", "replace")


# GGUF metadata value types: fixed widths (8 = string, 9 = array)
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(r: _Reader, vtype: int) -> None:
    if vtype in _GGUF_FIXED:
        r.f.seek(_GGUF_FIXED[vtype], os.SEEK_CUR)
    elif vtype == 8:
        r.skip_string()
    elif vtype == 9:
        etype, count = r.u32(), r.u64()
        if count > _MAX_GGUF_COUNT * 100:
            raise HeaderError("GGUF array length not plausible")
        if etype in _GGUF_FIXED:
            r.f.seek(_GGUF_FIXED[etype] * count, os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(r, etype)
    else:
        raise HeaderError(f"unknown GGUF metadata value type {vtype}")


def gguf_weight_bytes(f: BinaryIO) -> WeightInfo:
    """Sum of the tensors' sizes in a GGUF (v2/v3) header, by each tensor's ggml type."""
    r = _Reader(f)
    if r.take(4) != b"GGUF":
        raise HeaderError("not a GGUF file (magic bytes differ)")
    version = r.u32()
    if version < 2:
        raise HeaderError(f"GGUF version {version} is not supported (v2 or later)")
    n_tensors, n_kv = r.u64(), r.u64()
    if n_tensors > _MAX_GGUF_COUNT or n_kv > _MAX_GGUF_COUNT:
        raise HeaderError("GGUF counts not plausible")
    for _ in range(n_kv):
        r.skip_string()
        _skip_value(r, r.u32())
    total = 0
    for _ in range(n_tensors):
        r.skip_string()
        n_dims = r.u32()
        if n_dims > 8:
            raise HeaderError("GGUF tensor has more than 8 dimensions")
        numel = 1
        for _ in range(n_dims):
            numel *= r.u64()
        ttype = r.u32()
        r.u64()  # data offset
        if ttype not in GGML_TYPE_SIZES:
            raise HeaderError(f"unknown ggml tensor type {ttype}")
        block, nbytes = GGML_TYPE_SIZES[ttype]
        total += (numel // block) * nbytes
    return WeightInfo(total, "gguf", n_tensors)


def weight_bytes(path: str, size_bytes: int, options: dict[str, Any] | None = None) -> WeightInfo:
    """Weight bytes of a model file the scan found (cached by path, size and mtime).

    Falls back to the file size, with a note, for formats without a header (pickled checkpoints)
    and for headers that cannot be read.
    """
    cast_fp8 = str((options or {}).get("weight_dtype", "")).lower() in FP8_WEIGHT_DTYPES
    try:
        st = os.stat(path)
    except OSError as exc:
        return WeightInfo(size_bytes, "file_size", note=f"cannot stat: {exc.strerror}")
    key = (path, st.st_size, st.st_mtime_ns, "fp8" if cast_fp8 else "")
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    lower = path.lower()
    try:
        if lower.endswith((".safetensors", ".sft")):
            with open(path, "rb") as f:
                info = safetensors_weight_bytes(f, st.st_size, cast_fp8)
        elif lower.endswith(".gguf"):
            with open(path, "rb", buffering=1 << 16) as f:
                info = gguf_weight_bytes(f)
        else:
            info = WeightInfo(st.st_size, "file_size", note="no weight header in this format; file size used")
    except (HeaderError, OSError, struct.error) as exc:
        info = WeightInfo(st.st_size, "file_size", note=f"header not readable ({exc}); file size used")
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[key] = info
    return info
