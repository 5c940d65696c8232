#!/usr/bin/env python3
"""Builds the workspace's test binaries once, runs each, and reports every test's time.

`cargo test` alone cannot say how long each test took on stable Rust, and setting
RUSTC_BOOTSTRAP for cargo would rebuild crates whose build scripts watch it (anyhow,
proc-macro2, thiserror). So cargo only builds (`--no-run`), and the binaries run here with
RUSTC_BOOTSTRAP set for their own process alone, which lets libtest's `--report-time` print
each test's duration. Output per binary is libtest's own; at the end come the slowest tests
and binaries and one `N passed, N failed` line.

Two cores are only kept busy by running two binaries at once: a cold machine spends most of
the kernel tests compiling shaders for GL, one pipeline at a time on one thread, so a binary
with one long test leaves the other core idle. `--jobs N` runs the CPU-bound kernel and model
binaries (PAIRABLE, heaviest first) N at a time, their output printed whole as each ends; the
rest (processes talking over sockets and pseudo-terminals, heartbeats, timeouts) then run one
at a time, as before, so nothing timing-sensitive shares the cores with another binary.

A test binary whose tests sit in modules (`tests/suite.rs`: one binary per crate, so that a build
links two, not sixty) runs as one process per module, named `package::module`, exactly as each
module ran when it was a binary of its own: its process state is its own, and the pairing below
schedules modules.

Usage: run_tests.py [--jobs N] [--phase all|paired|alone] [--timings FILE] [-- CARGO_TEST_ARGS...]
       run_tests.py --model-drivers
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed")
TIMED = re.compile(r"^test (\S+) \.\.\. (\w+) <([\d.]+)s>")
# Binaries that only compute (GPU kernels on lavapipe/GL, model loads, parsers): safe to run
# beside another. Listed heaviest first, the order they start in.
PAIRABLE = ["webshard::ops_quant", "webshard::fidelity", "webshard::ops_attention",
            "webshard::ops_select", "webshard::ops_matvec", "webshard::embed_fidelity",
            "webshard::fidelity_breadth", "webshard::embed_packed", "webshard::batch_step",
            "webshard::big_model", "webshard::engine_constrained", "webshard::ops_row_views",
            "webshard::ops_.*",
            "webshard::gpu_core", "webshard::model_.*", "webshard::gguf_.*",
            "webshard::quant_reference", "webshard::tokenizer_goldens", "webshard::sampler",
            "webshard::chat_template", "webshard::constraint", "webshard::spec_decode",
            "webshard::shard_(chunk|frame|plan|validate|vocab)"]
# Test modules whose time goes to compiling pipelines (every variant of every kernel, each run
# once on small inputs): they keep the system's lavapipe at its own vector width. Every other
# module runs on the lavapipe named by $WEBSHARD_FAST_LAVAPIPE_ICD where set-up unpacked one
# (Debian 12: Mesa 25.0 beside the system's 22.3, which compiles 3.4x faster and runs a model 3x
# slower; .ci/setup.sh), and with llvmpipe's vectors 128 bits wide (LP_NATIVE_VECTOR_WIDTH),
# which halves what a model's pipelines cost to compile there and runs them no slower: Gemma 3's
# fidelity check on lavapipe 67.6 -> 33.3 s cold, 12.5 -> 9.3 s warm; on GL 52.5 -> 44.0 s
# (docs/ci.md, session 42). Subgroups are then 4 wide, as SwiftShader's in the browser tests;
# the kernel tests keep lavapipe's 8.
COMPILE_BOUND = ["webshard::ops_.*"]
MODEL_VECTOR_BITS = "128"
PRINT_LOCK = threading.Lock()
# Test processes still running, ended by the SIGTERM handler.
RUNNING = set()
# (phase, wall seconds) of the paired phase, for the report.
PHASES = []


class Binary(NamedTuple):
    """One process to run: a test binary, or the tests of one module of it (`filters`)."""
    label: str
    executable: str
    package_dir: Path
    filters: tuple = ()
    # What each test's name is reported under: the label, or the package for a module's tests
    # (whose names already start with the module).
    test_prefix: str = ""


def package_name(package_id, package_dir):
    """`path+file:///dir#name@1.0` names the package; `path+file:///dir/name#1.0` leaves it
    to the folder's name."""
    fragment = package_id.rpartition("#")[2]
    return fragment.partition("@")[0] if "@" in fragment else package_dir.name


