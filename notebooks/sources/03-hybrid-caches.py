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
# ## Every verb, on each model's real caches
# Three requests read prompts of 3, 11 and 6 tokens, each alone into a cache of its own (this is
# what a prefill does). Then, as the engine's BatchGenerator does, per layer:
# **merge** the first two into one batch, **extend** the running batch with the third,
# **extract** the third back out, and **filter** out the first when it finishes.
# One layer of each kind is shown, as `type (rows, heads, positions, dims)` for attention caches and
# `type [state shapes]` for SSM state. Note how the rows come and go in every kind, how attention
# caches keep 11 positions (the longest row; shorter ones are padded on the left), how the sliding
# window never holds more than 8, and how the SSM state has the same size whatever the length.

# %%
def prefill(loaded, n_tokens):
    """One request alone: the model reads n_tokens into a fresh cache of its own."""
    cache = loaded.make_cache()
    loaded.model(mx.arange(1, n_tokens + 1)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def describe(c):
    """A layer cache's type and shape (a CacheList's members joined by +)."""
    if getattr(c, "caches", None):
        return " + ".join(describe(member) for member in c.caches)
    if isinstance(getattr(c, "keys", None), mx.array):
        return f"{type(c).__name__} {tuple(c.keys.shape)}"
    return f"{type(c).__name__} {[tuple(a.shape) for a in c.cache]}"


def state_arrays(c):
    """What a layer cache holds for its tokens (attention: the filled positions only)."""
    if getattr(c, "caches", None):
        return [a for member in c.caches for a in state_arrays(member)]
    if isinstance(getattr(c, "keys", None), mx.array):
        return [c.keys[..., : min(c.offset, c.keys.shape[2]), :]]
    return list(c.cache)


def one_layer_per_kind(loaded):
    """The first layer of each cache type in the model."""
    kinds = {}
    for i, c in enumerate(loaded.make_cache()):
        kinds.setdefault(tuple(type(m).__name__ for m in getattr(c, "caches", [c])), i)
    return sorted(kinds.values())

# %% tags=["nbval-check-output"]
for name in ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"]:
    loaded = load_model(name)
    a, b, late = prefill(loaded, 3), prefill(loaded, 11), prefill(loaded, 6)
    shown = one_layer_per_kind(loaded)
    steps = {}
    batch = [type(x).merge([x, y]) for x, y in zip(a, b)]      # merge: two requests start together
    steps["merge"] = [describe(batch[i]) for i in shown]
    for layer, new in zip(batch, late):
        layer.extend(type(new).merge([new]))                  # extend: a third joins the running batch
    steps["extend"] = [describe(batch[i]) for i in shown]
    back = [layer.extract(2) for layer in batch]              # extract: the third, as a cache of its own
    steps["extract"] = [describe(back[i]) for i in shown]
    for layer in batch:
        layer.filter([1, 2])                                  # filter: the first one leaves
    steps["filter"] = [describe(batch[i]) for i in shown]
    same = all(mx.array_equal(x, y).item() for got, put in zip(back, late)
               for x, y in zip(state_arrays(got), state_arrays(put)))
    print(f"{name}: layers {shown}; extract gives back exactly what the request put in: {same}")
    for verb, layers in steps.items():
        print(f"  {verb:8s}" + " | ".join(layers))

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
handle = engine.submit(prompt="A hybrid model remembers", max_tokens=2000)
stream = iter(handle)
for _ in range(8):  # a few tokens in: it is decoding
    next(stream)
layout = engine.cache_layout(handle.id)

# %% tags=["nbval-check-output"]
for layer in layout["layers"]:
    shapes = [tuple(s) for s in layer["shapes"]]
    if layer["type"] == "KVCache":  # (rows, heads, positions, dims): positions grow every token, shown as T
        shapes = [(s[0], s[1], "T", s[3]) for s in shapes]
    print(layer["layer"], f"{layer['type']:12s}", "shapes", shapes, "trimmable", layer["trimmable"])

# %% [markdown]
# How far it has got (this changes from run to run: the request keeps decoding meanwhile):

# %% tags=["nbval-ignore-output"]
print("positions held by the attention layers:", [layer["offset"] for layer in layout["layers"] if layer["type"] == "KVCache"])

# %% [markdown]
# The `CacheInspector` widget draws the same thing for the request still decoding, one row per
# layer, coloured by type, with a bar for the bytes each layer holds; `auto_refresh=True` redraws it
# as the attention layers grow token by token while the SSM rows stay the same size.

# %% tags=["nbval-ignore-output"]
from mlx_nb.widgets import CacheInspector

inspector = CacheInspector(request_id=handle.id, engine=engine, auto_refresh=True)
inspector

# %%
inspector.close()
handle.abort()
engine.close()
