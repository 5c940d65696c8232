#!/usr/bin/env python3
"""Donor churn soak: many donor kills in one generation run, against single-device ids.

    python3 .ci/churn_soak.py RUNNER [--kills 20] [--every 2] [--donors 3] [--mem-mib 300] [--backend vulkan]
        [--tokens-per-kill N]

RUNNER is a `runner` binary. It starts `runner serve --fleet`, `--donors` donor processes
(each offering `--mem-mib`) and one `runner coordinate
--progress --json` over SmolLM2 (WEBSHARD_MODELS, or models/ in the repository). Each time
`--every` more tokens have come since the last kill and the last kill's replacement has been
admitted, it kills (SIGKILL) the donor of the first or the last stage in turn and starts a
fresh donor, which joins while the survivors recover, until `--kills` donors are dead. With
300 MiB each, two donors hold SmolLM2, so every recovery has a plan. A run whose tokens run out
before its next kill (a replacement slow to be admitted) is checked all the same, and a new
`runner coordinate` over the same donors takes the kills left (at most 3 runs). Of each run
it checks that

- the coordinator's ids equal single-device `runner generate --temp 0` ids,
- the progress lines name every token index exactly once, in order (none lost or repeated),
- the coordinator planned out every killed donor as a lost stage donor (one recovery may
  cover a kill and a join, or two kills close together, so recoveries are at most the kills).

It prints one line per kill and a summary, and exits non-zero on the first failed check.
Every process is killed on exit; every wait has a limit. CI runs it with `--kills 5`
(native-runner/tests/fleet.rs); the documented soak is `--kills 20`.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from child_log import ChildLog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN = "churn-soak"
# Counting goes on without an end-of-sequence token, so the run outlasts every kill.
PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"
# The coordinator's info lines say when a donor is admitted; donors say when a link waited.
LOG = "warn,webshard::shard::roles=info"
LIMIT_S = 120
# Generation runs the kills may take: a run ends early when a replacement donor's link to the
# coordinator is slow to open (minutes now and then on a loaded 2-core machine).
MAX_RUNS = 3
# No kill once fewer tokens than this are left: the coordinator must see the loss before its end.
LAST_KILL_MARGIN = 4
CHILDREN = []
# What a failed wait prints: the coordinator's last lines, set once it runs.
DIAGNOSE = lambda: ""


def models_dir():
    return os.environ.get("WEBSHARD_MODELS") or os.path.join(ROOT, "models")


def spawn(args, err_path):
    err = ChildLog(err_path)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=err.sink, text=True, env={**os.environ, "RUST_LOG": LOG})
    CHILDREN.append(proc)
    return proc, err


def read(err):
    return err.read()


def cleanup():
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.kill()
    for proc in CHILDREN:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def wait_for(what, predicate, limit=LIMIT_S, diagnose=lambda: ""):
    deadline = time.time() + limit
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise SystemExit(f"churn soak: no {what} within {limit} s{DIAGNOSE()}{diagnose()}")


def reference(runner, n, backend):
    run = subprocess.run([runner, "generate", "-m", os.path.join(models_dir(), MODEL),
                          "-p", PROMPT, "-n", str(n), "--temp", "0", "--json", "--quiet",
                          "--backend", backend],
                         capture_output=True, text=True, timeout=LIMIT_S,
                         stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        raise SystemExit(f"runner generate failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout)["ids"]


def joined(proc, err, index):
    """Whether a donor has said its id; one that exited first fails the soak with its stderr."""
    if "joined the fleet as" in read(err):
        return True
    if proc.poll() is not None:
        raise SystemExit(f"churn soak: donor {index} exited ({proc.returncode}) before joining:\n"
                         f"{read(err)[-3000:]}{DIAGNOSE()}")
    return False


class Fleet:
    def __init__(self, runner, logdir, mem_mib, backend):
        self.runner, self.logdir, self.mem_mib, self.backend = runner, logdir, mem_mib, backend
        serve, err = spawn([runner, "serve", "--root", ROOT, "--models", models_dir(),
                            "--port", "0", "--fleet", TOKEN],
                           os.path.join(logdir, "serve.err"))
        self.serve = serve
        host = wait_for("banner from runner serve",
                        lambda: re.search(r"serving http://([0-9.:]+)/",
                                          serve.stdout.readline() or ""))
        self.host = host.group(1)
        self.donors = []
        # Kills so far, over every generation run.
        self.kills = 0

    def start_donor(self):
        index = len(self.donors)
        proc, err = spawn([self.runner, "donor", "--signal", f"ws://{self.host}/signal",
                           "--fleet", TOKEN, "--gpu-mem-mib", str(self.mem_mib),
                           "--backend", self.backend],
                          os.path.join(self.logdir, f"donor{index}.err"))
        wait_for(f"id from donor {index}", lambda: joined(proc, err, index),
                 diagnose=lambda: f"\ndonor {index} said:\n{read(err)[-3000:]}")
        self.donors.append((proc, err))

    def stages(self, coordinator_log):
        """(first layer, donor index) of every live donor holding a stage of the
        coordinator's last ready plan, chain order. The plan, not the donors' own status:
        a donor a re-plan leaves without a stage is not told, and killing it loses nothing."""
        plans = re.findall(r"stages ready epoch=\d+ stages=(.*)$", coordinator_log, re.M)
        if not plans:
            return []
        index_of = {}
        for index, (proc, err) in enumerate(self.donors):
            # Its last id: a donor whose link failed logs the one it joined again with
            # (roles/link.rs).
            ids = re.findall(r"joined the fleet as (\w+)", read(err))
            if ids and proc.poll() is None:
                index_of[ids[-1]] = index
        stages = re.findall(r"(\w+):(\d+)\.\.\d+", plans[-1])
        return sorted((int(first), index_of[donor]) for donor, first in stages
                      if donor in index_of)


def settled(log):
    """The last admitted donor has been planned (in, or left without a stage): the last ready
    plan is the one a kill now hits."""
    admitted = log.rfind("donor admitted")
    return max(log.rfind("stages ready"), log.rfind("get no stage")) > admitted


def progress_indices(text):
    return [int(m) for m in re.findall(r"^token 0 (\d+) \d+$", text, re.M)]


def soak(runner, kills, every, donors, mem_mib, backend, logdir, tokens_per_kill=None):
    # Tokens may come while a newcomer joins, too. A fast GPU decodes dozens of tokens while a
    # replacement joins: --tokens-per-kill.
    n = (tokens_per_kill or every + 2) * kills + 6
    expected = reference(runner, n, backend)
    fleet = Fleet(runner, logdir, mem_mib, backend)
    for _ in range(donors):
        fleet.start_donor()
    done, failures = 0, []
    for run in range(1, MAX_RUNS + 1):
        killed, run_failures = generation_run(fleet, run, n, expected, kills - done, every,
                                              donors)
        done += killed
        failures += run_failures
        if failures or done == kills:
            return failures
    fleet_logs = "\n".join(f"donor {i}:\n{read(err)[-1500:]}"
                           for i, (_, err) in enumerate(fleet.donors))
    return [f"{done} of {kills} kills in {MAX_RUNS} generation runs: each ended before the "
            f"next kill was due (a replacement donor was not admitted in time)\n{fleet_logs}"]


def generation_run(fleet, run, n, expected, kills, every, donors):
    """One `runner coordinate` of n tokens, killing a stage donor each `every` tokens until
    `kills` are dead or too few tokens are left for the coordinator to see a loss before it
    ends: (the kills it made, the failed checks). A run that ends early is checked in full
    all the same, and the soak goes on with the rest of its kills in a new run."""
    coordinator, cerr = spawn(
        [fleet.runner, "coordinate", "-m", f"http://{fleet.host}/models/{MODEL}",
         "--signal", f"ws://{fleet.host}/signal", "--fleet", TOKEN, "--donors", str(donors),
         "-p", PROMPT, "-n", str(n), "--temp", "0", "--json", "--progress",
         "--backend", fleet.backend],
        os.path.join(fleet.logdir, f"coordinate{run}.err"))
    global DIAGNOSE
    DIAGNOSE = lambda: "\n" + read(cerr)[-3000:]
    started = time.time()
    mark, admitted, killed = 0, donors, 0
    while killed < kills:
        # `every` tokens since the last kill, its replacement admitted, two stages to pick from.
        due = wait_for(f"{mark + every} tokens with {admitted} donors admitted",
                       lambda: kill_due(coordinator, read(cerr), fleet, mark + every,
                                        admitted, n))
        if due == "late":
            tokens = len(progress_indices(read(cerr)))
            print(f"run {run}: {tokens} of {n} tokens and the next kill not yet due ({every} "
                  f"tokens after the last, {admitted} donors admitted): the run ends after "
                  f"{killed} kills", flush=True)
            break
        stages = fleet.stages(read(cerr))
        first_layer, victim = stages[0] if fleet.kills % 2 == 0 else stages[-1]
        fleet.donors[victim][0].kill()
        fleet.kills += 1
        killed += 1
        mark = len(progress_indices(read(cerr)))
        print(f"kill {fleet.kills}: donor {victim} (layers from {first_layer}) after "
              f"{mark} tokens of run {run}, {time.time() - started:.1f} s", flush=True)
        # The replacement starts while the survivors recover, and joins at the next re-plan.
        admitted = read(cerr).count("donor admitted") + 1
        fleet.start_donor()
    return killed, check_run(coordinator, cerr, run, n, expected, killed, started)


def kill_due(coordinator, log, fleet, tokens, admitted, n):
    """"due" when the next kill may come; "late" when the coordinator has ended or so few of
    its n tokens are left that it might end before it sees the loss."""
    indices = progress_indices(log)
    if coordinator.poll() is not None or len(indices) > n - LAST_KILL_MARGIN:
        return "late"
    ready = (len(indices) >= tokens and log.count("donor admitted") >= admitted
             and settled(log) and len(fleet.stages(log)) >= 2)
    return "due" if ready else None


def check_run(coordinator, cerr, run, n, expected, kills, started):
    try:
        out, _ = coordinator.communicate(timeout=LIMIT_S * 2)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"coordinator of run {run} did not finish:\n{read(cerr)[-3000:]}")
    if coordinator.returncode != 0:
        raise SystemExit(f"coordinator of run {run} failed:\n{read(cerr)[-3000:]}")
    report = json.loads(out)
    indices = progress_indices(read(cerr))
    failures = []
    if report["ids"] != expected:
        failures.append(f"run {run}: ids {report['ids']} differ from single device {expected}")
    if indices != list(range(n)):
        failures.append(f"run {run}: token indices {indices}: some lost or repeated")
    # A donor whose link to its next stage never opened leaves and joins again under a new id
    # (roles/link.rs): a loss of its own, which the coordinator logs with its reason.
    log = read(cerr)
    link_leaves = log.count("no working link to the next stage")
    if report["stage_donors_lost"] != kills + link_leaves:
        losses = "\n".join(line for line in log.splitlines()
                           if "donor lost" in line or "failed to load" in line)
        failures.append(f"run {run}: {report['stage_donors_lost']} stage donors lost for "
                        f"{kills} kills and {link_leaves} link failures:\n{losses}")
    if not min(kills, 1) <= report["recoveries"] <= kills + link_leaves:
        failures.append(f"run {run}: {report['recoveries']} recoveries for {kills} kills "
                        f"and {link_leaves} link failures")
    recovery = sorted(report["recovery_ms"]) or [0.0]
    print(f"run {run}: {kills} kills in {time.time() - started:.1f} s, {n} tokens, recoveries "
          f"{report['recoveries']}, stage donors lost {report['stage_donors_lost']} "
          f"(median {recovery[len(recovery) // 2]:.0f} ms, max {recovery[-1]:.0f} ms), "
          f"joins {report['joins']}, link failures {link_leaves}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runner")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--every", type=int, default=2, help="tokens between kills")
    parser.add_argument("--donors", type=int, default=3)
    parser.add_argument("--mem-mib", type=int, default=300)
    parser.add_argument("--backend", default="vulkan")
    parser.add_argument("--tokens-per-kill", type=int, default=None,
                        help="tokens generated per kill (default --every + 2; ~40 on an H200)")
    args = parser.parse_args()
    if args.kills < 1 or args.every < 1 or args.donors < 3:
        raise SystemExit("--kills and --every must be at least 1, --donors at least 3")
    with tempfile.TemporaryDirectory() as logdir:
        try:
            failures = soak(args.runner, args.kills, args.every, args.donors, args.mem_mib,
                            args.backend, logdir, args.tokens_per_kill)
        finally:
            cleanup()
    for failure in failures:
        print(f"churn soak: FAILED: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup()
