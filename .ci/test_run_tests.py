"""Tests for run_tests.py's scheduling: which binaries may share the cores, and that they do."""

import contextlib
import io
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import run_tests  # noqa: E402


def fake_binary(folder, name, seconds, fail=False):
    """An executable that prints libtest's lines for one test after sleeping `seconds`."""
    path = Path(folder) / name
    verdict = "FAILED" if fail else "ok"
    path.write_text(
        "#!/bin/sh\n"
        f"sleep {seconds}\n"
        f"echo 'test t ... {verdict} <{seconds}s>'\n"
        f"echo 'test result: {verdict}. {0 if fail else 1} passed; {1 if fail else 0} failed; "
        "0 ignored; 0 measured; 0 filtered out; finished in 0s'\n"
        f"exit {1 if fail else 0}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


class Scheduling(unittest.TestCase):
    def test_kernel_binaries_pair_and_process_tests_run_alone(self):
        self.assertEqual(run_tests.pairable_rank("webshard::ops_quant"), 0)
        self.assertIsNotNone(run_tests.pairable_rank("webshard::ops_norm"))
        self.assertIsNotNone(run_tests.pairable_rank("webshard::shard_frame"))
        for alone in ["native-runner::terminal", "native-runner::fleet", "webshard::shard_roles",
                      "webshard::shard_transport", "webshard::lib", "native-runner::ops_quant"]:
            self.assertIsNone(run_tests.pairable_rank(alone), alone)

    def test_pairable_binaries_overlap_and_every_record_comes_back(self):
        with tempfile.TemporaryDirectory() as folder:
            binaries = [
                run_tests.Binary("webshard::ops_quant", fake_binary(folder, "a", 1), Path(folder)),
                run_tests.Binary("webshard::fidelity", fake_binary(folder, "b", 1, fail=True), Path(folder)),
                run_tests.Binary("native-runner::fleet", fake_binary(folder, "c", 0), Path(folder)),
            ]
            started = time.monotonic()
            # The fake binaries' libtest lines (one says FAILED) stay out of the CI log.
            with contextlib.redirect_stdout(io.StringIO()):
                records = []
                run_tests.run_all(binaries, [], 2, records)
            elapsed = time.monotonic() - started
        self.assertLess(elapsed, 1.9, "the two pairable binaries ran one after the other")
        by_name = {r["binary"]: r for r in records}
        self.assertEqual(sorted(by_name), sorted(b[0] for b in binaries))
        self.assertEqual((by_name["webshard::ops_quant"]["passed"],
                          by_name["webshard::fidelity"]["failed"]), (1, 1))
        self.assertNotEqual(by_name["webshard::fidelity"]["status"], 0)

    def test_a_phase_runs_only_its_own_binaries(self):
        with tempfile.TemporaryDirectory() as folder:
            binaries = [
                run_tests.Binary("webshard::ops_quant", fake_binary(folder, "a", 0), Path(folder)),
                run_tests.Binary("native-runner::fleet", fake_binary(folder, "c", 0), Path(folder)),
            ]
            ran = {}
            for phase in ("paired", "alone"):
                records = []
                with contextlib.redirect_stdout(io.StringIO()):
                    run_tests.run_all(binaries, [], 2, records, phase)
                ran[phase] = [r["binary"] for r in records]
        self.assertEqual(ran, {"paired": ["webshard::ops_quant"], "alone": ["native-runner::fleet"]})

    def test_one_job_runs_everything_in_turn(self):
        with tempfile.TemporaryDirectory() as folder:
            binaries = [run_tests.Binary(f"webshard::ops_{n}", fake_binary(folder, n, 0.5), Path(folder))
                        for n in ("x", "y")]
            started = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                run_tests.run_all(binaries, [], 1, [])
            self.assertGreaterEqual(time.monotonic() - started, 1.0)

    def test_a_run_stopped_by_its_limit_reports_what_finished_and_what_did_not(self):
        with tempfile.TemporaryDirectory() as folder:
            quick = fake_binary(folder, "quick", 0)
            slow = fake_binary(folder, "slow", 60)
            script = (
                "import sys; sys.path.insert(0, sys.argv[1]); import run_tests\n"
                "from pathlib import Path\n"
                f"binaries = [run_tests.Binary('webshard::quick', {quick!r}, Path({folder!r})),\n"
                f"            run_tests.Binary('native-runner::slow', {slow!r}, Path({folder!r}))]\n"
                "records = []\n"
                "run_tests.report_on_termination(records, binaries, None)\n"
                "run_tests.run_all(binaries, [], 1, records)\n")
            child = subprocess.Popen([sys.executable, "-c", script, str(Path(__file__).parent)],
                                     stdout=subprocess.PIPE, text=True)
            time.sleep(1.5)
            child.send_signal(signal.SIGTERM)
            output, _ = child.communicate(timeout=20)
        self.assertEqual(child.returncode, 124)
        self.assertIn("not finished: native-runner::slow", output)
        self.assertIn("webshard::quick (1 passed)", output)


class Modules(unittest.TestCase):
    def test_a_binary_of_modules_runs_one_process_per_module_and_reports_each(self):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "suite"
            # Lists two modules' tests; run, prints one libtest line per name it was given.
            path.write_text(
                "#!/bin/sh\n"
                'if [ "$1" = --list ]; then\n'
                "  printf 'ops_a::one: test\\nops_a::two: test\\nfleet::three: test\\n'; exit 0\n"
                "fi\n"
                "n=0\n"
                'for arg in "$@"; do case $arg in *::*) echo "test $arg ... ok <0.1s>"; '
                "n=$((n+1));; esac; done\n"
                'echo "test result: ok. $n passed; 0 failed; 0 ignored; 0 measured; 0 filtered out"\n')
            path.chmod(path.stat().st_mode | stat.S_IEXEC)
            modules = run_tests.by_module(run_tests.Binary("webshard::suite", str(path), Path(folder)))
            self.assertEqual([m.label for m in modules], ["webshard::ops_a", "webshard::fleet"])
            self.assertEqual(modules[0].filters, ("--exact", "ops_a::one", "ops_a::two"))
            self.assertIsNotNone(run_tests.pairable_rank(modules[0].label))
            with contextlib.redirect_stdout(io.StringIO()):
                records = []
                run_tests.run_all(modules, [], 2, records)
        by_name = {r["binary"]: r for r in records}
        self.assertEqual((by_name["webshard::ops_a"]["passed"], by_name["webshard::fleet"]["passed"]),
                         (2, 1))
        self.assertEqual([t["test"] for t in by_name["webshard::fleet"]["tests"]],
                         ["webshard::fleet::three"])

    def test_a_binary_without_modules_stays_whole(self):
        with tempfile.TemporaryDirectory() as folder:
            binary = run_tests.Binary("webshard::web_cache", fake_binary(folder, "w", 0), Path(folder))
            self.assertEqual(run_tests.by_module(binary), [binary])


class Lavapipe(unittest.TestCase):
    def test_kernel_modules_keep_the_system_driver_and_the_rest_take_the_fast_one(self):
        binary = lambda label: run_tests.Binary(label, "/bin/true", Path("."))
        with unittest.mock.patch.dict("os.environ", {"WEBSHARD_FAST_LAVAPIPE_ICD": "/x/lvp.json"}):
            self.assertEqual(run_tests.environment(binary("webshard::fidelity"))["VK_DRIVER_FILES"],
                             "/x/lvp.json")
            self.assertNotIn("VK_DRIVER_FILES", run_tests.environment(binary("webshard::ops_quant")))
        with unittest.mock.patch.dict("os.environ", {}, clear=True):
            self.assertNotIn("VK_DRIVER_FILES", run_tests.environment(binary("webshard::fidelity")))

    def test_model_modules_take_narrow_vectors_and_kernel_modules_the_drivers_own(self):
        binary = lambda label: run_tests.Binary(label, "/bin/true", Path("."))
        with unittest.mock.patch.dict("os.environ", {}, clear=True):
            self.assertEqual(run_tests.environment(binary("native-runner::fleet"))["LP_NATIVE_VECTOR_WIDTH"],
                             "128")
            self.assertNotIn("LP_NATIVE_VECTOR_WIDTH", run_tests.environment(binary("webshard::ops_matvec")))
        with unittest.mock.patch.dict("os.environ", {"LP_NATIVE_VECTOR_WIDTH": "256"}, clear=True):
            self.assertEqual(run_tests.environment(binary("webshard::fidelity"))["LP_NATIVE_VECTOR_WIDTH"],
                             "256")

    def test_the_model_drivers_print_as_lines_for_env(self):
        script = str(Path(run_tests.__file__))
        environment = {"PATH": "/usr/bin:/bin", "WEBSHARD_FAST_LAVAPIPE_ICD": "/x/lvp.json"}
        printed = subprocess.run([sys.executable, script, "--model-drivers"], env=environment,
                                 capture_output=True, text=True, check=True).stdout.split()
        self.assertEqual(sorted(printed), ["LP_NATIVE_VECTOR_WIDTH=128", "VK_DRIVER_FILES=/x/lvp.json",
                                           "VK_ICD_FILENAMES=/x/lvp.json"])


if __name__ == "__main__":
    unittest.main()
