#!/usr/bin/env python3
"""OpenAI's own Python client against a running `hylo serve` (issue 12: "a real
client"). Not part of the tests or CI (they need no Python); a compatibility
check whose output goes into docs/SERVING.md.

    hylo serve MODEL --port 18490 &
    python3 scripts/ref/openai_client_check.py http://127.0.0.1:18490/v1

Each check prints one line, PASS or FAIL with what was seen; the exit status is
the number of failures. Checks: models.list; chat.completions (greedy twice:
equal answers; usage counts; finish_reason); the same streamed (its chunks
joined equal the non-streamed answer, a usage chunk with
stream_options.include_usage); completions (plain prompt, greedy, stop string:
the answer ends before it); seed + temperature (same seed, same answer);
log-probabilities in the client's types (chat: one entry a token, 3
alternatives, the greedy token first; completions: the tokens spell the
text); presence / frequency penalties change a repetitive answer; a logit
bias of 100 makes every token one; and bad requests raising the client's
BadRequestError with status 400 (temperature out of range, n = 2, max_tokens
-1).
"""
import sys

import openai

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = openai.OpenAI(base_url=url, api_key="none")
fails = 0


def check(name, ok, seen):
    global fails
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {seen}")


models = client.models.list()
model = models.data[0].id
check("models.list", len(models.data) == 1, f"{[m.id for m in models.data]}")

msgs = [{"role": "user", "content": "What is the capital of France?"}]
a = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
b = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
text = a.choices[0].message.content
check("chat greedy twice", text == b.choices[0].message.content, repr(text))
check("chat usage", a.usage.completion_tokens > 0 and a.usage.prompt_tokens > 0
      and a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens,
      f"prompt {a.usage.prompt_tokens}, completion {a.usage.completion_tokens}, total {a.usage.total_tokens}")
check("chat finish_reason", a.choices[0].finish_reason in ("stop", "length"), a.choices[0].finish_reason)

parts, usage, finish = [], None, None
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0, stream=True,
                                        stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
check("chat stream equals non-stream", "".join(parts) == text, f"{len(parts)} chunks, {''.join(parts)!r}")
check("chat stream usage and finish", usage is not None and usage.completion_tokens == a.usage.completion_tokens
      and finish == a.choices[0].finish_reason, f"usage {usage}, finish {finish}")

c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=16, temperature=0)
plain = c.choices[0].text
check("completions greedy", len(plain) > 0, repr(plain))
words = plain.split()
if len(words) >= 3:
    stop = words[2]
    s = client.completions.create(model=model, prompt="The capital of France is", max_tokens=16, temperature=0,
                                  stop=[stop])
    check("completions stop string", stop not in s.choices[0].text and plain.startswith(s.choices[0].text)
          and s.choices[0].finish_reason == "stop", f"stop {stop!r}: {s.choices[0].text!r}, {s.choices[0].finish_reason}")

r1 = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0.9, seed=7)
r2 = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0.9, seed=7)
check("seed reproduces a sampled answer", r1.choices[0].message.content == r2.choices[0].message.content,
      repr(r1.choices[0].message.content))

lp = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                    top_logprobs=3)
content = lp.choices[0].logprobs.content
check("chat logprobs", len(content) == lp.usage.completion_tokens and all(
      e.logprob <= 0 and len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in content),
      f"{[(e.token, round(e.logprob, 3)) for e in content]}")
clp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                logprobs=2)
l = clp.choices[0].logprobs
check("completions logprobs", "".join(l.tokens) == clp.choices[0].text and len(l.token_logprobs) == len(l.tokens)
      and all(len(t) == 2 for t in l.top_logprobs), f"{l.tokens}, offsets {l.text_offset}")
pen = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                presence_penalty=2, frequency_penalty=2)
nop = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
check("penalties change a repetitive answer", pen.choices[0].text != nop.choices[0].text,
      f"{nop.choices[0].text!r} -> {pen.choices[0].text!r}")
tok = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
                                logit_bias={"28": 100}, logprobs=0)
check("logit_bias forces a token", len(set(tok.choices[0].logprobs.tokens)) == 1, repr(tok.choices[0].text))

for name, kw in (("temperature 5", {"temperature": 5}), ("n = 2", {"n": 2}), ("max_tokens -1", {"max_tokens": -1})):
    try:
        client.chat.completions.create(model=model, messages=msgs, **kw)
        check(f"bad request ({name})", False, "no error")
    except openai.BadRequestError as e:
        check(f"bad request ({name})", e.status_code == 400, f"400 {e.body}")
    except Exception as e:  # noqa: BLE001 - any other outcome is the failure to report
        check(f"bad request ({name})", False, f"{type(e).__name__}: {e}")

print(f"{fails} failure(s)")
sys.exit(fails)
