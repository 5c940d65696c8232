#!/usr/bin/env python3
"""Drives N concurrent streaming chat completions through an OpenAI-compatible server and
prints aggregate decode tok/s, time to first token (p50/p99) and per-stream tok/s.

The same client measures `runner serve -m` and llama.cpp's `llama-server`, so the two are
compared by one yardstick. Standard library only (asyncio streams, HTTP/1.1, SSE), so it runs
on any machine with Python 3.8+, the device machine included. Loopback or a given URL only.

    bench_serve.py --url http://127.0.0.1:8080 --model NAME [--streams 1,4,16,64]
                   [--max-tokens 128] [--warmup 1] [--json FILE] [--endpoint chat|completions]
                   [--prompt-file F] [--unique-prompts] [--spec K]

`--prompt-file` asks every stream the file's text (the chat endpoint's user message, or the
completion's prompt) instead of an essay; `--spec K` adds webshard's `webshard_spec` (prompt
lookup drafts of at most K tokens), so one server's plain and speculative rates come from the
same client. `--unique-prompts` begins every request's prompt with a line of its own (a
request counter), so that no prefix cache, ours or llama-server's, serves any of it: the
warm-up round otherwise leaves a fixed `--prompt-file` cached, and time to first token then
measures a cached prefill (~2.5 ms whatever the prompt, docs/perf.md, session 37).

Tokens are counted from the final usage chunk (`stream_options.include_usage`) where the
server sends one, else as content chunks (one token each for both servers). Decode tok/s for a
stream is (tokens - 1) / (last token time - first token time); the aggregate is every stream's
tokens after its first over the span from the first first-token to the last last-token.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.request
from urllib.parse import urlsplit

TOPICS = ["rivers", "bridges", "volcanoes", "libraries", "trains", "forests", "comets", "bees",
          "lighthouses", "glaciers", "markets", "deserts", "clocks", "harbours", "orchards",
          "caves"]


def prompt(index):
    topic = TOPICS[index % len(TOPICS)]
    return f"Write a long, detailed essay about {topic}. Essay number {index}."


async def one_stream(host, port, path, body, api_key):
    """One streaming request; returns (first token time, last token time, tokens, started)."""
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode()
    headers = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
               f"Content-Length: {len(payload)}", "Accept: text/event-stream", "Connection: close"]
    if api_key:
        headers.append(f"Authorization: Bearer {api_key}")
    started = time.perf_counter()
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        rest = await reader.read(2000)
        raise RuntimeError(f"{status.decode().strip()}: {rest.decode(errors='replace')[:500]}")
    chunked = False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        chunked |= line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
    first = last = None
    content_chunks = usage_tokens = 0
    async for event in sse_events(reader, chunked):
        if event == "[DONE]":
            break
        message = json.loads(event)
        if message.get("usage"):
            usage_tokens = message["usage"].get("completion_tokens", 0)
        for choice in message.get("choices", []):
            if choice.get("delta", {}).get("content") or choice.get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
                content_chunks += 1
    writer.close()
    return first, last, usage_tokens or content_chunks, started


async def sse_events(reader, chunked):
    """The `data:` payloads of an SSE body, chunked transfer encoding or not."""
    buffer = b""
    while True:
        if chunked:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.strip().split(b";")[0] or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)
            buffer += data[:-2]
        else:
            data = await reader.read(65536)
            if not data:
                return
            buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip().decode()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def request(args, index):
    """The path and body of stream `index`'s request."""
    body = {"model": args.model, "stream": True, "max_tokens": args.max_tokens,
            "temperature": 0, "stream_options": {"include_usage": True}}
    if args.spec:
        body["webshard_spec"] = {"type": "lookup", "draft_max": args.spec}
    text = args.prompt_text or prompt(index)
    if args.unique_prompts:
        args.sent += 1
        text = f"Request {args.sent}.\n{text}"
    if args.endpoint == "completions":
        return "/v1/completions", {**body, "prompt": text}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}


