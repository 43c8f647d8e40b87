#!/usr/bin/env python3
"""The official `openai` Python package against `kiln serve` on loopback: models,
completions (with echo and logprobs), chat (plain and streamed, structured outputs, a forced tool
call), responses (plain, streamed, a forced function call and its output sent back), embeddings
(the client's default base64 encoding), and a bad request surfacing as openai.BadRequestError. Exits 77 (CTest: skipped)
when the package or the real models are missing.
Usage: openai_client_test.py KILN_BINARY MODELS_DIR"""
import json
import os
import re
import subprocess
import sys

try:
    import openai
except ImportError:
    print("openai package not installed (pip install openai); skipping")
    sys.exit(77)

kiln, models = sys.argv[1], os.environ.get("KILN_MODELS_DIR", sys.argv[2])
llm = os.path.join(models, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
enc = os.path.join(models, "all-minilm-l6-v2")
if not (os.path.exists(llm) and os.path.exists(enc)):
    print("real models not fetched (scripts/fetch_models.sh); skipping")
    sys.exit(77)

proc = subprocess.Popen([kiln, "serve", "-m", "smollm2=" + llm, "-m", "minilm=" + enc, "--port", "0",
                         "--api-key", "sk-kiln-test"], stderr=subprocess.PIPE, text=True)
try:
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "kiln serve did not start"
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-kiln-test", max_retries=0)

    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["minilm", "smollm2"], ids

    c = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert "Paris" in c.choices[0].text, c
    assert c.usage.completion_tokens == 6 and c.usage.prompt_tokens > 3, c.usage

    # echo + logprobs, as lm-evaluation-harness scores a continuation: the prompt's tokens'
    # logprobs (the first None) then the completion's; max_tokens 0: the prompt alone.
    e = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=1,
                                  temperature=0, echo=True, logprobs=1)
    lp = e.choices[0].logprobs
    assert e.choices[0].text.startswith("The capital of France is"), e.choices[0].text
    assert len(lp.tokens) == e.usage.prompt_tokens + 1 and lp.token_logprobs[0] is None, lp
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
    assert all(len(t) == 1 for t in lp.top_logprobs[1:]), lp.top_logprobs
    p0 = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=0,
                                   echo=True, logprobs=1)
    assert p0.choices[0].text == "The capital of France is" and p0.usage.completion_tokens == 0, p0
    p0lp = p0.choices[0].logprobs.token_logprobs
    assert len(p0lp) == len(lp.token_logprobs) - 1 and p0lp[0] is None, p0lp
    assert max(abs(a - b) for a, b in zip(p0lp[1:], lp.token_logprobs[1:-1])) < 1e-5, (p0lp, lp.token_logprobs)

    chat = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8, temperature=0)
    text = chat.choices[0].message.content
    assert "Paris" in text, text
    assert chat.choices[0].message.role == "assistant"

    # Structured outputs and a forced tool call, as the client sends them.
    so = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}],
        max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"], "additionalProperties": False}}})
    assert set(json.loads(so.choices[0].message.content)) == {"city"}, so.choices[0].message.content
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}}]
    tc = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=40,
        temperature=0, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = tc.choices[0].message.tool_calls[0]
    assert tc.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather", tc
    assert isinstance(json.loads(call.function.arguments)["city"], str), call

    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
    assert "".join(parts) == text, ("".join(parts), text)
    assert usage and usage.completion_tokens == chat.usage.completion_tokens, usage

    # The Responses API (stateless, as vLLM's store=false): plain, streamed, function tools.
    r = client.responses.create(model="smollm2", input="What is the capital of France?", max_output_tokens=8,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.output_text == text, (r.output_text, text)
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed"), r.status
    assert r.usage.input_tokens == chat.usage.prompt_tokens, (r.usage, chat.usage)
    assert r.usage.output_tokens == chat.usage.completion_tokens, (r.usage, chat.usage)
    ri = client.responses.create(model="smollm2", instructions="Answer in one word.", max_output_tokens=4,
                                 input=[{"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]}])
    assert ri.instructions == "Answer in one word." and ri.output[0].type == "message", ri
    events = list(client.responses.create(model="smollm2", input="What is the capital of France?",
                                          max_output_tokens=8, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response." + r.status, types
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text, (deltas, r.output_text)
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens == \
        r.usage.output_tokens, events[-1]
    js = client.responses.create(
        model="smollm2", input="Which city is the capital of France? Answer in JSON.", max_output_tokens=60,
        temperature=0, text={"format": {"type": "json_schema", "name": "answer", "strict": True, "schema": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"], "additionalProperties": False}}})
    assert set(json.loads(js.output_text)) == {"city"} and js.text.format.type == "json_schema", js
    rtools = [{"type": "function", "name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}]
    rc = client.responses.create(model="smollm2", input="What is the weather in Paris?", max_output_tokens=40,
                                 temperature=0, tools=rtools, tool_choice={"type": "function", "name": "get_weather"})
    fc = [o for o in rc.output if o.type == "function_call"]
    assert len(fc) == 1 and fc[0].name == "get_weather" and fc[0].call_id.startswith("call_"), rc.output
    assert isinstance(json.loads(fc[0].arguments)["city"], str), fc[0]
    # The call and its output sent back as input items: the conversation goes on.
    follow = client.responses.create(model="smollm2", max_output_tokens=8, temperature=0, tools=rtools,
                                     tool_choice="none", input=[
                                         {"role": "user", "content": "What is the weather in Paris?"}, fc[0],
                                         {"type": "function_call_output", "call_id": fc[0].call_id, "output": "18C"}])
    assert follow.usage.input_tokens > rc.usage.input_tokens and follow.output[0].type == "message", follow
    try:
        client.responses.create(model="smollm2", input="hi", previous_response_id="resp_123")
        raise AssertionError("previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert "previous_response_id" in str(e), e

    emb = client.embeddings.create(model="minilm", input=["a cat sits on the mat", "a dog runs"])
    vecs = [d.embedding for d in emb.data]
    assert len(vecs) == 2 and len(vecs[0]) == 384, len(vecs[0])
    assert abs(sum(x * x for x in vecs[0]) - 1.0) < 1e-3
    # dimensions: the leading values of the same embedding, normalized again.
    short = client.embeddings.create(model="minilm", input=["a cat sits on the mat"], dimensions=64).data[0].embedding
    assert len(short) == 64, len(short)
    norm = sum(x * x for x in vecs[0][:64]) ** 0.5
    assert max(abs(a - b / norm) for a, b in zip(short, vecs[0][:64])) < 1e-5

    try:
        client.completions.create(model="smollm2", prompt="x", max_tokens=-1)
        raise AssertionError("max_tokens=-1 was accepted")
    except openai.BadRequestError as e:
        assert "max_tokens" in str(e), e
    try:
        client.completions.create(model="nope", prompt="x")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError:
        pass
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError:
        pass
    print("openai client test passed (openai", openai.__version__ + ")")
finally:
    proc.terminate()
    proc.wait(timeout=30)
