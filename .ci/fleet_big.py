#!/usr/bin/env python3
"""A model no donor can hold, on one machine: a llama-7B-shaped synthetic model (hidden 4096,
32 layers, FFN 11008, 32 heads, every layer matrix Q4_K: 4.0 GB) written by the test model
example, run by three `runner donor` processes each capped (`--gpu-mem-mib`) at about a third
of it under `runner coordinate`, and by a single device beside them. The ids must be equal;
prints both decode speeds and the plan as one JSON line, then a sentence.

    python3 .ci/fleet_big.py RUNNER OUTDIR [--n 64] [--ctx 512] [--donors 3] [--share 0.42]
        [--backend vulkan] [--shape "--hidden 4096 --ffn 11008 --heads 32 --kv-heads 32
        --layers 32 --matrices Q4_K"] [--example PATH]

RUNNER is a `runner` binary; the example beside it (`target/release/examples/test_model`, built
by `cargo build --release --example test_model`, or --example) writes OUTDIR/big.gguf with
SmolLM2's tokenizer from WEBSHARD_MODELS (default models/). The model is kept for reruns
(delete OUTDIR by hand); the processes' logs go there too. Each donor offers --share of the
model's bytes (under half, so no donor can hold it; three together hold it with its KV cache
at --ctx, one slot: 0.54 GB at 512 for this shape). Every process is killed on exit; every
wait has a limit. Tested on lavapipe with `--n 8 --ctx 64 --shape "--hidden 512 --ffn 1536
--heads 8 --kv-heads 8 --layers 24 --matrices Q4_K"` (0.10 GB, three donors of 36 MiB).
"""

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time

from child_log import ChildLog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "fleet-big"
PROMPT = "The capital of France is"
SHAPE_7B = "--hidden 4096 --ffn 11008 --heads 32 --kv-heads 32 --layers 32 --matrices Q4_K"
LIMIT = 1800
CHILDREN = []


def spawn(args, **kw):
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, **kw)
    CHILDREN.append(p)
    return p


def cleanup():
    for p in CHILDREN:
        if p.poll() is None:
            p.kill()
    for p in CHILDREN:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def write_model(a, path):
    """The model at `path`, written unless a file of this shape is there already."""
    stamp = path + ".shape"
    if os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == a.shape:
        return
    example = a.example or os.path.join(os.path.dirname(os.path.abspath(a.runner)), "examples",
                                        "test_model")
    started = time.time()
    subprocess.run([example, path, "1", *shlex.split(a.shape)], check=True, timeout=LIMIT,
                   stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        f.write(a.shape)
    print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB) in {time.time() - started:.0f} s",
          file=sys.stderr)


def single(a, path):
    """Single-device ids and decode tok/s."""
    r = subprocess.run([a.runner, "generate", "-m", path, "-p", PROMPT, "-n", str(a.n),
                        "--temp", "0", "--ctx", str(a.ctx), "--json", "--quiet",
                        "--backend", a.backend],
                       capture_output=True, text=True, timeout=LIMIT, stdin=subprocess.DEVNULL)
    m = re.search(r"decode (\d+) tokens ([0-9.]+) tok/s", r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"runner generate failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)["ids"], float(m.group(2))


def server(a):
    """`runner serve --fleet` over OUTDIR on a free port; its host:port."""
    out = ChildLog(os.path.join(a.outdir, "serve.out"))
    spawn([a.runner, "serve", "--root", ROOT, "--models", a.outdir, "--port", "0",
           "--fleet", TOKEN], stdout=out.sink, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"serving http://([0-9.:]+)/", out.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise SystemExit("no banner from runner serve")


def fleet(a, cap_mib):
    """The coordinator's report over `a.donors` donors offering `cap_mib` each."""
    host = server(a)
    for i in range(a.donors):
        err = open(os.path.join(a.outdir, f"donor{i}.err"), "w")
        spawn([a.runner, "donor", "--once", "--signal", f"ws://{host}/signal", "--fleet", TOKEN,
               "--gpu-mem-mib", str(cap_mib), "--backend", a.backend],
              stdout=subprocess.DEVNULL, stderr=err)
    err = ChildLog(os.path.join(a.outdir, "coordinate.err"))
    c = spawn([a.runner, "coordinate", "-m", f"http://{host}/models/big.gguf",
               "--signal", f"ws://{host}/signal", "--fleet", TOKEN, "--donors", str(a.donors),
               "-p", PROMPT, "-n", str(a.n), "--temp", "0", "--ctx", str(a.ctx),
               "--kv-slots", "1", "--json", "--backend", a.backend],
              stdout=subprocess.PIPE, stderr=err.sink, text=True)
    out, _ = c.communicate(timeout=LIMIT)
    if c.returncode != 0:
        raise SystemExit(f"runner coordinate failed (logs in {a.outdir}):\n{err.read()[-3000:]}")
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runner")
    ap.add_argument("outdir")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--donors", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.42)
    ap.add_argument("--backend", default="vulkan")
    ap.add_argument("--shape", default=SHAPE_7B)
    ap.add_argument("--example")
    a = ap.parse_args()
    if not 0 < a.share < 0.5:
        raise SystemExit("--share must be under 0.5: no donor may hold half the model")
    os.makedirs(a.outdir, exist_ok=True)
    path = os.path.join(a.outdir, "big.gguf")
    write_model(a, path)
    size = os.path.getsize(path)
    cap_mib = math.floor(size * a.share / 2**20)
    ids, single_tps = single(a, path)
    report = fleet(a, cap_mib)
    line = {
        "model_bytes": size, "shape": a.shape, "cap_mib": cap_mib, "donors": a.donors,
        "n": a.n, "ctx": a.ctx, "single_tok_s": single_tps,
        "fleet_tok_s": report["decode_tokens_per_s"], "step_ms_mean": report["step_ms_mean"],
        "plan": [[s["layers"], s["embedding"], s["head"]] for s in report["plan"]],
        "hops_compute_ms": [round(h["compute_ms_mean"], 2) for h in report["hops"]],
        "ids_equal": report["ids"] == ids, "ids": ids[:16],
    }
    print(json.dumps(line), flush=True)
    if report["ids"] != ids:
        raise SystemExit(f"the fleet's ids differ from single device:\n{report['ids']}\n{ids}")
    if len(report["plan"]) != a.donors:
        raise SystemExit(f"{len(report['plan'])} stages, not {a.donors}: {report['plan']}")
    print(f"{size / 1e9:.2f} GB model over {a.donors} donors of {cap_mib} MiB: "
          f"{report['decode_tokens_per_s']:.1f} tok/s; single device {single_tps:.1f} tok/s; "
          f"ids equal over {a.n} tokens")


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup()
