"""Quantized keys and values over every architecture the compatibility matrix batches, first half
(tests/engine/kv_sweep.py says what each architecture is checked for)."""

import pytest

from kv_sweep import architectures, sweep_shard


def test_the_matrix_lists_enough_architectures_to_sweep():
    assert len(architectures()) > 50, "the matrix lists too few architectures to sweep"


@pytest.mark.parametrize("shard", [0, 1])
def test_every_batched_architecture_serves_8_bit_rows_as_alone(shard, tmp_path):
    sweep_shard(shard, tmp_path)
