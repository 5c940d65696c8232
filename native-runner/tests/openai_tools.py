"""Tool calls with the official `openai` Python client (run by tests/api_tools.rs on the Qwen3 twin).

Usage: openai_tools.py BASE_URL API_KEY MODEL
"""

import json
import sys

import jsonschema
import openai

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER,
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER_TOKENS = 4


def the_call(client, model):
    """The model calls get_weather with valid arguments (`required`: the call's grammar, whatever
    the model would say unconstrained)."""
    answer = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=40
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == "get_weather", call
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    return choice.message


def streamed_call(client, model):
    """The same request streamed, the function named: OpenAI's deltas (index, id, type and
    name first, then argument fragments) reassemble to one call."""
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=40,
        stream=True,
    )
    deltas, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            assert not c.delta.content, c.delta
            deltas.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    assert finish == "tool_calls", finish
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function", first
    assert first.function.name == "get_weather" and first.function.arguments == "", first
    assert rest and all(d.index == 0 and d.id is None and d.function.name is None for d in rest), rest
    return first.function.name, "".join(d.function.arguments for d in rest)


def main():
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=base + "v1", api_key=key, max_retries=0, timeout=900)
    call_message = the_call(client, model)
    call = call_message.tool_calls[0]
    name, arguments = streamed_call(client, model)
    assert (name, arguments) == (call.function.name, call.function.arguments), (name, arguments, call)

    # The round trip: the call and its result go back; with `auto` (the default) the model
    # answers in content (the twin's random weights say nothing that ends: a few tokens).
    # The answer's message object goes back as it is, as OpenAI's examples do.
    messages = QUESTION + [
        call_message,
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})},
    ]
    answer = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=ANSWER_TOKENS
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None, choice.message
    assert choice.message.content and choice.message.content.strip(), choice.message
    assert choice.finish_reason == "length" and answer.usage.completion_tokens == ANSWER_TOKENS, answer
    assert answer.usage.prompt_tokens_details.cached_tokens > 0, answer.usage
    print("answer:", choice.message.content)
    print("openai tools client: all checks passed")


if __name__ == "__main__":
    main()
