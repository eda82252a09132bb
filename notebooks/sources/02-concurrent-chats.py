# %% [markdown]
# # Several chats at once, one batch
#
# The engine decodes every active request in **one batch**: one forward pass of the model produces
# the next token for all of them. On a CPU that is almost free: a batch of 8 costs little more than
# a batch of 1, because the model's weights are read once per step either way.
#
# Here we start several chats concurrently from one notebook with `asyncio.gather`, watch them share
# the batch in the `BatchVisualizer`, and abort one of them midway.

# %%
import asyncio

import mlx_nb  # first: fast CPU BLAS before MLX loads
from mlx_nb import Client
from mlx_nb.widgets import BatchVisualizer

client = Client(model="smollm2-135m-instruct")

# %% [markdown]
# The visualizer draws one lane per request, named by its prompt and who sent it (this notebook,
# another one, an API client), with time along the x axis: a grey bar while it waits, a mark where
# it joins the batch, a blue bar while it decodes, a mark where it leaves (coloured by why), and the
# batch size underneath. Hover over a lane for its details.

# %% tags=["nbval-ignore-output"]
viz = BatchVisualizer(client)
viz

# %% [markdown]
# Three questions at once. Each `achat` is a coroutine; `gather` runs them together, so the engine
# sees all three requests and batches them.

# %%
questions = ["What is the capital of France?", "Name the largest planet.", "What colour is the sky?"]
replies = await asyncio.gather(*(client.achat(q, max_tokens=24) for q in questions))

# %% tags=["nbval-ignore-output"]
for q, r in zip(questions, replies):
    print(f"{q} -> {r.text}")

# %% tags=["nbval-check-output"]
print("Paris" in replies[0].text, all(r.finish_reason in ("stop", "length") for r in replies))

# %% [markdown]
# Did they really share the batch? The engine's events record every decode step with the requests
# in it. Here is the largest batch any step ran:

# %% tags=["nbval-check-output"]
ids = {r.request_id for r in replies}
shared = max(len(ids & set(e["requests"])) for e in client.events() if e["kind"] == "step")
print("at least two of our requests shared a step:", shared >= 2)

# %% [markdown]
# ## Aborting one request
# A stream can be aborted at any time; it leaves the batch at the next step and the others go on.

# %%
long = client.stream("Write a long story about a lighthouse keeper.", max_tokens=200)
short = asyncio.ensure_future(client.achat("Say hello.", max_tokens=12))
first_words = "".join(next(iter(long)) for _ in range(3))
long.abort()
rest = "".join(long)
hello = await short

# %% tags=["nbval-check-output"]
print("long story:", long.reply.finish_reason)
print("short one finished:", hello.finish_reason in ("stop", "length"))

# %% tags=["nbval-ignore-output"]
viz.refresh()
viz
