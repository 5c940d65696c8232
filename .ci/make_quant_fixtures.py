#!/usr/bin/env python3
"""Writes tests/fixtures/quant/<type>.json: seeded random GGUF blocks of Q2_K, Q3_K, IQ4_NL and
IQ4_XS and their values as llama.cpp's own gguf-py dequantizes them, so that the Rust CPU
references are checked against an independent implementation without Python in CI.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install gguf==0.19.0
    /tmp/venv/bin/python .ci/make_quant_fixtures.py

Each file holds `bytes` (the blocks, hex) and `values` (the f32 results, hex of their
little-endian bits, so they compare bit for bit).
"""

import json
import pathlib
from importlib.metadata import version

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 20261201
# type: (blocks, byte offsets of the block's f16 scales)
TYPES = {
    T.Q2_K: (2, [80, 82]),
    T.Q3_K: (2, [108]),
    T.IQ4_NL: (8, [0]),
    T.IQ4_XS: (2, [0]),
}
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"


def random_blocks(rng, qtype, blocks, scale_offsets):
    """Random bits everywhere but the f16 scales, which are finite, of either sign and of
    varied magnitude (raw random bits could be NaN or infinite)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
    for offset in scale_offsets:
        scales = (rng.uniform(-1.0, 1.0, blocks) * 2.0 ** rng.integers(-8, 2, blocks))
        data[:, offset:offset + 2] = scales.astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return data, block_size


def main():
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    for qtype, (blocks, scale_offsets) in TYPES.items():
        data, block_size = random_blocks(rng, qtype, blocks, scale_offsets)
        values = dequantize(data.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == blocks * block_size and np.isfinite(values).all()
        fixture = {
            "type": qtype.name,
            "generator": f"gguf-py {version('gguf')} gguf.quants.dequantize, numpy seed {SEED}",
            "blocks": blocks,
            "bytes": data.tobytes().hex(),
            "values": values.astype("<f4").tobytes().hex(),
        }
        path = OUT / f"{qtype.name.lower()}.json"
        path.write_text(json.dumps(fixture, indent=1) + "\n")
        print(f"{path}: {blocks} blocks, {values.size} values")


if __name__ == "__main__":
    main()
