# %% [markdown]
# # The OpenAI-compatible route: any SDK, one shared engine
#
# The Jupyter server extension serves the engine over HTTP under `{base_url}mlx/v1/`, behind an
# API key of its own that opens these routes and nothing else of Jupyter. Anything that speaks the OpenAI API — the `openai` SDK, `curl`,
# editors, agents — or the Anthropic Messages API can use it, and every one of them shares the batch
# with your notebooks.
#
# In JupyterLab started with `make lab` the route is already there, and kernels find it through the
# `MLX_NB_URL` and `MLX_NB_TOKEN` variables. To keep this tutorial self-contained, it starts its own
# headless server (`jupyter mlx`) on a free local port.

# %%
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import atexit

import httpx

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
key_file = Path(tempfile.mkdtemp()) / "mlx-nb-api-key"  # by default: in Jupyter's runtime dir
jupyter = str(Path(sys.executable).with_name("jupyter"))
server = subprocess.Popen(
    [jupyter, "mlx", "--allow-root", "--ip=127.0.0.1", f"--port={port}", f"--MLXExtension.api_key_file={key_file}",
     "--ServerApp.open_browser=False", "--MLXExtension.model=smollm2-135m-instruct",
     "--MLXExtension.default_temperature=0"],  # greedy unless asked: the outputs below are reproducible
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
atexit.register(server.terminate)  # however this notebook ends, the server goes with its kernel
base = f"http://127.0.0.1:{port}/mlx/v1"


def wait_until_ready(timeout_s=120):
    """The health route needs no token: it only says whether the model is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"jupyter mlx exited with code {server.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server at {base} was not ready after {timeout_s} s")


wait_until_ready()
key = key_file.read_text().strip()  # the server also prints it when it starts

# %% [markdown]
# ## The openai SDK
# The server's mlx API key is the API key (sent as `Authorization: Bearer <key>`). It is written
# owner-only when the server first starts and kept across restarts; it opens the model routes and
# nothing else, so it is what an editor or agent should hold — never the Jupyter token.

# %%
from openai import OpenAI

client = OpenAI(base_url=base, api_key=key)

# %% tags=["nbval-check-output"]
print([m.id for m in client.models.list().data])

# %% tags=["nbval-ignore-output"]
reply = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24,
    temperature=0,
)
print(reply.choices[0].message.content)
print(reply.choices[0].finish_reason, reply.usage.completion_tokens, "tokens")

# %% tags=["nbval-check-output"]
print("Paris" in reply.choices[0].message.content, reply.choices[0].finish_reason in ("stop", "length"))

# %% [markdown]
# Streaming works as with any OpenAI server: chunks arrive as server-sent events.

# %% tags=["nbval-ignore-output"]
stream = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "Name three colours."}],
    max_tokens=24,
    temperature=0,
    stream=True,
)
pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
print(len(pieces) > 3, "".join(pieces))

# %% tags=["nbval-check-output"]
print("streamed in pieces:", len(pieces) > 3)

# %% [markdown]
# ## Tools
# Tools are offered in the prompt with the model's chat template; calls the model writes are parsed
# back into `tool_calls` (`finish_reason == "tool_calls"`), streamed ones as `delta.tool_calls`.
# A 135M model is not a reliable tool user, so we only look at what came back.

# %% tags=["nbval-ignore-output"]
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
reply = client.chat.completions.create(
    model="smollm2-135m-instruct", tools=tools, max_tokens=48, temperature=0,
    messages=[{"role": "user", "content": "What's the weather in Paris?"}],
)
print(reply.choices[0].finish_reason, reply.choices[0].message.tool_calls or reply.choices[0].message.content)

# %% [markdown]
# The other half of the loop: once your code has run the tool, send its result back as a `tool`
# message after the assistant's call, and the model answers from it. The whole conversation,
# call and result included, goes through the model's chat template.

# %% tags=["nbval-ignore-output"]
call = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
reply = client.chat.completions.create(
    model="smollm2-135m-instruct", tools=tools, max_tokens=32, temperature=0,
    messages=[{"role": "user", "content": "What's the weather in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees Celsius."}],
)
print(reply.choices[0].message.content)

# %% tags=["nbval-check-output"]
print("answered from the tool result:", "24" in reply.choices[0].message.content)

# %% [markdown]
# ## The anthropic SDK
# The Messages API is served too; the Anthropic SDK sends its key as `x-api-key`, which the routes
# accept as well. (This server samples greedily unless a request sets a temperature: its
# `default_temperature` is 0, where the APIs' own default is 1.)

# %% tags=["nbval-ignore-output"]
from anthropic import Anthropic

claude_style = Anthropic(base_url=f"http://127.0.0.1:{port}/mlx", api_key=key)
message = claude_style.messages.create(
    model="smollm2-135m-instruct", max_tokens=24,
    system="Answer in one sentence.",
    messages=[{"role": "user", "content": "What is the capital of France?"}],
)
print(message.content[0].text)
print(message.stop_reason)

# %% tags=["nbval-check-output"]
print("Paris" in message.content[0].text, message.stop_reason in ("end_turn", "max_tokens"))

# %% [markdown]
# And streamed, with the SDK's own helper:

# %% tags=["nbval-ignore-output"]
with claude_style.messages.stream(
    model="smollm2-135m-instruct", max_tokens=24,
    messages=[{"role": "user", "content": "Name three colours."}],
) as events:
    text = "".join(events.text_stream)
    final = events.get_final_message()
print(text)
print(final.stop_reason, final.usage.output_tokens, "tokens")

# %% tags=["nbval-check-output"]
print("streamed:", text == final.content[0].text and final.usage.output_tokens > 0)

# %% [markdown]
# ## Without the key, nothing; with it, nothing else
# Every model route requires the key (or Jupyter's own login). The key opens no Jupyter route, and
# this headless server serves no kernels, files or terminals at all.

# %% tags=["nbval-check-output"]
print(httpx.post(f"{base}/chat/completions", json={"messages": []}).status_code)
with_key = {"Authorization": f"Bearer {key}"}
print(httpx.get(f"http://127.0.0.1:{port}/api/status", headers=with_key).status_code)
print(httpx.get(f"http://127.0.0.1:{port}/api/kernels", headers=with_key).status_code)

# %%
server.terminate()
server.wait(30);
