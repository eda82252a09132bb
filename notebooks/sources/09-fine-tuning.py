# %% [markdown]
# # Fine-tuning: teach the model a format, then chat with it a cell later
#
# `Client.train` fine-tunes a small LoRA adapter with mlx_lm's own trainer, in a worker process of this
# kernel, and serves it at once as `base@name`: the adapter's rows share the engine's batch with the
# base model's, so there is nothing to reload and nothing to restart. While it trains, the worker is
# paused whenever a chat is being answered, and every checkpoint is kept on disk (a restarted kernel
# resumes the fine-tune from its last one).
#
# The task here is one the base model never does unasked: answer an order with exactly one JSON object,
# `{"item": ..., "qty": N}`. The training rows name made-up items, so the model has to learn the shape,
# not a list of words.

# %%
import json
import random

from mlx_nb import Client

client = Client(model="smollm2-135m-instruct")
asks = ["I'd like {n} {item}.", "Please send {n} {item}.", "Can I get {n} {item}?", "Order {n} {item} for me.",
        "We need {n} {item} today."]
rng = random.Random(0)


def made_up_item():
    return "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))


rows = []
for _ in range(200):
    item, qty = made_up_item(), rng.randint(1, 99)
    rows.append([{"role": "user", "content": rng.choice(asks).format(n=qty, item=item)},
                 {"role": "assistant", "content": json.dumps({"item": item, "qty": qty})}])
rows[0]

# %% [markdown]
# What the base model does with such a request:

# %% tags=["nbval-ignore-output"]
print(client.chat("Please send 4 clocks.", max_tokens=40).text)

# %% [markdown]
# ## Train
# Each row is a conversation ending with the answer to learn (a DataFrame with `prompt` and
# `completion` columns, or a JSONL file, works the same). A tenth of the rows is held out to measure
# the validation loss; the loss counts the answers only. The panel draws the training loss of every
# step and the validation loss at each checkpoint while it runs, with a Stop button; once it is done it
# leaves a picture of the run in the saved notebook.

# %%
job = client.train(rows, name="orders", iters=20, batch_size=2, learning_rate=4e-4, num_layers=8, steps_per_save=10)

# %% tags=["nbval-check-output"]
losses = job.losses()
val = [e["val_loss"] for e in losses if e["kind"] == "val"]
print(job.status()["status"], len([e for e in losses if e["kind"] == "train"]), "steps")
print("validation loss fell by more than half:", val[-1] < 0.5 * val[0])

# %% [markdown]
# ## Chat with it
# The adapter is served as `smollm2-135m-instruct@orders`, and its checkpoint as
# `smollm2-135m-instruct@orders:step-10`. `compare` asks every model every prompt at once: the base
# model's rows and the adapter's decode side by side in one batch.

# %% tags=["nbval-check-output"]
print(job.checkpoints())

# %% tags=["nbval-ignore-output"]
prompts = ["Please send 4 clocks.", "Can I get 12 mirrors?", "We need 7 ropes today.", "I'd like 30 stamps."]
table = client.compare(prompts, ["smollm2-135m-instruct", job.model], max_tokens=32)
table


# %%
def in_shape(answer, qty):
    try:
        value = json.loads(answer.strip())
    except ValueError:
        return False
    return isinstance(value, dict) and list(value) == ["item", "qty"] and value["qty"] == qty


# %% tags=["nbval-check-output"]
qty = [4, 12, 7, 30]
print("base in shape:", sum(in_shape(a, q) for a, q in zip(table["smollm2-135m-instruct"], qty)), "of 4")
print("adapter in shape:", sum(in_shape(a, q) for a, q in zip(table[job.model], qty)) >= 3)

# %% [markdown]
# The magic takes the adapter like any model name:

# %% tags=["nbval-ignore-output"]
%load_ext mlx_nb

# %% tags=["nbval-ignore-output"]
%%mlx chat --model smollm2-135m-instruct@orders -n 32
Order 3 lamps for me.
