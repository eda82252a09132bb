# %% [markdown]
# # Images: multimodal chats in the same batch
#
# A vision model reads images as well as text. `mlx-nb` prefills each image request on its own (the
# vision tower turns the image into tokens, the language model reads them), then **moves** that
# state into the shared batch, where it decodes alongside text-only chats.
#
# We use `tiny-qwen3.5-vl`: a tiny vision model with **random weights**, so its answers are noise.
# It has the real architecture — a vision tower on a hybrid language model (SSM + attention
# layers) — which is what this notebook is about. With a real vision model the code is the same.

# %%
import asyncio

import numpy as np
from PIL import Image, ImageDraw

import mlx_nb  # first: fast CPU BLAS before MLX loads
from mlx_nb import Client

client = Client(model="tiny-qwen3.5-vl")

# %% [markdown]
# Two images made right here: a red square and a wider blue banner with a circle.

# %%
square = Image.new("RGB", (56, 56), "red")
banner = Image.new("RGB", (112, 56), "navy")
ImageDraw.Draw(banner).ellipse((40, 8, 80, 48), fill="yellow")
banner

# %% [markdown]
# An image goes in `images=`; it may be a PIL image, a numpy array, a file path under the working
# directory, or a `data:` URL. Larger images become more tokens:

# %%
# NBVAL_CHECK_OUTPUT
for name, img in [("square", square), ("banner", banner)]:
    reply = client.chat("What is in this picture?", images=[img], max_tokens=8)
    print(f"{name}: {reply.usage['prompt_tokens']} prompt tokens, finished by {reply.finish_reason}")

# %% [markdown]
# A vision model also answers text-only questions — through the same path.

# %%
# NBVAL_CHECK_OUTPUT
reply = client.chat("Hello there!", max_tokens=8)
print(reply.finish_reason, reply.usage["completion_tokens"], "tokens")

# %% [markdown]
# ## A mixed batch
# Two image chats and two text chats at once. They decode together: the events show steps with all
# four requests in the batch.

# %%
jobs = [
    client.achat("Describe the square.", images=[square], max_tokens=12),
    client.achat("Describe the banner.", images=[banner], max_tokens=12),
    client.achat("Tell me a joke.", max_tokens=12),
    client.achat("Count to five.", images=[np.zeros((28, 56, 3), dtype=np.uint8)], max_tokens=12),
]
replies = await asyncio.gather(*jobs)

# %% tags=["nbval-check-output"]
ids = {r.request_id for r in replies}
print("all finished:", all(r.finish_reason in ("stop", "length") for r in replies))
print("at least two shared a step:", max(len(ids & set(e["requests"])) for e in client.events() if e["kind"] == "step") >= 2)

# %% [markdown]
# ## The cache of a vision request
# While an image request decodes, its cache has the hybrid layout of the language model, plus one
# small extra entry: the request's rotary-position offset (images shift positions), which travels
# with the row when the batch merges and filters.

# %%
stream = client.stream("Look closely.", images=[banner], max_tokens=300)
next(iter(stream))
layout = client.cache_layout(stream.request_id)
stream.abort()

# %% tags=["nbval-check-output"]
print([layer["type"] for layer in layout["layers"]])
