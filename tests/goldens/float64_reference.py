#!/usr/bin/env python3
"""The exact answer for a llama-architecture GGUF: a float64 forward pass (numpy) over its
dequantized weights, teacher-forced on golden records, set beside llama.cpp's goldens and
beside webshard (`runner score`). Where a golden misses the fidelity limits, this says which
side is off: llama.cpp's CPU backend quantizes activations inside quantized products
(Q8_K for the K-quants), webshard keeps them in f32.

    float64_reference.py MODEL.gguf GOLDENS.generate.json RECORDS [--runner PATH] [--backend B]

RECORDS is a comma-separated list of record indices. Needs numpy and gguf-py (llama.cpp's
`gguf` package, for its dequantizers). Normal (non-NeoX) rope, no biases, tied or untied head:
SmolLM2 and its re-quantized variants (docs/ci.md, "Re-quantized SmolLM2").
"""
import argparse
import json
import subprocess

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()[0]


class Llama:
    def __init__(self, path):
        r = GGUFReader(path)
        self.tensors = {t.name: t for t in r.tensors}
        self.d = field(r, "llama.embedding_length")
        self.heads = field(r, "llama.attention.head_count")
        self.kv_heads = field(r, "llama.attention.head_count_kv")
        self.base = field(r, "llama.rope.freq_base")
        self.eps = field(r, "llama.attention.layer_norm_rms_epsilon")
        self.hd = self.d // self.heads
        self.emb = self.weight("token_embd.weight")
        self.head = self.weight("output.weight") if "output.weight" in self.tensors else self.emb
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down"]
        self.layers = [{n: self.weight(f"blk.{i}.{n}.weight") for n in names}
                       for i in range(field(r, "llama.block_count"))]
        self.norm = self.weight("output_norm.weight")

    def weight(self, name):
        t = self.tensors[name]
        shape = list(reversed([int(x) for x in t.shape]))
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x):
        """Pairs (2i, 2i + 1) of each head turned by position * base^(-2i / head_dim)."""
        angle = np.arange(x.shape[0])[:, None] * self.base ** (-np.arange(0, self.hd, 2) / self.hd)
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    def logits(self, ids):
        n, hd, group = len(ids), self.hd, self.heads // self.kv_heads
        x = self.emb[ids]
        causal = np.triu(np.full((n, n), -np.inf), 1)
        for w in self.layers:
            h = self.rms(x, w["attn_norm"])
            q = self.rope((h @ w["attn_q"].T).reshape(n, self.heads, hd))
            k = self.rope((h @ w["attn_k"].T).reshape(n, self.kv_heads, hd))
            v = (h @ w["attn_v"].T).reshape(n, self.kv_heads, hd)
            attended = np.empty((n, self.heads, hd))
            for head in range(self.heads):
                scores = q[:, head] @ k[:, head // group].T / np.sqrt(hd) + causal
                p = np.exp(scores - scores.max(-1, keepdims=True))
                attended[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, head // group]
            x = x + attended.reshape(n, self.d) @ w["attn_output"].T
            h = self.rms(x, w["ffn_norm"])
            gate = h @ w["ffn_gate"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
        return self.rms(x, self.norm) @ self.head.T


def webshard_logits(args, ids):
    """Position -> {id: logit} of webshard's top ids (`runner score`)."""
    command = [args.runner, "score", "-m", args.model, "--ids", ",".join(map(str, ids)),
               "--top", "300", "--json", "--quiet", "--backend", args.backend]
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return [dict(map(tuple, p["top"])) for p in out["positions"]]


def summary(errors):
    return f"mean {np.mean(errors):.3f} max {np.max(errors):.3f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("goldens")
    parser.add_argument("records")
    parser.add_argument("--runner", help="also score with this webshard runner")
    parser.add_argument("--backend", default="vulkan")
    args = parser.parse_args()
    model = Llama(args.model)
    records = json.load(open(args.goldens))["records"]
    for index in map(int, args.records.split(",")):
        record = records[index]
        steps = record["steps"]
        ids = record["prompt_ids"] + [s["id"] for s in steps[:-1]]
        exact = model.logits(np.array(ids))
        ours = webshard_logits(args, ids) if args.runner else None
        first = len(record["prompt_ids"]) - 1
        golden_off, ours_off, ours_golden = [], [], []
        for i, step in enumerate(steps):
            for token, golden in step["top5"]:
                golden_off.append(abs(golden - exact[first + i][token]))
                if ours and token in ours[first + i]:
                    ours_off.append(abs(ours[first + i][token] - exact[first + i][token]))
                    ours_golden.append(abs(ours[first + i][token] - golden))
        line = f"record {index}: llama.cpp golden vs float64 {summary(golden_off)}"
        if ours_off:
            line += (f" | webshard vs float64 {summary(ours_off)}"
                     f" | webshard vs golden {summary(ours_golden)}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
