"""The official `openai` Python client against `runner serve -m` (run by tests/api_clients.rs).

Usage: openai_client.py BASE_URL API_KEY MODEL REFERENCE_JSON
REFERENCE_JSON is `runner generate --chat --temp 0 --json` of PROMPT with MAX_TOKENS; greedy
answers through the API must equal it.
"""

import json
import sys

import jsonschema
import openai

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8


def expect_error(kind, call, status, param=None, code=None):
    try:
        call()
    except kind as err:
        assert err.status_code == status, (err.status_code, err)
        body = err.body or {}
        if param is not None:
            assert body.get("param") == param, body
        if code is not None:
            assert body.get("code") == code, body
        assert body.get("message"), body
        return
    raise AssertionError(f"expected {kind.__name__} ({status})")


def main():
    base, key, model, reference = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    client = openai.OpenAI(base_url=base + "v1", api_key=key, max_retries=0, timeout=600)
    messages = [{"role": "user", "content": PROMPT}]
    want_text, want_ids = reference["text"], reference["ids"]
    want_finish = "length" if len(want_ids) == MAX_TOKENS else "stop"

    assert [m.id for m in client.models.list().data] == [model]

    chat = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS
    )
    choice = chat.choices[0]
    assert choice.message.content == want_text, (choice.message.content, want_text)
    assert choice.message.role == "assistant"
    assert choice.finish_reason == want_finish, choice.finish_reason
    assert chat.usage.completion_tokens == len(want_ids), chat.usage
    assert chat.usage.prompt_tokens == len(reference["prompt_ids"]), chat.usage
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")

    # The same conversation again: the engine still holds its prefix.
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_completion_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == want_text, (pieces, want_text)
    assert finish == want_finish, finish
    assert usage.completion_tokens == len(want_ids), usage
    assert usage.prompt_tokens_details.cached_tokens > 0, usage

    # Speculative decoding, this server's extension through the client's extra_body: the same
    # text (drafts change the speed, never the output).
    drafted = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body={"webshard_spec": {"type": "lookup", "draft_max": 4}},
    )
    assert drafted.choices[0].message.content == want_text, (drafted.choices[0].message, want_text)
    assert drafted.usage.completion_tokens == len(want_ids), drafted.usage

    # Legacy completions from the reference's own prompt ids, whole and streamed.
    done = client.completions.create(
        model=model, prompt=reference["prompt_ids"], temperature=0, max_tokens=MAX_TOKENS
    )
    assert done.choices[0].text == want_text, (done.choices[0].text, want_text)
    assert done.usage.completion_tokens == len(want_ids)
    text_prompt = "The capital of France is"
    whole = client.completions.create(model=model, prompt=text_prompt, temperature=0, max_tokens=4)
    streamed = client.completions.create(
        model=model, prompt=text_prompt, temperature=0, max_tokens=4, stream=True
    )
    joined = "".join(c.choices[0].text for c in streamed if c.choices)
    assert joined == whole.choices[0].text, (joined, whole.choices[0].text)

    # Log-probabilities: one entry per token; the greedy token is (up to a near-tie) the best.
    probed = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = probed.choices[0].logprobs.content
    assert len(content) == probed.usage.completion_tokens, content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2, entry
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob, entry
        assert abs(entry.logprob - entry.top_logprobs[0].logprob) < 0.5, entry

    # Structured output: JSON Schema and JSON mode; the content parses and validates.
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "country": {"enum": ["France", "Germany", "Italy"]},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content), schema)
    assert shaped.choices[0].finish_reason == "stop", shaped.choices[0]
    mode = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_object"},
    )
    if mode.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(mode.choices[0].message.content), dict), mode
    # The legacy endpoint takes `response_format` too (the client passes it as an extra field).
    legacy = client.completions.create(
        model=model,
        prompt="The capital of France as JSON:",
        temperature=0,
        max_tokens=40,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}},
    )
    jsonschema.validate(json.loads(legacy.choices[0].text), schema)
    expect_error(
        openai.BadRequestError,
        lambda: client.chat.completions.create(
            model=model,
            messages=messages,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}},
        ),
        400,
        param="response_format.json_schema.schema",
    )

    # Penalties: zero changes nothing; in range they are applied; out of range is a 400.
    zero = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        frequency_penalty=0,
        presence_penalty=0,
    )
    assert zero.choices[0].message.content == want_text, (zero.choices[0].message.content, want_text)
    penalised = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=MAX_TOKENS,
        frequency_penalty=2,
        presence_penalty=2,
    )
    assert penalised.usage.completion_tokens > 0, penalised
    for name in ("frequency_penalty", "presence_penalty"):
        expect_error(
            openai.BadRequestError,
            lambda: client.chat.completions.create(
                model=model, messages=messages, max_tokens=1, **{name: 2.5}
            ),
            400,
            param=name,
        )

    # An error of each kind.
    expect_error(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=model, messages=messages, temperature=5),
        400,
        param="temperature",
    )
    expect_error(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=model, messages=messages, n=2),
        400,
        param="n",
    )
    long_messages = [{"role": "user", "content": "hello " * 2000}]
    expect_error(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=model, messages=long_messages),
        400,
        code="context_length_exceeded",
    )
    expect_error(
        openai.NotFoundError,
        lambda: client.chat.completions.create(model="no-such-model", messages=messages),
        404,
        param="model",
        code="model_not_found",
    )
    wrong_key = openai.OpenAI(base_url=base + "v1", api_key="wrong", max_retries=0)
    expect_error(openai.AuthenticationError, lambda: wrong_key.models.list(), 401, code="invalid_api_key")
    huge = [{"role": "user", "content": "x" * (5 << 20)}]
    expect_error(
        openai.APIStatusError,
        lambda: client.chat.completions.create(model=model, messages=huge),
        413,
    )
    print("openai python client: all checks passed")


if __name__ == "__main__":
    main()
