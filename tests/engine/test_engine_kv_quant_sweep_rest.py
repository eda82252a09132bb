"""Quantized keys and values over every architecture the compatibility matrix batches, second half
(tests/engine/kv_sweep.py says what each architecture is checked for)."""

import pytest

from kv_sweep import sweep_shard


@pytest.mark.parametrize("shard", [2, 3])
def test_every_batched_architecture_serves_8_bit_rows_as_alone(shard, tmp_path):
    sweep_shard(shard, tmp_path)
