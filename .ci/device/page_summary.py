#!/usr/bin/env python3
"""Summary of `page.sh go` (its folder as the argument): native and page decode tok/s of the
same call and their ratios; writes summary.json beside the inputs and prints a short table."""
import json
import os
import re
import sys

stage = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(stage, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read(name):
    try:
        with open(os.path.join(stage, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def bench_tests(run):
    if not run:
        return {}
    return {t["test"]: round(t["tok_s"], 1) for t in run.get("tests", [])}


summary = {"chromium": read("chromium-version.txt"), "chosen_flags": read("chosen.txt")}
for key, name in [("native_bench", "native-bench.json"), ("native_bench_nosub", "native-bench-nosub.json"),
                  ("native_bench_f32", "native-bench-f32.json"),
                  ("native_bench_after", "native-bench-after.json")]:
    run = load(name)
    summary[key] = {"tests": bench_tests(run), "adapter": run and run.get("adapter"),
                    "variant": run and run.get("variant")}
generate = read("native-generate.txt") or ""
m = re.search(r"decode (\d+) tokens ([0-9.]+) tok/s", generate)
summary["native_generate"] = {"line": generate.splitlines()[-1] if generate else None,
                              "decode_tokens": int(m.group(1)) if m else None,
                              "decode_tok_s": float(m.group(2)) if m else None}
probes = []
try:
    with open(os.path.join(stage, "probes.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            a = (d.get("adapter") or {}).get("high-performance") or {}
            probes.append({
                "flags": d.get("flags"), "error": d.get("error"),
                "adapter": " / ".join(str(a.get(k) or "") for k in ("vendor", "architecture", "description")) if a else None,
                "fallback": a.get("is_fallback"), "f16": "shader-f16" in a.get("features", []),
                "subgroups": "subgroups" in a.get("features", []),
                "webgpu_status": ((d.get("gpu") or {}).get("feature_status") or {}).get("webgpu"),
                "gpu_devices": [x.get("deviceString") for x in ((d.get("gpu") or {}).get("devices") or [])],
            })
except OSError:
    pass
summary["probes"] = probes
page = load("page.json") or {}
last = page.get("last") or {}
summary["page"] = {
    "autorun_decode_tok_s": last.get("decode_tok_s"), "autorun_tokens": len(last.get("ids") or []),
    "adapter": last.get("adapter"), "variant": last.get("variant"), "error": last.get("error"),
    "warm_decode_tok_s": [w.get("decode_tok_s") for w in page.get("warm") or []],
    "warm_median": page.get("warm_decode_tok_s_median"),
    "load_seconds": (page.get("info") or {}).get("loadSeconds"),
    "driver_error": page.get("error_driver") or page.get("error_autorun"),
    "reloads": page.get("reloads"),
    "autorun_seconds": page.get("autorun_seconds"),
    "same_ids_as_native": None,
}
native_ids = (load("native-generate.json") or {}).get("ids")
if native_ids and last.get("ids"):
    summary["page"]["same_ids_as_native"] = native_ids == last.get("ids")
tg = f"tg{len(last.get('ids') or []) or 128}"
native_tg = summary["native_bench"]["tests"].get("tg128") or next(
    (v for k, v in summary["native_bench"]["tests"].items() if k.startswith("tg")), None)
nosub_tg = next((v for k, v in summary["native_bench_nosub"]["tests"].items() if k.startswith("tg")), None)
ratios = {}
for label, page_rate in [("page_warm_median", summary["page"]["warm_median"]),
                         ("page_autorun", summary["page"]["autorun_decode_tok_s"])]:
    if page_rate:
        if native_tg:
            ratios[f"{label}/native_bench"] = round(page_rate / native_tg, 3)
        if nosub_tg:
            ratios[f"{label}/native_bench_nosub"] = round(page_rate / nosub_tg, 3)
        if summary["native_generate"]["decode_tok_s"]:
            ratios[f"{label}/native_generate"] = round(page_rate / summary["native_generate"]["decode_tok_s"], 3)
f32_tg = next((v for k, v in summary["native_bench_f32"]["tests"].items() if k.startswith("tg")), None)
if f32_tg and summary["page"]["warm_median"]:
    ratios["page_warm_median/native_bench_f32"] = round(summary["page"]["warm_median"] / f32_tg, 3)
page_f16 = load("page-f16.json")
if page_f16:
    summary["page_f16"] = {"flags": page_f16.get("flags"), "variant": (page_f16.get("last") or {}).get("variant"),
                           "autorun_decode_tok_s": (page_f16.get("last") or {}).get("decode_tok_s"),
                           "warm_median": page_f16.get("warm_decode_tok_s_median"),
                           "error": page_f16.get("error_driver") or page_f16.get("error_autorun")}
    if native_tg and page_f16.get("warm_decode_tok_s_median"):
        ratios["page_f16_warm_median/native_bench"] = round(page_f16["warm_decode_tok_s_median"] / native_tg, 3)


def page_variant(file, key):
    """The page again with one URL setting changed (`page.sh`'s A/B runs), and its ratio."""
    other = load(file)
    if not other:
        return
    summary[key] = {"variant": (other.get("last") or {}).get("variant"),
                    "warm_decode_tok_s": [w.get("decode_tok_s") for w in other.get("warm", [])],
                    "warm_median": other.get("warm_decode_tok_s_median"),
                    "error": other.get("error_driver") or other.get("error_autorun")}
    if summary["page"]["warm_median"] and other.get("warm_decode_tok_s_median"):
        ratios[f"page_warm_median/{key}_warm_median"] = round(
            summary["page"]["warm_median"] / other["warm_decode_tok_s_median"], 3)


page_variant("page-nosub.json", "page_nosub")
page_variant("page-depth2.json", "page_depth2")
summary["ratios"] = ratios
with open(os.path.join(stage, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary, indent=1))
