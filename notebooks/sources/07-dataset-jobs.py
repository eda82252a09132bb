# %% [markdown]
# # Dataset jobs: one question over a whole table
#
# What you usually do with a model in a notebook is not one chat but *the same question over many
# rows*: extract fields from records, label tickets, translate a column. `Client.map` runs that as a
# **job**: its rows are background rows of the shared batch (they fill the slots interactive chats
# leave free, and yield them back when a chat arrives), every finished row is written to disk as it
# ends, and asking for the same map again after a kernel restart resumes it instead of starting over.
#
# Here: pull fields out of a small table into DataFrame columns with a schema, then run the same rows
# as an OpenAI Batch API job through the server's `/v1/files` and `/v1/batches` routes.

# %%
import pandas as pd
from pydantic import BaseModel

from mlx_nb import Client

people = pd.DataFrame({"text": [
    "Ana is 34 and lives in Lisbon.",
    "Bo, a 27-year-old from Oslo, plays the cello.",
    "Chen (41) moved to Lagos last year.",
    "Dara lives in Lima; she is 29.",
    "Eli is 52 years old and has a farm near Kyoto.",
    "Femi, 23, studies in Porto.",
]})
client = Client(model="smollm2-135m-instruct")

# %% [markdown]
# ## A map with a schema
# The prompt is a template naming the row's fields (`{text}` here); `schema` holds every answer to
# the pydantic model token by token, and each field becomes a column. A row that fails (a prompt too
# long for the model, an answer the budget cut short) gets its reason in the `error` column instead of
# stopping the others. The widget shows rows done, tokens/s, the ETA and a Stop button while it runs;
# once done it leaves a picture of how the job went.


# %%
class Person(BaseModel):
    name: str
    age: int
    city: str


table = client.map(people, "Extract the person's name, age and city from: {text}", schema=Person,
                   max_tokens=48)

# %% tags=["nbval-ignore-output"]
table

# %% [markdown]
# A 135M-parameter model reads the names and cities well and the ages less so: the schema guarantees the
# *shape* of every answer (the right fields, an integer age), not that the model got it right.

# %% tags=["nbval-check-output"]
print(list(table.columns))
print(len(table), "rows,", int(table["error"].isna().sum()), "without error")
print(all(isinstance(a, int) for a in table["age"].dropna()))

# %% [markdown]
# Asked again, the same map finds its job (the rows and settings are its fingerprint) and returns at
# once: this is also what happens after a kernel restart in the middle of a map, except that then only
# the unfinished rows run.

# %% tags=["nbval-check-output"]
again = client.map(people, "Extract the person's name, age and city from: {text}", schema=Person,
                   max_tokens=48, progress=False)
print(again[["name", "age", "city"]].equals(table[["name", "age", "city"]]))
print(client.jobs()[0]["status"])

# %% [markdown]
# The same thing as a cell magic: the cell body is the template, `--out` names the result.

# %% tags=["nbval-ignore-output"]
%load_ext mlx_nb

# %% tags=["nbval-ignore-output"]
%%mlx map people --out cities --json-schema Person -n 48
Which city does this text name? {text}

# %% tags=["nbval-check-output"]
print(type(cities).__name__, len(cities))

# %% [markdown]
# ## The same rows as an OpenAI batch
# A Jupyter server with this extension serves OpenAI's Batch API: upload a JSONL of requests
# (`purpose="batch"`), create a batch, poll it, download the output file. Here a headless `jupyter mlx`
# on a free local port stands in for the Lab's own server.

# %%
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import atexit

import httpx
from openai import OpenAI

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
home = Path(tempfile.mkdtemp())
server = subprocess.Popen(
    [str(Path(sys.executable).with_name("jupyter")), "mlx", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
     f"--MLXExtension.api_key_file={home / 'key'}", f"--MLXExtension.jobs_dir={home / 'jobs'}",
     "--ServerApp.open_browser=False", "--MLXExtension.model=smollm2-135m-instruct"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
atexit.register(server.terminate)
base = f"http://127.0.0.1:{port}/mlx/v1"
deadline = time.monotonic() + 180
while True:
    try:
        if httpx.get(f"{base}/health", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
    time.sleep(0.2)
openai = OpenAI(base_url=base, api_key=(home / "key").read_text().strip())

# %% [markdown]
# One request a line, each with a `custom_id` to match its result by; a line that is not JSON does
# not stop the batch, it becomes that line's entry in the error file.

# %%
lines = [json.dumps({"custom_id": f"person-{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "smollm2-135m-instruct", "max_tokens": 48, "temperature": 0,
                              "messages": [{"role": "user", "content": f"Extract name, age and city: {text}"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "person", "schema": Person.model_json_schema(), "strict": True}}}})
         for i, text in enumerate(people["text"])]
lines.append('{"custom_id": "broken", "method": "POST", "url": "/v1/chat/comp')  # cut short
upload = openai.files.create(file=("people.jsonl", "\n".join(lines).encode()), purpose="batch")
batch = openai.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
while batch.status not in ("completed", "failed", "cancelled"):
    time.sleep(0.5)
    batch = openai.batches.retrieve(batch.id)

# %% tags=["nbval-check-output"]
print(batch.status, batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed)

# %% tags=["nbval-ignore-output"]
results = [json.loads(line) for line in openai.files.content(batch.output_file_id).text.splitlines()]
errors = [json.loads(line) for line in openai.files.content(batch.error_file_id).text.splitlines()]
for r in sorted(results, key=lambda r: r["custom_id"])[:3]:
    print(r["custom_id"], r["response"]["body"]["choices"][0]["message"]["content"])
print(errors[0]["error"]["message"])

# %% tags=["nbval-check-output"]
print(sorted(r["custom_id"] for r in results) == [f"person-{i}" for i in range(len(people))])
print([e["error"]["code"] for e in errors])

# %%
server.terminate()
server.wait(30);
