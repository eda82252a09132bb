"""Which architectures batch correctly: the measured compatibility matrix and the sweep behind it.

`matrix` reads the shipped data (the engine decides batching from it), `sweep` measures it
(`make compat`), `configs` + `overrides` generate tiny instances of every mlx_lm architecture,
`checks` runs one architecture alone and batched, `docs` writes docs/compatibility.md.
"""
