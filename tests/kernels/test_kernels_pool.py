"""The kernels' thread pool under the traffic that breaks job hand-offs: hundreds of short jobs
back to back, jobs of different sizes from several MLX streams at once, and pauses long enough for
the workers to fall asleep between jobs. Every result must equal the same matmul computed alone
(a worker running a stale or finished job would change or lose rows)."""

import threading
import time

import mlx.core as mx
import numpy as np

from mlx_nb.kernels.packing import pack


def _layer(rng, n, k, bits):
    """A packed weight (its last axis is 16 * 32 * bits / 8 bytes) and its output size."""
    w = mx.array((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=32, bits=bits)
    return pack(q, s, b, 32, bits), n


def test_short_jobs_from_many_streams_equal_each_job_alone(native):
    rng = np.random.default_rng(11)
    # sizes from below the pool's threshold (run on the caller) to ones split into many tasks
    layers = [_layer(rng, n, k, bits) for n, k, bits in
              [(16, 64, 4), (96, 576, 4), (960, 576, 4), (3072, 576, 8), (576, 1536, 4), (4099, 128, 8)]]
    jobs = [(i, mx.array(rng.standard_normal((rows, lay[0][0].shape[1] * 32)).astype(np.float32)))
            for rows in (1, 3, 17) for i, lay in enumerate(layers)]

    def run(i, x):
        (packed, ps, pb), n = layers[i]
        return native.qmatmul(x, packed, ps, pb, n=n, group_size=32, bits=packed.shape[2] // 64)

    alone = [np.asarray(run(i, x)) for i, x in jobs]
    failures = []

    def worker(seed):
        r = np.random.default_rng(seed)
        stream = mx.new_stream(mx.cpu)
        with mx.stream(stream):
            for _ in range(60):
                picks = r.integers(0, len(jobs), size=int(r.integers(1, 8)))
                outs = [run(*jobs[p]) for p in picks]  # one graph of several jobs, back to back
                mx.eval(outs)
                for p, out in zip(picks, outs):
                    if not np.array_equal(np.asarray(out), alone[p]):
                        failures.append((seed, int(p)))
                if r.random() < 0.2:
                    time.sleep(0.002)  # past the workers' spin: they sleep and must be woken

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, f"results differing from the job alone: {failures[:5]}"
