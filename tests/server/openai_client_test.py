#!/usr/bin/env python3
"""The official `openai` Python package against `kiln serve` on loopback: models,
completions (with echo and logprobs), chat (plain and streamed, structured outputs, a forced tool
call), embeddings (the client's default base64
encoding), and a bad request surfacing as openai.BadRequestError. Exits 77 (CTest: skipped)
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
