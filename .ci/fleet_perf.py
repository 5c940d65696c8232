#!/usr/bin/env python3
"""Shard-chain figures on this machine: single device vs 2 and 3 donor processes over WebRTC on
loopback, 4 and 16 concurrent prompts through 2 donors, per-hop times, recovery after a donor
is killed.

    python3 .ci/fleet_perf.py RUNNER [--reps 3] [--n 16] [--models DIR] [--backend vulkan]

RUNNER is a `runner` binary (copy or hard-link it first if the target directory is shared);
DIR holds SmolLM2-135M-Instruct.Q4_1.gguf (default: WEBSHARD_MODELS, else models/).
Prints one JSON line per run, then a Markdown table (medians over reps): decode tok/s (the
aggregate over all prompts for the concurrent rows), the ratio to single device, the mean
step, the per-hop latency (the step's time outside every stage's forward, over its hops:
coordinator -> stage 0 -> ... -> coordinator), each stage's compute per step, and the
recovery time (re-plan, reload, replay start) with the bytes the survivors downloaded for
the re-plan (only the layers they lacked) for the kill rows. docs/perf.md quotes it.

`--only stage` (part of the default) also runs `runner bench --stage-steps` for the layer
ranges of the 2-donor plan: each stage's step path in one process, split into host phases
(select, f16 decode, record, submit, wait, f16 encode) with bind groups and read-back
buffers per step, beside the engine's decode of the same layers, so a fleet stage's compute
above can be told apart into what the stage code costs and what the fleet around it adds.
Every process is killed on exit; every wait has a limit.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from child_log import ChildLog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN = "fleet-perf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three primary colors are",
]
LIMIT = 300
CHILDREN = []
MODELS = os.environ.get("WEBSHARD_MODELS") or os.path.join(ROOT, "models")
BACKEND = "vulkan"


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def spawn(args, **kw):
    # The coordinator's info lines time each stage's load in a recovery (`recovery_log`).
    env = {**os.environ, "RUST_LOG": "warn,webshard::shard::roles=info"}
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, env=env, **kw)
    CHILDREN.append(p)
    return p


def cleanup(*_):
    for p in CHILDREN:
        if p.poll() is None:
            p.kill()
    for p in CHILDREN:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def server(runner, logdir):
    out = ChildLog(os.path.join(logdir, "serve.out"))
    p = spawn([runner, "serve", "--root", ROOT, "--models", MODELS, "--port", "0",
               "--fleet", TOKEN],
              stdout=out.sink, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"serving http://([0-9.:]+)/", out.read())
        if m:
            return p, m.group(1)
        time.sleep(0.05)
    raise SystemExit("no banner from runner serve")


def donors(runner, host, k, logdir):
    procs = []
    for i in range(k):
        err = ChildLog(os.path.join(logdir, f"donor{i}.err"))
        p = spawn([runner, "donor", "--signal", f"ws://{host}/signal", "--fleet", TOKEN,
                   "--backend", BACKEND], stdout=subprocess.DEVNULL, stderr=err.sink)
        procs.append((p, err))
    return procs


def reload_bytes(err):
    """Bytes a donor downloaded for its latest load: the growth of its running total between
    its last two Serving lines (None when it loaded once)."""
    totals = [int(b) for b in re.findall(r"Serving: layers Some\([^)]*\), (\d+) bytes", err.read())]
    return totals[-1] - totals[-2] if len(totals) >= 2 else None


def serving_start(err):
    """The first layer a donor serves now, from its last status line."""
    found = re.findall(r"Serving: layers Some\((\d+)\.\.(\d+)\)", err.read())
    return int(found[-1][0]) if found else None


def coordinate(runner, host, k, prompts, n, logdir, kill=None):
    """One fleet run; `kill` = (tokens, 'first'|'middle'|'last') kills that stage's donor."""
    srv, host = server(runner, logdir)
    fleet = donors(runner, host, k, logdir)
    err = ChildLog(os.path.join(logdir, "coord.err"))
    args = [runner, "coordinate", "-m", f"http://{host}/models/{MODEL}",
            "--signal", f"ws://{host}/signal", "--fleet", TOKEN, "--donors", str(k),
            "-n", str(n), "--temp", "0", "--json", "--progress", "--backend", BACKEND,
            "--kv-slots", str(max(4, len(prompts))), "--ctx", "512"]
    for p in prompts:
        args += ["-p", p]
    started = time.time()
    c = spawn(args, stdout=subprocess.PIPE, stderr=err.sink, text=True)
    killed_at = None
    if kill:
        tokens, which = kill
        deadline = time.time() + LIMIT
        while time.time() < deadline and c.poll() is None:
            if f"token 0 {tokens - 1} " in err.read():
                break
            time.sleep(0.02)
        stages = sorted((serving_start(e), i) for i, (_, e) in enumerate(fleet)
                        if serving_start(e) is not None)
        index = {"first": 0, "middle": len(stages) // 2, "last": -1}[which]
        fleet[stages[index][1]][0].kill()
        killed_at = time.time()
    out, _ = c.communicate(timeout=LIMIT)
    wall = time.time() - started
    for p, _ in fleet:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    srv.kill()
    srv.wait()
    if c.returncode != 0:
        raise SystemExit(f"coordinate failed:\n{err.read()[-3000:]}")
    j = json.loads(out)
    j["wall_s"] = wall
    if killed_at:
        j["after_kill_s"] = time.time() - killed_at
        reloads = [reload_bytes(e) for p, e in fleet if p.returncode != -signal.SIGKILL]
        j["reload_bytes"] = sum(r for r in reloads if r is not None)
        kept = ("donor lost", "stage ready", "recovered", "stages ready")
        j["recovery_log"] = [line.split(": ", 1)[-1] for line in err.read().splitlines()
                             if any(k in line for k in kept)]
    return j


def single(runner, prompt, n):
    path = os.path.join(MODELS, MODEL)
    r = subprocess.run([runner, "generate", "-m", path, "-p", prompt, "-n", str(n), "--temp", "0",
                        "--json", "--quiet", "--backend", BACKEND],
                       capture_output=True, text=True, timeout=LIMIT, stdin=subprocess.DEVNULL)
    m = re.search(r"decode (\d+) tokens ([0-9.]+) tok/s", r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"generate failed:\n{r.stderr[-2000:]}")
    return {"ids": json.loads(r.stdout)["ids"], "decode_tokens_per_s": float(m.group(2))}


def stage_bench(runner, layers, n):
    """`runner bench --stage-steps` for one layer range: the stage's step path in-process."""
    path = os.path.join(MODELS, MODEL)
    r = subprocess.run([runner, "bench", "-m", path, "-p", "0", "-n", str(n), "-r", "1",
                        "--ctx", "512", "--json", "--quiet", "--backend", BACKEND,
                        "--stage-steps", f"{layers[0]}..{layers[1]}"],
                       capture_output=True, text=True, timeout=LIMIT, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"bench --stage-steps failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)["stage_steps"]


def stage_table(benches):
    """Per stage and request count: µs per step by host phase, and the engine's share."""
    out = ["| stage | requests | select | decode | record | submit | wait | encode | step µs | "
           "on worker µs | bind groups | read buffers | engine share µs (2 in flight / serial) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for b in benches:
        a, e = b["layers"]
        share = (e - a) / b["n_layers"]
        engine = (f"{b['engine_pipelined_ms'] * share * 1e3:.0f} / "
                  f"{b['engine_serial_ms'] * share * 1e3:.0f}")
        for r in b["stage"]:
            out.append(f"| {a}-{e} | {r['requests']} | {r['select_us']:.1f} | {r['decode_us']:.1f} | "
                       f"{r['record_us']:.1f} | {r['submit_us']:.1f} | {r['wait_us']:.1f} | "
                       f"{r['encode_us']:.1f} | {r['step_us']:.1f} | {r['offloaded_us']:.1f} | "
                       f"{r['bind_groups']:.2f} | {r['read_buffers']:.2f} | {engine} |")
    return "\n".join(out)


def prompts(count):
    """`count` distinct prompts (the base four, numbered past the first round)."""
    return [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})")
            for i in range(count)]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(rows):
    """The Markdown table of medians over reps."""
    single = median(l["decode_tokens_per_s"] for l in rows.get("single device", []))
    out = ["| run | decode tok/s | × single | step ms | per-hop ms | stage compute ms | "
           "recovery ms | re-plan MB |", "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for label, lines in rows.items():
        tps = median(l["decode_tokens_per_s"] for l in lines)
        ratio = f"{tps / single:.2f}" if single and label != "single device" else ""
        step = median(l.get("step_ms_mean") for l in lines)
        hop = median(l["transfer_ms_mean"] / (len(l["hops"]) + 1)
                     for l in lines if l.get("hops"))
        stages = " / ".join(f"{h[0][0]}-{h[0][1]}: {h[1]}" for h in lines[-1].get("hops", []))
        recovery = median(r for l in lines for r in l.get("recovery_ms", []))
        reload = median(l.get("reload_bytes") for l in lines)
        cell = lambda v, f: "" if v is None else f.format(v)
        out.append(f"| {label} | {tps:.1f} | {ratio} | {cell(step, '{:.2f}')} | "
                   f"{cell(hop, '{:.2f}')} | {stages} | {cell(recovery, '{:.0f}')} | "
                   f"{cell(reload and reload / 1e6, '{:.1f}')} |")
    return "\n".join(out)


def main():
    global MODELS, BACKEND
    ap = argparse.ArgumentParser()
    ap.add_argument("runner")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--backend", default=BACKEND)
    ap.add_argument("--only", default="single,2,3,concurrent,recovery,stage")
    a = ap.parse_args()
    MODELS, BACKEND = a.models, a.backend
    signal.signal(signal.SIGTERM, cleanup)
    only = a.only.split(",")
    rows = {}

    def record(label, j):
        line = {"label": label, "load": load()}
        for key in ("decode_tokens_per_s", "step_ms_mean", "transfer_ms_mean", "recoveries",
                    "recovery_ms", "reload_bytes", "max_in_flight", "wall_s", "after_kill_s",
                    "recovery_log"):
            if key in j:
                line[key] = j[key]
        if "hops" in j:
            line["hops"] = [[h["layers"], round(h["compute_ms_mean"], 2), h["bytes_out"],
                             h["steps"]] for h in j["hops"]]
        if "outputs" in j:
            line["tokens"] = sum(len(o["ids"]) for o in j["outputs"])
        print(json.dumps(line), flush=True)
        rows.setdefault(label, []).append(line)

    def checked(label, j, reference):
        if reference and j["ids"] != reference:
            raise SystemExit(f"{label}: ids differ from single device")
        record(label, j)

    with tempfile.TemporaryDirectory() as logdir:
        try:
            reference = None
            for rep in range(a.reps):
                if "single" in only:
                    s = single(a.runner, PROMPTS[0], a.n)
                    reference = s["ids"]
                    record("single device", s)
                for k in (2, 3):
                    if str(k) in only:
                        checked(f"{k} donors", coordinate(a.runner, "", k, PROMPTS[:1], a.n,
                                                          logdir), reference)
                if "concurrent" in only:
                    for count in (4, 16):
                        checked(f"2 donors, {count} requests (aggregate)",
                                coordinate(a.runner, "", 2, prompts(count), a.n, logdir),
                                reference)
                if "recovery" in only:
                    checked("2 donors, kill first after 4 tokens",
                            coordinate(a.runner, "", 2, PROMPTS[:1], a.n, logdir,
                                       kill=(4, "first")), reference)
                    checked("3 donors, kill middle after 4 tokens",
                            coordinate(a.runner, "", 3, PROMPTS[:1], a.n, logdir,
                                       kill=(4, "middle")), reference)
            benches = []
            if "stage" in only:
                # The 2-donor plan's ranges where it ran, else SmolLM2's split on the H200.
                two = rows.get("2 donors", [])
                ranges = [h[0] for h in two[-1]["hops"]] if two else [[0, 20], [20, 30]]
                for layers in ranges:
                    benches.append(stage_bench(a.runner, layers, a.n))
                    print(json.dumps({"label": "stage bench", **benches[-1]}), flush=True)
        finally:
            cleanup()
    loads = [l["load"] for lines in rows.values() for l in lines]
    if loads:
        print(f"\n{a.n} greedy tokens, medians over {a.reps} rep(s), load "
              f"{min(loads):.1f}-{max(loads):.1f}\n")
        print(table(rows))
    if benches:
        print(f"\nA stage's step path in one process (runner bench --stage-steps, {a.n} steps):\n")
        print(stage_table(benches))


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup()
