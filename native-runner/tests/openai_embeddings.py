"""The official `openai` Python client's `embeddings.create` against `runner serve -m` on an
embedding model (run by tests/api_embeddings.rs).

Usage: openai_embeddings.py BASE_URL API_KEY MODEL REFERENCE_JSON
REFERENCE_JSON is `runner embed --normalize --json` of TEXTS: every vector through the API
(float or base64, one text or many, texts or their token ids, concurrent requests) must equal
it, and malformed or oversized inputs must get 400s that name the field.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

# The texts `runner embed` was given, in order (tests/api_embeddings.rs passes the same).
TEXTS = ["A man is playing a guitar.", "Someone is playing an instrument.", "x"]
# f32 through JSON and base64, from separate batches: equal to rounding.
TOLERANCE = 1e-5


def expect_error(call, status, param=None, code=None):
    try:
        call()
    except openai.APIStatusError as err:
        assert err.status_code == status, (err.status_code, err)
        body = err.body or {}
        if param is not None:
            assert body.get("param") == param, body
        if code is not None:
            assert body.get("code") == code, body
        assert body.get("message"), body
        return body["message"]
    raise AssertionError(f"expected a {status}")


def close(got, want):
    assert len(got) == len(want), (len(got), len(want))
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst <= TOLERANCE, worst


def check(response, wants, tokens):
    assert response.object == "list"
    assert [d.index for d in response.data] == list(range(len(wants)))
    for data, want in zip(response.data, wants):
        assert data.object == "embedding"
        close(list(data.embedding), want)
    assert response.usage.prompt_tokens == tokens, response.usage
    assert response.usage.total_tokens == tokens, response.usage


def main():
    base, key, model, reference = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    client = openai.OpenAI(base_url=base + "v1", api_key=key, max_retries=0, timeout=600)
    wants = [d["embedding"] for d in reference["data"]]
    counts = [d["tokens"] for d in reference["data"]]
    assert [m.id for m in client.models.list().data] == [model]

    # The client asks for base64 unless told otherwise; both formats must decode alike.
    one = client.embeddings.create(model=model, input=TEXTS[0])
    check(one, wants[:1], counts[0])
    many = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    check(many, wants, sum(counts))
    assert many.model == model

    # Token ids: the raw HTTP body shows the ids llama.cpp's tokenizer gives.
    raw = client.with_raw_response.embeddings.create(
        model=model, input=TEXTS[1], encoding_format="float"
    ).http_response.json()
    assert len(raw["data"][0]["embedding"]) == reference["dimensions"]
    ids = reference["data"][1]["ids"]
    check(client.embeddings.create(model=model, input=ids), wants[1:2], len(ids))
    lists = [reference["data"][i]["ids"] for i in range(len(TEXTS))]
    check(client.embeddings.create(model=model, input=lists), wants, sum(counts))

    # Concurrent requests are batched by the worker and still answered each their own.
    with ThreadPoolExecutor(max_workers=6) as pool:
        jobs = [pool.submit(client.embeddings.create, model=model, input=TEXTS[i % 3])
                for i in range(6)]
        for i, job in enumerate(jobs):
            check(job.result(), [wants[i % 3]], counts[i % 3])

    long = "word " * 1000
    message = expect_error(
        lambda: client.embeddings.create(model=model, input=["fine", long]),
        400, param="input[1]", code="context_length_exceeded")
    assert "input 1" in message, message
    expect_error(lambda: client.embeddings.create(model=model, input=[]), 400, param="input")
    expect_error(lambda: client.embeddings.create(model=model, input=["a", [1, 2]]),
                 400, param="input[1]")
    expect_error(lambda: client.embeddings.create(model=model, input=[[1, -2]]),
                 400, param="input[0][1]")
    expect_error(lambda: client.embeddings.create(model=model, input=[10**9]),
                 400, param="input[0]")
    expect_error(lambda: client.embeddings.create(
        model=model, input="a", encoding_format="int8"), 400, param="encoding_format")
    expect_error(lambda: client.embeddings.create(model=model, input="a", dimensions=7),
                 400, param="dimensions")
    expect_error(lambda: client.embeddings.create(
        model=model, input="a", extra_body={"pooling": "max"}), 400)
    expect_error(lambda: client.embeddings.create(model="nope", input="a"), 404, param="model")
    print("all checks passed")


if __name__ == "__main__":
    main()