def build(cargo_args):
    """Builds the test binaries; returns a Binary for each."""
    command = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in process.stdout:
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        target = message["target"]
        package_dir = Path(message["manifest_path"]).parent
        package = package_name(message["package_id"], package_dir)
        label = f"{package}::{'lib' if target['kind'] == ['lib'] else target['name']}"
        binary = Binary(label, message["executable"], package_dir)
        binaries.extend(by_module(binary) if target["kind"] == ["test"] else [binary])
    if process.wait() != 0:
        sys.exit(f"run_tests: `{' '.join(command)}` failed")
    return binaries


def by_module(binary):
    """The binary as one Binary per module of its tests (libtest's names, `module::test`), or
    whole if its tests are not in modules."""
    listing = subprocess.run([binary.executable, "--list", "--format", "terse"],
                             cwd=binary.package_dir, capture_output=True, text=True)
    if listing.returncode != 0:
        sys.exit(f"run_tests: listing the tests of {binary.label} failed:\n{listing.stderr}")
    modules = {}
    for line in listing.stdout.splitlines():
        name, _, kind = line.rpartition(": ")
        if kind == "test":
            modules.setdefault(name.partition("::")[0] if "::" in name else None, []).append(name)
    if not modules or None in modules:
        return [binary]
    package = binary.label.partition("::")[0]
    return [Binary(f"{package}::{module}", binary.executable, binary.package_dir,
                   ("--exact", *names), package) for module, names in modules.items()]


def pairable_rank(label):
    """Where a binary starts among the pairable ones, or None if it must run alone."""
    for rank, pattern in enumerate(PAIRABLE):
        if re.fullmatch(pattern, label):
            return rank
    return None


def model_drivers():
    """The variables that give a process running models the model tests' lavapipe and vector
    width (COMPILE_BOUND says why); test.sh gives them to the Playwright pages' runners too."""
    drivers = {"LP_NATIVE_VECTOR_WIDTH": os.environ.get("LP_NATIVE_VECTOR_WIDTH", MODEL_VECTOR_BITS)}
    icd = os.environ.get("WEBSHARD_FAST_LAVAPIPE_ICD")
    if icd:
        # Both names: the Vulkan loader reads VK_DRIVER_FILES since 1.3.207, the older name before.
        drivers["VK_DRIVER_FILES"] = drivers["VK_ICD_FILENAMES"] = icd
    return drivers


def environment(binary):
    """Cargo's variables for a test, and the lavapipe it runs on (COMPILE_BOUND)."""
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", CARGO_MANIFEST_DIR=str(binary.package_dir))
    if not any(re.fullmatch(pattern, binary.label) for pattern in COMPILE_BOUND):
        env.update(model_drivers())
    return env


