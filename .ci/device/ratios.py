#!/usr/bin/env python3
"""Ratio tables from one device run (run.sh llama-bench / serve-bench), in Markdown.

    ratios.py bench DIR   every DIR/bench-NAME.json (runner bench --json) beside
                          DIR/llama-bench-NAME.json (llama-bench -o json): tok/s and ratios
    ratios.py serve DIR   DIR/serve.jsonl (bench_serve.py --json rows labelled webshard and
                          llama-server): aggregate decode tok/s per model and stream count
"""

import glob
import json
import os
import sys


def bench_table(folder):
    print("| model | test | webshard tok/s | llama.cpp tok/s (backend) | ratio |")
    print("|---|---|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(folder, "bench-*.json"))):
        name = os.path.basename(path)[len("bench-"):-len(".json")]
        peer_path = os.path.join(folder, f"llama-bench-{name}.json")
        if not os.path.exists(peer_path):
            continue
        ours = {t["test"]: t["tok_s"] for t in json.load(open(path))["tests"]}
        peer = {}
        for run in json.load(open(peer_path)):
            test = f"pp{run['n_prompt']}" if run["n_gen"] == 0 else f"tg{run['n_gen']}"
            peer[test] = (run["avg_ts"], run.get("backends", "?"))
        for test, rate in ours.items():
            if test in peer:
                theirs, backend = peer[test]
                print(f"| {name} | {test} | {rate:.1f} | {theirs:.1f} ({backend}) | {rate / theirs:.2f}× |")


def serve_table(folder):
    rows = [json.loads(line) for line in open(os.path.join(folder, "serve.jsonl"))]
    table = {}
    for row in rows:
        table[(row["model"], row["streams"], row["label"])] = row
    print("| model | streams | webshard tok/s (ms/step) | llama-server tok/s | ratio | TTFT p50 ms (ours / theirs) |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, streams in sorted({(m, s) for m, s, _ in table}):
        ours = table.get((model, streams, "webshard"))
        peer = table.get((model, streams, "llama-server"))
        if not ours or not peer:
            continue
        step = f" ({ours['ms_per_step']:.2f})" if ours.get("ms_per_step") else ""
        ratio = ours["aggregate_tok_s"] / peer["aggregate_tok_s"] if peer["aggregate_tok_s"] else 0
        print(f"| {model} | {streams} | {ours['aggregate_tok_s']:.1f}{step} | "
              f"{peer['aggregate_tok_s']:.1f} | {ratio:.2f}× | "
              f"{ours['ttft_p50_s'] * 1e3:.0f} / {peer['ttft_p50_s'] * 1e3:.0f} |")
    for model in sorted({m for m, _, _ in table}):
        one = table.get((model, 1, "webshard"))
        sixteen = table.get((model, 16, "webshard"))
        if one and sixteen and one["aggregate_tok_s"]:
            print(f"\n{model}: 16 streams give {sixteen['aggregate_tok_s'] / one['aggregate_tok_s']:.1f}× "
                  "one stream's aggregate")


if __name__ == "__main__":
    {"bench": bench_table, "serve": serve_table}[sys.argv[1]](sys.argv[2])
