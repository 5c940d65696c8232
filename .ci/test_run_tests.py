"""Tests for run_tests.py's scheduling: which binaries may share the cores, and that they do."""

import contextlib
import io
import stat
import sys
import tempfile
import time
import unittest
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
                ("webshard::ops_quant", fake_binary(folder, "a", 1), Path(folder)),
                ("webshard::fidelity", fake_binary(folder, "b", 1, fail=True), Path(folder)),
                ("native-runner::fleet", fake_binary(folder, "c", 0), Path(folder)),
            ]
            started = time.monotonic()
            # The fake binaries' libtest lines (one says FAILED) stay out of the CI log.
            with contextlib.redirect_stdout(io.StringIO()):
                records = run_tests.run_all(binaries, [], jobs=2)
            elapsed = time.monotonic() - started
        self.assertLess(elapsed, 1.9, "the two pairable binaries ran one after the other")
        by_name = {r["binary"]: r for r in records}
        self.assertEqual(sorted(by_name), sorted(b[0] for b in binaries))
        self.assertEqual((by_name["webshard::ops_quant"]["passed"],
                          by_name["webshard::fidelity"]["failed"]), (1, 1))
        self.assertNotEqual(by_name["webshard::fidelity"]["status"], 0)

    def test_one_job_runs_everything_in_turn(self):
        with tempfile.TemporaryDirectory() as folder:
            binaries = [(f"webshard::ops_{n}", fake_binary(folder, n, 0.5), Path(folder))
                        for n in ("x", "y")]
            started = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                run_tests.run_all(binaries, [], jobs=1)
            self.assertGreaterEqual(time.monotonic() - started, 1.0)


if __name__ == "__main__":
    unittest.main()