def run(binary, test_args, buffered=False):
    """Runs one test binary (or one module's tests) as cargo would, from its package's
    directory; returns its record. Buffered output is printed in one piece when it ends."""
    label, executable, package_dir = binary.label, binary.executable, binary.package_dir
    env = environment(binary)
    command = [executable, "-Z", "unstable-options", "--report-time", *test_args, *binary.filters]
    header = f"     Running {label} ({executable})\n"
    lines = [header]
    if not buffered:
        print(header, end="", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=package_dir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    RUNNING.add(process)
    passed = failed = 0
    tests = []
    for line in process.stdout:
        if buffered:
            lines.append(line)
        else:
            sys.stdout.write(line)
            sys.stdout.flush()
        if match := TIMED.match(line):
            tests.append((float(match[3]), f"{binary.test_prefix or label}::{match[1]}"))
        if match := RESULT.match(line):
            passed, failed = int(match[1]), int(match[2])
    process.stdout.close()
    status = process.wait()
    RUNNING.discard(process)
    seconds = time.monotonic() - started
    if buffered:
        with PRINT_LOCK:
            sys.stdout.write("".join(lines) + f"     ({label}: {seconds:.1f} s)\n")
            sys.stdout.flush()
    if status != 0 and failed == 0:
        failed = 1  # a crash or abort before libtest's summary
    return {"binary": label, "seconds": round(seconds, 1), "passed": passed, "failed": failed,
            "status": status, "tests": [{"test": t, "seconds": s} for s, t in tests]}


def report(records, timings_file):
    """The slowest tests, then every binary and the paired phase's wall time, then the totals:
    last, because CI shows a run's last lines."""
    print("\n== slowest tests")
    tests = [t for record in records for t in record["tests"]]
    for test in sorted(tests, key=lambda t: -t["seconds"])[:15]:
        print(f"  {test['seconds']:8.1f} s  {test['test']}")
    print("== test binaries, slowest first")
    for record in sorted(records, key=lambda r: -r["seconds"]):
        print(f"  {record['seconds']:8.1f} s  {record['binary']} ({record['passed']} passed)")
    for phase, seconds in PHASES:
        print(f"  {seconds:8.1f} s  wall time of {phase}")
    if timings_file:
        Path(timings_file).write_text(json.dumps(records, indent=1) + "\n")
    passed = sum(r["passed"] for r in records)
    failed = sum(r["failed"] for r in records)
    print(f"\nrun_tests: {passed} passed, {failed} failed")
    return failed


def run_all(binaries, test_args, jobs, records, phase="all"):
    """The pairable binaries `jobs` at a time, heaviest first, then the others one by one;
    each one's record joins `records` as it ends. `phase` "paired" or "alone" runs only those."""
    alone = [b for b in binaries if jobs <= 1 or pairable_rank(b.label) is None]
    paired = sorted((b for b in binaries if b not in alone), key=lambda b: pairable_rank(b.label))
    if phase == "alone":
        paired = []
    elif phase == "paired":
        alone = []
    if paired:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            records.extend(pool.map(lambda b: run(b, test_args, buffered=True), paired))
        phase = f"the {len(paired)} paired binaries, {jobs} at a time"
        PHASES.append((phase, time.monotonic() - started))
        print(f"     ({phase}: {PHASES[-1][1]:.1f} s)", flush=True)
    for binary in alone:
        records.append(run(binary, test_args))


def report_on_termination(records, binaries, timings_file):
    """On SIGTERM (test.sh's time limit), reports what had finished and what had not, so a run
    stopped by its limit still says where its time went; then exits 124 as `timeout` would."""
    def handler(signum, frame):
        finished = {record["binary"] for record in records}
        print("\nrun_tests: stopped by SIGTERM; not finished: "
              + ", ".join(b.label for b in binaries if b.label not in finished), flush=True)
        for process in list(RUNNING):
            process.kill()
        report(records, timings_file)
        os._exit(124)
    signal.signal(signal.SIGTERM, handler)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--timings", help="write per-binary and per-test seconds here (JSON)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="pairable binaries to run at once (default 1: all one at a time)")
    parser.add_argument("--phase", choices=["all", "paired", "alone"], default="all",
                        help="run only the pairable binaries or only the one-at-a-time ones "
                             "(test.sh runs the latter beside the browser tests)")
    parser.add_argument("--model-drivers", action="store_true",
                        help="print the model tests' driver variables as NAME=VALUE lines, and exit")
    parser.add_argument("cargo_args", nargs="*", help="arguments for `cargo test` (after --)")
    args = parser.parse_args()
    if args.model_drivers:
        print("\n".join(f"{name}={value}" for name, value in model_drivers().items()))
        return
    cargo_args, test_args = args.cargo_args, []
    if "--" in cargo_args:
        split = cargo_args.index("--")
        cargo_args, test_args = cargo_args[:split], cargo_args[split + 1:]
    binaries = build(cargo_args)
    records = []
    report_on_termination(records, binaries, args.timings)
    run_all(binaries, test_args, args.jobs, records, args.phase)
    failed_binaries = [r["binary"] for r in records if r["status"] != 0]
    if report(records, args.timings) or failed_binaries:
        sys.exit(f"run_tests: failed: {', '.join(failed_binaries)}")


if __name__ == "__main__":
    main()
