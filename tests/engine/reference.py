"""The independent reference for engine tests (mlx_lm's generate_step, one request at a time)."""

from mlx_nb.compat.reference import greedy_alone, reply_tokens  # noqa: F401
