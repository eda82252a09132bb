# %% [markdown]
# # Embeddings: search this project's own docs, then answer with citations
#
# An embedding model turns a text into one vector; texts that mean similar things get vectors that
# point the same way. That is all a search needs: embed the corpus once, embed the question, and
# rank the corpus by the dot product (the vectors are unit length, so it is the cosine).
#
# mlx-nb ships one embedding model that works offline: **all-MiniLM-L6-v2** (384 dimensions, 256
# tokens at most), installed by the README's commands. `Client.embed` runs it in this process, or
# on the server's `/v1/embeddings` route when the notebook talks to a server; either way it returns
# a NumPy array, one row per text. Its pooling (mean over the tokens) and normalization are read
# from the model's own files, not guessed.

# %%
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mlx_nb import Client

client = Client(model="smollm2-135m-instruct")

docs = next(p for p in (Path.cwd() / "docs", Path.cwd().parent / "docs") if p.is_dir())
chunks = []  # (file, paragraph): a paragraph is a unit small enough to cite
for path in sorted(docs.glob("*.md")):
    for para in re.split(r"\n\s*\n", path.read_text()):
        text = " ".join(para.split())
        if len(text) > 120 and not text.startswith(("|", "```")):
            chunks.append((path.name, text))
corpus = pd.DataFrame(chunks, columns=["file", "text"])
print(len(corpus), "paragraphs from", corpus["file"].nunique(), "files")

# %% [markdown]
# ## Embed the corpus
# Every paragraph in one call: the embedder batches them (inputs of similar length share a forward).
# A paragraph longer than the model reads would be an error naming it; `truncate=True` cuts it to the
# first 256 tokens instead, which is what a search over long paragraphs wants.

# %%
t0 = time.perf_counter()
vectors = client.embed(corpus["text"], truncate=True)
elapsed = time.perf_counter() - t0
print(vectors.shape, vectors.dtype)

# %% tags=["nbval-ignore-output"]
print(f"{len(corpus) / elapsed:.0f} paragraphs/s")

# %% [markdown]
# ## Search
# The question's vector against every paragraph's: one matrix product.


# %%
def search(question: str, k: int = 3) -> pd.DataFrame:
    scores = vectors @ client.embed(question)[0]
    top = np.argsort(-scores)[:k]
    return corpus.iloc[top].assign(score=scores[top].round(3))[["score", "file", "text"]]


hits = search("How do I run a model over every row of a table, and resume it after a restart?")

# %% tags=["nbval-ignore-output"]
hits

# %% [markdown]
# The best hits come from the pages about work that survives a restart (dataset jobs, and fine-tunes,
# which resume the same way), though the question shares few words with them: "resume" and "restart"
# are near "survives a kernel restart" in meaning, not in spelling.

# %% tags=["nbval-check-output"]
print("jobs.md" in set(hits["file"]))
print(bool((hits["score"].diff().dropna() <= 0).all()))

# %% [markdown]
# ## Answer with citations
# The top paragraphs go into the prompt, numbered, and the model is asked to cite them. `%%mlx chat`
# fills `{context}` and `{question}` from the notebook's variables. (A 135M-parameter model follows
# the instruction loosely; the larger models you point the server at do much better.)

# %%
%load_ext mlx_nb
question = "What happens to a dataset job's finished rows when the kernel restarts?"
found = search(question)
context = "\n".join(f"[{i + 1}] ({row.file}) {row.text[:400]}" for i, row in enumerate(found.itertuples()))

# %% tags=["nbval-ignore-output"]
%%mlx chat --new --max-tokens 80
Answer the question from these sources only, citing them as [1], [2] or [3].

{context}

Question: {question}
