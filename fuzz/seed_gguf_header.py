#!/usr/bin/env python3
"""Writes seed inputs for the `gguf_header` fuzz target into fuzz/corpus/gguf_header/: the first
64 KiB of every model in models/ (or WEBSHARD_MODELS), each part of well-formed 2- and 3-part
split models as gguf-split writes them (the `split.*` keys), and a header whose tensors lie past
2^32 bytes (a 5 GiB F32 tensor, then Q8_0 and F16 ones), so the fuzzer starts from the
split-file and big-offset paths as well as from real headers."""
import glob
import importlib.util
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("split_seeds", os.path.join(HERE, "seed_split_metadata.py"))
split_seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split_seeds)
string, kv, part = split_seeds.string, split_seeds.kv, split_seeds.part


def big_offsets():
    kvs = kv("general.architecture", 8, string("llama")) + kv("general.alignment", 4, struct.pack("<I", 32))
    n = 1_342_177_280  # 5 GiB of f32
    infos = string("token_embd.weight") + struct.pack("<IQQIQ", 2, 4096, n // 4096, 0, 0)
    offset = n * 4
    infos += string("output.weight") + struct.pack("<IQQIQ", 2, 4096, 32, 8, offset)
    offset += 4096 * 32 // 32 * 34
    offset += -offset % 32
    infos += string("blk.0.attn_norm.weight") + struct.pack("<IQIQ", 1, 4096, 1, offset)
    head = b"GGUF" + struct.pack("<IQQ", 3, 3, 2) + kvs + infos
    return head + b"\0" * (-len(head) % 32)


corpus = os.path.join(HERE, "corpus", "gguf_header")
os.makedirs(corpus, exist_ok=True)
seeds = {"big-offsets": big_offsets()}
for count in (2, 3):
    for no in range(count):
        names = [f"a{no}", f"b{no}"]
        seeds[f"split-{no + 1}-of-{count}"] = part(no, count, 2 * count, names, no == 0)
models = os.environ.get("WEBSHARD_MODELS") or os.path.join(HERE, "..", "models")
for model in sorted(glob.glob(os.path.join(models, "*.gguf"))):
    with open(model, "rb") as f:
        seeds[os.path.basename(model) + ".head"] = f.read(65536)
for name, data in seeds.items():
    with open(os.path.join(corpus, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {corpus}")
