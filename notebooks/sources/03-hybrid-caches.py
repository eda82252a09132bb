# %% [markdown]
# # Hybrid caches: what batching does to each kind of memory
#
# A language model remembers the conversation in a **cache**, one per layer. Attention layers keep
# every past key and value (`KVCache`); sliding-window layers keep only the last few
# (`RotatingKVCache`); state-space layers keep a fixed-size summary (`ArraysCache`); some layers hold
# both (`CacheList`). Continuous batching must **merge** caches when requests start together,
# **extend** the running batch when one joins, **filter** it when one leaves, and **extract** one
# request back out — for every kind. This notebook runs each verb on real caches of tiny random
# models (mlx_lm's own cache classes, as the engine's BatchGenerator drives them) and draws what
# each verb left behind.
#
# The tiny models have random weights: their text is noise by design. What matters here is the
# cache's shape, which is the same on any machine.

# %%
import mlx_nb  # first: it sets up the fast CPU BLAS before MLX loads
import mlx.core as mx

from mlx_nb.models import load_model
from mlx_nb.widgets import CachePicture

# %% [markdown]
# ## Four layouts, one engine
# Each tiny fixture stands for a family of real models. Their per-layer cache types:

# %% tags=["nbval-check-output"]
MODELS = ["tiny-llama", "tiny-gemma3", "tiny-qwen3.5", "tiny-falcon-h1"]
for name in MODELS:
    print(f"{name:15s}", load_model(name).cache_types())

# %% [markdown]
# ## How to read the pictures
# A batch cache is a grid: one **row** per request, one column per **position** (a token the cache
# holds). Layers of the same kind hold the same rows, so each kind is drawn once, with the layers it
# stands for. Filled cells are tokens; dashed cells are **left padding**: rows of different lengths
# are aligned on the right, so that every row's newest token sits in the same column and the next
# step appends one column for all of them. Under the grids, the bytes each kind of layer holds.
#
# Three requests read prompts of 3, 11 and 6 tokens, each alone into a cache of its own (this is
# what a prefill does). Then, per layer, as the engine's BatchGenerator does:

# %%
def prefill(loaded, n_tokens):
    """One request alone: the model reads n_tokens into a fresh cache of its own."""
    cache = loaded.make_cache()
    loaded.model(mx.arange(1, n_tokens + 1)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def state_arrays(c):
    """What a layer cache holds for its tokens (attention: the filled positions only)."""
    if getattr(c, "caches", None):
        return [a for member in c.caches for a in state_arrays(member)]
    if isinstance(getattr(c, "keys", None), mx.array):
        return [c.keys[..., : min(c.offset, c.keys.shape[2]), :]]
    return list(c.cache)


def verbs(name):
    """Every verb on `name`'s real caches: a picture after each, and whether extract gave back
    exactly what the request had put in."""
    loaded = load_model(name)
    a, b, late = prefill(loaded, 3), prefill(loaded, 11), prefill(loaded, 6)
    pictures = [CachePicture(a, f"{name}, before: request A read its 3-token prompt alone", name)]
    batch = [type(x).merge([x, y]) for x, y in zip(a, b)]
    pictures.append(CachePicture(batch, f"{name}, merge: A and B (11 tokens) start decoding together", name))
    for layer, new in zip(batch, late):
        layer.extend(type(new).merge([new]))
    pictures.append(CachePicture(batch, f"{name}, extend: C (6 tokens) joins the running batch", name))
    back = [layer.extract(2) for layer in batch]
    pictures.append(CachePicture(back, f"{name}, extract: C again, as a cache of its own", name))
    for layer in batch:
        layer.filter([1, 2])
    pictures.append(CachePicture(batch, f"{name}, filter: A finished and leaves", name))
    same = all(mx.array_equal(x, y).item() for got, put in zip(back, late)
               for x, y in zip(state_arrays(got), state_arrays(put)))
    return pictures, same


results = {name: verbs(name) for name in MODELS}

# %% [markdown]
# ## Attention (`KVCache`): rows padded on the left
# **Merge** pads A's row with 8 cells so both rows end in the same column. **Extend** adds C's row,
# padded by 5. **Extract** hands C back as an ordinary one-row cache (no padding). **Filter** drops
# A's row, and with it the padding no remaining row needs: the grid keeps 11 columns because B
# still needs them.

# %% tags=["nbval-ignore-output"]
for picture in results["tiny-llama"][0]:
    display(picture)

# %% [markdown]
# ## Sliding window (`RotatingKVCache`): never more than 8 positions
# Gemma-style models alternate full attention with a window of recent tokens. The window's grid is
# never wider than 8: B's 11 tokens leave its oldest 3 behind ("+3 dropped"). A cache that has
# dropped tokens cannot be cut back to an earlier point (it is no longer *trimmable*), which is why
# the prefix cache treats these models differently.

# %% tags=["nbval-ignore-output"]
for picture in results["tiny-gemma3"][0][1:3]:
    display(picture)

# %% [markdown]
# ## State-space layers (`ArraysCache`): a fixed-size summary per row
# A hybrid model's SSM layers keep the same small state however long the prompt: one block per
# row, no positions and no padding. Merging stacks rows, filtering drops them, exactly like the
# attention layers beside them. There is no way to "undo" tokens in a summary, so these layers are
# never trimmable either. Falcon-H1 holds both kinds in every layer (`CacheList`): each member is
# drawn as its own grid.

# %% tags=["nbval-ignore-output"]
for name in ["tiny-qwen3.5", "tiny-falcon-h1"]:
    display(results[name][0][2])

# %% [markdown]
# The same pictures as text, for every model and verb. Rows, padding and token counts are the
# same on any machine, so this is what the test of this notebook compares.

# %% tags=["nbval-check-output"]
for name, (pictures, same) in results.items():
    print(f"== {name}: extract gives back exactly what the request put in: {same}")
    for picture in pictures[1:]:
        print(picture)

# %% [markdown]
# ## The engine's view of a live request
# The engine draws the same picture for a request while it decodes: here a hybrid model, whose
# layers alternate between SSM state and attention. `CacheInspector` with `auto_refresh=True`
# redraws it as the attention rows grow token by token while the SSM state keeps its size.

# %%
from mlx_nb import Engine
from mlx_nb.widgets import CacheInspector

engine = Engine("tiny-qwen3.5", wait=True)
handle = engine.submit(prompt="A hybrid model remembers", max_tokens=2000)
stream = iter(handle)
for _ in range(8):  # a few tokens in: it is decoding
    next(stream)
layout = engine.cache_layout(handle.id)

# %% tags=["nbval-check-output"]
from mlx_nb.pictures.cache import grids

for grid in grids(layout["layers"]):  # how far it has got changes from run to run: not printed
    kind = "a fixed-size state" if grid["batch"]["state"] else "a position per token so far"
    print(f"layers {grid['layers']}: {grid['type']}, {len(grid['batch']['rows'])} row holding {kind}")

# %% tags=["nbval-ignore-output"]
inspector = CacheInspector(request_id=handle.id, engine=engine, auto_refresh=True)
inspector

# %%
import time

time.sleep(2)  # let it redraw a few times as the request decodes
inspector.close()
handle.abort()
engine.close()
