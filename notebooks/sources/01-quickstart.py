# %% [markdown]
# # Quickstart: chat with a local model from a notebook
#
# `mlx-nb` runs language models on your machine with MLX. One engine serves every chat, batching
# them together. In a notebook you talk to it with two magics: `%mlx` for commands and `%%mlx chat`
# for conversations. The default model is **SmolLM2-135M-Instruct**: small enough for a laptop CPU,
# real enough to answer simple questions.

# %% [markdown]
# Load the extension. Nothing heavy happens yet: the model loads on first use.

# %%
%load_ext mlx_nb

# %% [markdown]
# Ask a question. A waiting line shows until the first token (while the model loads, it says how
# far the load has got); then the answer streams into the cell, with a footer: model, tokens,
# speed and time. The answer is also the cell's value, `_`.

# %% tags=["nbval-ignore-output"]
%%mlx chat
What is the capital of France?

# %% [markdown]
# (The exact wording can differ with another CPU library or on a GPU; the facts should not.)

# %% tags=["nbval-check-output"]
print("Paris" in _)

# %% [markdown]
# The magic keeps the conversation, so a follow-up can refer to what was said before.

# %% tags=["nbval-ignore-output"]
%%mlx chat
And what is a famous museum there?

# %% tags=["nbval-check-output"]
print("Louvre" in _)

# %% [markdown]
# `%mlx status` shows the engine: the model, the batch, and for each request its phase, tokens and
# speed. (Times and memory differ from run to run.)

# %% tags=["nbval-ignore-output"]
%mlx status

# %% [markdown]
# `{name}` in a chat cell is filled in from your variables; unknown names are left alone.
# `--new` starts a fresh conversation, and `-s` sets a system prompt.

# %%
city = "Rome"

# %% tags=["nbval-ignore-output"]
%%mlx chat --new -s "Answer in one short sentence."
What country is {city} in?

# %% [markdown]
# The answer is also the cell's value, so you can use it in code:

# %% tags=["nbval-check-output"]
answer = _
print("Italy" in answer)

# %% [markdown]
# `%mlx reset` forgets the conversation. `%mlx help` lists every command.

# %% tags=["nbval-check-output"]
%mlx reset

# %% tags=["nbval-ignore-output"]
%mlx help
