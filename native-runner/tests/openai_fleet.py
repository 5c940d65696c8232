"""The official `openai` Python client against `runner serve -m MODEL --donors N`, the API on a
fleet (run by tests/api_fleet.rs).

Usage: openai_fleet.py BASE_URL MODEL REFERENCE_JSON WAIT_SECONDS
Waits up to WAIT_SECONDS for /health (the donors join and load their layers), then checks that
greedy answers equal REFERENCE_JSON (`runner generate --chat --temp 0 --json` of PROMPT with
MAX_TOKENS), whole, streamed and two at once, that a request arriving during a long one is
answered before it, that structured output holds on the fleet, and that log-probabilities come
with the same greedy text, one entry per token, the token its own best alternative (their values
against one device's are checked by tests/shard_roles/logprobs.rs).
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8
LONG_TOKENS = 32


def wait_healthy(base, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(base + "health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except urllib.error.HTTPError as err:
            assert err.code == 503, err
        except urllib.error.URLError:
            pass
        assert time.monotonic() < deadline, f"/health not 200 within {seconds} s"
        time.sleep(0.2)


def greedy_chat(client, model, messages, max_tokens=MAX_TOKENS):
    return client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=max_tokens
    )


def main():
    base, model, reference, wait = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    wait_healthy(base, float(wait))
    client = openai.OpenAI(base_url=base + "v1", api_key="unused", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": PROMPT}]
    want_text, want_ids = reference["text"], reference["ids"]
    want_finish = "length" if len(want_ids) == MAX_TOKENS else "stop"

    assert [m.id for m in client.models.list().data] == [model]

    chat = greedy_chat(client, model, messages)
    choice = chat.choices[0]
    assert choice.message.content == want_text, (choice.message.content, want_text)
    assert choice.finish_reason == want_finish, choice.finish_reason
    assert chat.usage.completion_tokens == len(want_ids), chat.usage
    assert chat.usage.prompt_tokens == len(reference["prompt_ids"]), chat.usage

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        pieces.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(pieces) == want_text, (pieces, want_text)
    assert usage.completion_tokens == len(want_ids), usage

    # Two at once go through the chain together (the coordinator's micro-batching).
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: greedy_chat(client, model, messages), range(2)))
    for answer in both:
        assert answer.choices[0].message.content == want_text, answer

    # A request that arrives while a long one runs joins the chain at once and is answered when
    # it ends, not when the long one does. The long one runs to its limit (SmolLM2 tells this
    # story past 32 tokens) and the short one asks for two tokens: a wide margin, as loaded
    # machines (CI) stretch one donor's steps against the other's.
    first_chunk, long_done = threading.Event(), threading.Event()
    long_pieces = []

    def long_stream():
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
            temperature=0,
            max_tokens=LONG_TOKENS,
            stream=True,
        )
        for chunk in stream:
            first_chunk.set()
            long_pieces.extend(c.delta.content or "" for c in chunk.choices)
        long_done.set()

    runner = threading.Thread(target=long_stream)
    runner.start()
    assert first_chunk.wait(300), "the long request never streamed"
    short = greedy_chat(client, model, messages, max_tokens=2)
    streamed = len(long_pieces)
    print(f"the short request was answered after {streamed} of the long one's {LONG_TOKENS} pieces")
    text = short.choices[0].message.content
    assert text and want_text.startswith(text) and short.usage.completion_tokens == 2, short
    assert not long_done.is_set(), (
        f"the short request was held until the long one ended ({streamed} pieces streamed)"
    )
    runner.join()

    done = client.completions.create(
        model=model, prompt=reference["prompt_ids"], temperature=0, max_tokens=MAX_TOKENS
    )
    assert done.choices[0].text == want_text, (done.choices[0].text, want_text)

    schema = {
        "type": "object",
        "properties": {"country": {"enum": ["France", "Germany", "Italy"]}},
        "required": ["country"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=24,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "country", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content), schema)

    probed = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        logprobs=True,
        top_logprobs=2,
    )
    assert probed.choices[0].message.content == want_text, probed
    content = probed.choices[0].logprobs.content
    assert len(content) == probed.usage.completion_tokens == len(want_ids), probed
    for entry in content:
        top = entry.top_logprobs
        assert entry.logprob <= 0 and len(top) == 2, entry
        assert top[0].logprob >= top[1].logprob, entry
        assert (entry.token, entry.logprob) == (top[0].token, top[0].logprob), entry

    print("all checks passed")


if __name__ == "__main__":
    main()
