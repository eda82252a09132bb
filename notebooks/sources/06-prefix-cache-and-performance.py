# %% [markdown]
# # Prefix reuse and batch throughput
#
# Every `%%mlx chat` cell re-sends the whole conversation. Without prefix reuse, the time to the
# first token grows with the conversation; with it, a new turn costs only its new tokens. And
# because requests share one batch, many chats at once cost little more than one.
#
# Timings vary from run to run and machine to machine: the *ratios* are the point. (The checked
# outputs of this notebook are token counts, not times.)

# %%
import time

import mlx_nb  # first: fast CPU BLAS before MLX loads
from mlx_nb import Engine

SYSTEM = ("You are a careful assistant for a small museum. Visitors ask about opening hours, "
          "tickets, the collection and accessibility. Answer briefly and politely. ") * 12
QUESTIONS = ["When do you open?", "How much is a ticket?", "Is there a lift?", "Can I bring a dog?"]


def ttft(engine, messages):
    """Seconds until the first token, and the request's usage."""
    t = time.perf_counter()
    handle = engine.submit(messages=messages, max_tokens=16)
    next(iter(handle))
    first = time.perf_counter() - t
    return first, handle.result().usage

# %% [markdown]
# ## One shared system prompt, four questions
# The same four chats, first with the prefix cache switched off, then on. With it on, the second
# and later chats find the system prompt already computed.

# %%
results = {}
for reuse in (False, True):
    with Engine("smollm2-135m-instruct", prefix_cache=reuse, wait=True) as engine:
        ttft(engine, [{"role": "user", "content": "warm up"}])
        rows = [ttft(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
                for q in QUESTIONS]
        results[reuse] = rows

# %% tags=["nbval-check-output"]
for reuse, rows in results.items():
    print("prefix cache", "on " if reuse else "off", "cached tokens per chat:", [u.cached_tokens for _, u in rows])

# %% tags=["nbval-ignore-output"]
for reuse, rows in results.items():
    print("prefix cache", "on " if reuse else "off", "TTFT (s):", [round(t, 3) for t, _ in rows])
print("speed-up on chats 2-4: %.1fx" % (sum(t for t, _ in results[False][1:]) / sum(t for t, _ in results[True][1:])))

# %% [markdown]
# ## Throughput against concurrency
# Aggregate tokens per second as more chats run at once: the batch turns idle compute into tokens.

# %% tags=["nbval-ignore-output"]
levels = [1, 2, 4, 8]
throughput = []
with Engine("smollm2-135m-instruct", prefix_cache=False, wait=True) as engine:
    engine.submit(prompt="warm up", max_tokens=4).result()
    for n in levels:
        t = time.perf_counter()
        handles = [engine.submit(messages=[{"role": "user", "content": f"Describe room {i} of a museum."}],
                                 max_tokens=32) for i in range(n)]
        tokens = sum(h.result().usage.completion_tokens for h in handles)
        throughput.append(tokens / (time.perf_counter() - t))
print([f"{n}: {tps:.1f} tok/s" for n, tps in zip(levels, throughput)])

# %% tags=["nbval-ignore-output"]
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(levels, throughput, marker="o")
ax.set_xlabel("chats at once")
ax.set_ylabel("aggregate tokens/s")
ax.set_title("One shared batch: more chats, more tokens per second")
ax.grid(alpha=0.3)
plt.show()
