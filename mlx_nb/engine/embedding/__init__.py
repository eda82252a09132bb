"""Embedding models: a text (or token ids) made into one vector, many requests' inputs batched into
one forward on the model's own thread. Pooling and normalization are read from the model's own
files (sentence-transformers' `modules.json` and `1_Pooling/config.json`), never guessed."""