async def run_level(args, streams):
    url = urlsplit(args.url)
    results = await asyncio.gather(*[
        one_stream(url.hostname, url.port or 80, *request(args, i), args.api_key)
        for i in range(streams)])
    ttft = [first - started for first, _, _, started in results if first]
    rates = [(tokens - 1) / (last - first) for first, last, tokens, _ in results
             if first and last > first and tokens > 1]
    span = max(last for _, last, _, _ in results if last) - min(first for first, *_ in results if first)
    decoded = sum(tokens - 1 for _, _, tokens, _ in results if tokens > 1)
    return {"streams": streams, "aggregate_tok_s": decoded / span if span > 0 else 0.0,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "per_stream_tok_s": statistics.median(rates) if rates else 0.0,
            "tokens": sum(tokens for _, _, tokens, _ in results)}


def decode_counters(args):
    """webshard's batched-step counters from /metrics (steps, rows, microseconds), or None
    where the server has no such counters (llama-server)."""
    try:
        request = urllib.request.Request(args.url.rstrip("/") + "/metrics")
        if args.api_key:
            request.add_header("Authorization", f"Bearer {args.api_key}")
        text = urllib.request.urlopen(request, timeout=10).read().decode()
    except OSError:
        return None
    wanted = {"webshard_decode_steps_total": 0, "webshard_decode_rows_total": 1,
              "webshard_decode_step_microseconds_total": 2}
    counts = [0, 0, 0]
    found = False
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            counts[wanted[name]] += int(float(line.rsplit(" ", 1)[1]))
            found = True
    return counts if found else None


def step_columns(before, after):
    """Mean rows per batched step and milliseconds per step between two counter readings."""
    if not before or not after or after[0] <= before[0]:
        return None, None
    steps = after[0] - before[0]
    return (after[1] - before[1]) / steps, (after[2] - before[2]) / steps / 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", default="1,4,16,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--api-key")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                        help="completions: a plain prompt, no chat template or reply parser "
                             "(llama-server withholds streamed text its chat parser cannot "
                             "place, so on random weights its chat streams undercount)")
    parser.add_argument("--prompt-file", help="every stream's prompt (default: an essay each)")
    parser.add_argument("--unique-prompts", action="store_true",
                        help="a line of its own in front of every request's prompt, so no "
                             "prefix cache serves it")
    parser.add_argument("--spec", type=int, metavar="K",
                        help="webshard_spec: prompt-lookup drafts of at most K tokens")
    parser.add_argument("--label", default="server")
    parser.add_argument("--json", help="append the rows as JSON lines to this file")
    parser.add_argument("--warmup", type=int, default=1,
                        help="unmeasured rounds at each level first (pipelines are built on a "
                             "batch size's first step, by both servers)")
    args = parser.parse_args()
    args.prompt_text = open(args.prompt_file).read() if args.prompt_file else None
    args.sent = 0
    host = urlsplit(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("bench_serve: loopback servers only")
    print(f"| {args.label} | streams | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | per-stream tok/s "
          "| rows/step | ms/step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for streams in [int(n) for n in args.streams.split(",")]:
        for _ in range(args.warmup):
            asyncio.run(run_level(args, streams))
        before = decode_counters(args)
        row = asyncio.run(run_level(args, streams))
        row["rows_per_step"], row["ms_per_step"] = step_columns(before, decode_counters(args))
        row["label"], row["model"] = args.label, args.model
        rows, ms = row["rows_per_step"], row["ms_per_step"]
        step = f"{rows:.1f} | {ms:.2f}" if rows is not None else "- | -"
        print(f"| {args.label} | {streams} | {row['aggregate_tok_s']:.1f} | {row['ttft_p50_s'] * 1e3:.0f} "
              f"| {row['ttft_p99_s'] * 1e3:.0f} | {row['per_stream_tok_s']:.1f} | {step} |", flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
