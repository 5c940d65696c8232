#!/usr/bin/env python3
"""Writes seed inputs for the `split_metadata` fuzz target into fuzz/corpus/split_metadata/:
well-formed split models of 2 to 4 parts (as gguf-split writes them) in the target's input
format: byte 0 = parts - 1, then per part a u32 LE length and the part's bytes, then a name."""
import os
import struct

def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def kv(key, type_id, payload):
    return string(key) + struct.pack("<I", type_id) + payload

def part(no, count, total, names, first):
    kvs = []
    if first:
        kvs.append(kv("general.architecture", 8, string("llama")))
    kvs.append(kv("split.no", 2, struct.pack("<H", no)))
    kvs.append(kv("split.count", 2, struct.pack("<H", count)))
    kvs.append(kv("split.tensors.count", 5, struct.pack("<i", total)))
    infos = b""
    for i, name in enumerate(names):
        # 32 Q8_0 values (type 8): one 34-byte block, at 64-byte steps.
        infos += string(name) + struct.pack("<IQIQ", 1, 32, 8, 64 * i)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % 32)
    return head + b"\x11" * (64 * len(names))

def seed(groups, name):
    total = sum(len(g) for g in groups)
    out = bytes([len(groups) - 1])
    for no, names in enumerate(groups):
        p = part(no, len(groups), total, names, no == 0)
        out += struct.pack("<I", len(p)) + p
    return out + name.encode()

corpus = os.path.join(os.path.dirname(__file__), "corpus", "split_metadata")
os.makedirs(corpus, exist_ok=True)
seeds = {
    "two": seed([["a"], ["b", "c"]], "m-00001-of-00002.gguf"),
    "three": seed([[], ["a", "b"], ["c"]], "http://h/x-00002-of-00003.gguf?q=1"),
    "four": seed([["a"], ["b"], ["c"], ["d", "e"]], "m-00004-of-00004.gguf"),
}
for name, data in seeds.items():
    with open(os.path.join(corpus, name), "wb") as f:
        f.write(data)
