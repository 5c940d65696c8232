#!/usr/bin/env python3
"""Drives headless Chromium over the DevTools protocol with nothing but the standard library
(the H200 machine has no node): launches it with the given flags, opens a URL and evaluates.

  cdp.py probe --chrome BIN --base URL [--flags "..."] [--label L] [--logs DIR]
      the WebGPU adapter the page's origin gets (vendor, architecture, fallback, features,
      limits) and the browser's GPU report (SystemInfo.getInfo: what chrome://gpu shows), as
      one JSON line
  cdp.py page --chrome BIN --base URL --model /models/F.gguf [--n 128] [--warm 5] [--flags ...]
      the chat page's autorun (?model=...&autorun=1): window.__webshard_last, then `--warm`
      more generations of the same prompt from an empty cache in the same loaded engine
      (`state.engine.reset()` then `window.__webshard.generate`), then `--reloads` more autoruns
      from a fresh navigation in the same browser, as one JSON line

Chromium's stderr (--enable-logging=stderr) goes to LOGS/chrome-LABEL.log. CHROME_LD_PATH, if
set, becomes LD_LIBRARY_PATH for Chromium alone (the carried libraries).
"""
import argparse
import base64
import json
import os
import shlex
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

PROMPT = "The capital of France is"


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: text frames, masked sends."""

    def __init__(self, url, timeout):
        parsed = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text):
        data = text.encode()
        header = bytes([0x81])
        n = len(data)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            if b1 & 0x80:
                mask = self._read(4)
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self._read(n)))
            else:
                payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise ConnectionError("websocket closed by peer")
            if opcode in (9, 10):  # ping / pong: ignore
                continue
            message += payload
            if b0 & 0x80:
                return message.decode("utf-8", "replace")


class Cdp:
    def __init__(self, ws_url, timeout, log):
        self.ws = WebSocket(ws_url, timeout)
        self.next_id = 0
        self.log = log

    def call(self, method, params=None, timeout=60):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.time() + timeout
        while True:
            self.ws.sock.settimeout(max(0.1, deadline - time.time()))
            try:
                msg = json.loads(self.ws.recv())
            except socket.timeout:
                raise TimeoutError(f"{method}: no answer in {timeout} s")
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.event(msg)

    def event(self, msg):
        method = msg.get("method", "")
        if method == "Runtime.consoleAPICalled":
            args = msg["params"].get("args", [])
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            self.log(f"console.{msg['params'].get('type')}: {text[:2000]}")
        elif method == "Runtime.exceptionThrown":
            details = msg["params"].get("exceptionDetails", {})
            self.log(f"exception: {json.dumps(details)[:2000]}")

    def evaluate(self, expression, timeout=60, await_promise=True):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": await_promise, "returnByValue": True,
             "timeout": int(timeout * 1000)},
            timeout=timeout + 5,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate: {json.dumps(result['exceptionDetails'])[:2000]}")
        return result.get("result", {}).get("value")


class Browser:
    def __init__(self, args, label):
        self.label = label
        os.makedirs(args.logs, exist_ok=True)
        self.log_path = os.path.join(args.logs, f"chrome-{label}.log")
        self.events_path = os.path.join(args.logs, f"cdp-{label}.log")
        self.port = args.port
        profile = f"/tmp/cdp-profile-{label}-{os.getpid()}"
        cmd = [args.chrome, "--no-sandbox", "--no-first-run", "--no-default-browser-check",
               f"--user-data-dir={profile}", f"--remote-debugging-port={self.port}",
               "--enable-logging=stderr", "--v=0"]
        cmd += shlex.split(args.flags)
        cmd.append("about:blank")
        env = dict(os.environ)
        if os.environ.get("CHROME_LD_PATH"):
            env["LD_LIBRARY_PATH"] = os.environ["CHROME_LD_PATH"]
        self.note(f"launch: {shlex.join(cmd)}")
        self.stderr = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.stderr, stderr=self.stderr, env=env,
                                     start_new_session=True)
        self.cdp = None

    def note(self, text):
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        with open(self.events_path, "a") as f:
            f.write(line + "\n")
        print(f"  {self.label}: {line}"[:600], file=sys.stderr, flush=True)

    def connect(self, timeout=30):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} (see {self.log_path})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    targets = json.load(r)
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    self.cdp = Cdp(pages[0]["webSocketDebuggerUrl"], 10, self.note)
                    self.cdp.call("Runtime.enable")
                    self.cdp.call("Page.enable")
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version", timeout=2) as r:
                        self.version = json.load(r)
                    return self.version
            except Exception as err:  # not up yet
                last = err
            time.sleep(0.2)
        raise TimeoutError(f"no DevTools page target in {timeout} s ({last})")

    def system_info(self):
        """The browser's GPU report (what chrome://gpu shows; headless shell has no chrome://
        pages): GPU devices, feature status (webgpu, vulkan...), display type, workarounds."""
        try:
            browser = Cdp(self.version["webSocketDebuggerUrl"], 10, self.note)
            gpu = browser.call("SystemInfo.getInfo", timeout=20)["gpu"]
            aux = gpu.get("auxAttributes", {})
            return {
                "devices": gpu.get("devices"),
                "feature_status": gpu.get("featureStatus"),
                "aux": {k: aux.get(k) for k in ("displayType", "glRenderer", "glVendor", "glVersion",
                                                 "glImplementationParts", "vulkanInfo",
                                                 "initializationTime", "inProcessGpu", "sandboxed")
                        if k in aux},
                "workarounds": gpu.get("driverBugWorkarounds"),
            }
        except Exception as err:
            return {"error": f"{type(err).__name__}: {err}"}

    def goto(self, url):
        self.note(f"navigate {url}")
        self.cdp.call("Page.navigate", {"url": url}, timeout=30)

    def close(self):
        try:
            if self.cdp:
                self.cdp.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.stderr.close()


PROBE_JS = r"""
(async () => {
  if (!('gpu' in navigator)) return { error: 'navigator.gpu is missing' };
  const out = { preferred_canvas_format: navigator.gpu.getPreferredCanvasFormat?.() };
  for (const pp of ['high-performance', 'low-power']) {
    let adapter;
    try { adapter = await navigator.gpu.requestAdapter({ powerPreference: pp }); }
    catch (err) { out[pp] = { error: String(err) }; continue; }
    if (!adapter) { out[pp] = null; continue; }
    const i = adapter.info || {};
    const l = adapter.limits;
    out[pp] = {
      vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description,
      is_fallback: i.isFallbackAdapter ?? adapter.isFallbackAdapter,
      subgroup_min: i.subgroupMinSize, subgroup_max: i.subgroupMaxSize,
      features: [...adapter.features].sort(),
      limits: {
        maxStorageBufferBindingSize: l.maxStorageBufferBindingSize, maxBufferSize: l.maxBufferSize,
        maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
        maxComputeInvocationsPerWorkgroup: l.maxComputeInvocationsPerWorkgroup,
        maxStorageBuffersPerShaderStage: l.maxStorageBuffersPerShaderStage,
      },
    };
  }
  try {
    const compat = await navigator.gpu.requestAdapter({ featureLevel: 'compatibility' });
    out.compatibility = compat ? [compat.info?.vendor, compat.info?.architecture, compat.info?.description].join(' / ') : null;
  } catch (err) { out.compatibility = String(err); }
  return out;
})()
"""

def run_probe(args):
    browser = Browser(args, args.label)
    result = {"label": args.label, "flags": args.flags}
    try:
        result["version"] = browser.connect().get("Browser")
        browser.goto(args.base.rstrip("/") + "/")
        time.sleep(1)
        result["adapter"] = browser.cdp.evaluate(PROBE_JS, timeout=args.timeout)
        result["gpu"] = browser.system_info()
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        browser.close()
    return result


def run_page(args):
    browser = Browser(args, args.label)
    query = urllib.parse.urlencode({
        "model": args.model, "prompt": PROMPT, "n": str(args.n), "temp": "0", "seed": "0",
        "autorun": "1", "cache": "0", **dict(q.split("=", 1) for q in args.query),
    })
    url = args.base.rstrip("/") + "/?" + query
    result = {"label": args.label, "flags": args.flags, "url": url, "n": args.n}
    started = time.time()
    try:
        result["version"] = browser.connect().get("Browser")
        browser.goto(url)
        deadline = time.time() + args.timeout
        done = None
        while time.time() < deadline:
            try:
                done = browser.cdp.evaluate("document.body ? document.body.dataset.done || '' : ''",
                                            timeout=10, await_promise=False)
            except Exception as err:  # the page may be navigating
                browser.note(f"poll: {err}")
            if done == "1":
                break
            time.sleep(0.5)
        result["autorun_seconds"] = round(time.time() - started, 2)
        state = browser.cdp.evaluate(
            "JSON.stringify({ last: window.__webshard_last, info: window.__webshard_info, "
            "speed: document.getElementById('speed')?.textContent, "
            "model_info: document.getElementById('model-info')?.textContent, "
            "error: document.getElementById('error')?.textContent, "
            "progress_events: (window.__webshard_progress || []).length })",
            timeout=10, await_promise=False)
        result.update(json.loads(state))
        if done != "1":
            result["error_autorun"] = f"autorun not done after {args.timeout} s"
            return result
        browser.note(f"autorun: {json.dumps(result.get('last'))[:400]}")
        warm = []
        for k in range(args.warm):
            out = browser.cdp.evaluate(
                "(async () => { const e = window.__webshard.state.engine; await e.reset(); "
                f"const o = await window.__webshard.generate({json.dumps(PROMPT)}, "
                f"{{ n: {args.n}, temp: 0, seed: 0 }}); "
                "return { decode_tok_s: o.decodeTokS, tokens: o.ids.length, decode_seconds: o.decodeSeconds, "
                "prefill_tokens: o.prefillTokens, prefill_seconds: o.prefillSeconds, "
                "finish: o.finishReason, ids_head: o.ids.slice(0, 8) }; })()",
                timeout=120)
            browser.note(f"warm {k}: {json.dumps(out)}")
            warm.append(out)
        result["warm"] = warm
        if warm:
            rates = sorted(w["decode_tok_s"] for w in warm)
            result["warm_decode_tok_s_median"] = rates[len(rates) // 2]
        # A second visit in the same browser (profile, GPU process and its caches kept): the
        # autorun again from a fresh page and worker.
        reloads = []
        for k in range(args.reloads):
            browser.goto("about:blank")
            time.sleep(0.5)
            again = time.time()
            browser.goto(url)
            done = None
            while time.time() < again + args.timeout:
                try:
                    done = browser.cdp.evaluate("document.body ? document.body.dataset.done || '' : ''",
                                                timeout=10, await_promise=False)
                except Exception as err:
                    browser.note(f"poll: {err}")
                if done == "1":
                    break
                time.sleep(0.25)
            last = json.loads(browser.cdp.evaluate("JSON.stringify(window.__webshard_last || null)",
                                                   timeout=10, await_promise=False) or "null") or {}
            entry = {"seconds": round(time.time() - again, 2), "decode_tok_s": last.get("decode_tok_s"),
                     "tokens": len(last.get("ids") or []), "error": last.get("error")}
            browser.note(f"reload {k}: {json.dumps(entry)}")
            reloads.append(entry)
        result["reloads"] = reloads
    except Exception as err:
        result["error_driver"] = f"{type(err).__name__}: {err}"
    finally:
        browser.close()
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["probe", "page"])
    parser.add_argument("--chrome", required=True)
    parser.add_argument("--base", default="http://127.0.0.1:8765")
    parser.add_argument("--flags", default="--enable-unsafe-webgpu")
    parser.add_argument("--label", default="run")
    parser.add_argument("--logs", default="/tmp/cdp-logs")
    parser.add_argument("--port", type=int, default=9222)
    parser.add_argument("--model", default="/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--reloads", type=int, default=0)
    parser.add_argument("--query", action="append", default=[],
                        help="KEY=VALUE added to the page's URL (e.g. subgroups=0)")
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    run = {"probe": run_probe, "page": run_page}[args.mode]
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
