# %% [markdown]
# # Hybrid caches: what batching does to each kind of memory
#
# A language model remembers the conversation in a **cache**, one per layer. Attention layers keep
# every past key and value (`KVCache`); sliding-window layers keep only the last few
# (`RotatingKVCache`); state-space layers keep a fixed-size summary (`ArraysCache`); some layers hold
# both (`CacheList`). Continuous batching must **merge** caches when requests join, **filter** them
# when requests leave, **extend** the running batch, and **extract** one request back out — for every
# kind. This notebook shows each verb on each kind, on tiny random models.
#
# The tiny models have random weights: their text is noise by design. What matters here is shapes.

# %%
import mlx_nb  # first: it sets up the fast CPU BLAS before MLX loads
import mlx.core as mx
from mlx_lm.models.cache import KVCache, ArraysCache, RotatingKVCache

from mlx_nb.models import load_model

# %% [markdown]
# ## Four layouts, one engine
# Each tiny fixture stands for a family of real models. Their per-layer cache types:

# %% tags=["nbval-check-output"]
for name in ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"]:
    print(f"{name:15s}", load_model(name).cache_types())

# %% [markdown]
# ## Merge: two requests of different lengths become one batch
# Attention caches are padded on the **left**, so that every row's newest token sits in the same
# column. `left_padding` remembers how much of each row is filler.

# %% tags=["nbval-check-output"]
short, long = KVCache(), KVCache()
short.update_and_fetch(mx.zeros((1, 2, 3, 4)), mx.zeros((1, 2, 3, 4)))  # 3 tokens
long.update_and_fetch(mx.ones((1, 2, 5, 4)), mx.ones((1, 2, 5, 4)))     # 5 tokens
batch = KVCache.merge([short, long])
print(type(batch).__name__, "keys", batch.keys.shape, "left padding", batch.left_padding.tolist())

# %% [markdown]
# ## Filter and extract: a request leaves
# When the short request finishes, `filter` keeps only the other row (and drops padding no row
# needs any more); `extract` hands one row back as an ordinary cache, e.g. for the prefix cache.

# %% tags=["nbval-check-output"]
one = batch.extract(1)
print("extracted:", type(one).__name__, one.keys.shape, "offset", one.offset)
batch.filter([1])
print("after filter:", batch.keys.shape, "left padding", batch.left_padding.tolist())

# %% [markdown]
# ## SSM state: a fixed-size summary that cannot be trimmed
# A state-space layer keeps the same small arrays however long the conversation is. Merging stacks
# rows; but there is no way to "undo" the last tokens, so the cache is **not trimmable**. A prefix
# cache may only reuse such state as an exact or shorter prefix — never cut it back.

# %% tags=["nbval-check-output"]
a, b = ArraysCache(2), ArraysCache(2)
for c, v in ((a, 0.0), (b, 1.0)):
    c[0], c[1] = mx.full((1, 3, 8), v), mx.full((1, 2, 4, 4), v)
merged = ArraysCache.merge([a, b])
print("merged state shapes:", [s.shape for s in merged.cache], "trimmable:", merged.is_trimmable())

# %% [markdown]
# ## Sliding window: the cache wraps
# `RotatingKVCache(8)` keeps at most 8 positions. Once more than 8 tokens went in, old positions are
# overwritten, so it stops being trimmable too.

# %% tags=["nbval-check-output"]
window = RotatingKVCache(max_size=8)
window.update_and_fetch(mx.zeros((1, 1, 5, 4)), mx.zeros((1, 1, 5, 4)))
print("5 tokens in: trimmable", window.is_trimmable())
for _ in range(7):
    window.update_and_fetch(mx.zeros((1, 1, 1, 4)), mx.zeros((1, 1, 1, 4)))
print("12 tokens in: offset", window.offset, "stored", window.keys.shape[2], "trimmable", window.is_trimmable())

# %% [markdown]
# ## The engine's view of a live request
# The engine reports the same layout for a request while it decodes: here a hybrid model, whose
# layers alternate between SSM state and attention.

# %%
from mlx_nb import Engine

engine = Engine("tiny-qwen3.5", wait=True)
handle = engine.submit(prompt="A hybrid model remembers", max_tokens=400)
next(iter(handle))  # wait until it is decoding
layout = engine.cache_layout(handle.id)
handle.abort()

# %% tags=["nbval-check-output"]
for layer in layout["layers"]:
    print(layer["layer"], f"{layer['type']:12s}", "shapes", layer["shapes"], "trimmable", layer["trimmable"])

# %% [markdown]
# The `CacheInspector` widget draws the same thing, one row per layer, coloured by type, with a bar
# for the bytes each layer holds.

# %% tags=["nbval-ignore-output"]
from mlx_nb.widgets import CacheInspector

CacheInspector(engine=engine)

# %%
engine.close()
