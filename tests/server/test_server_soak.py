"""A short soak against real `jupyter mlx` processes (bench/soak.py runs the long one): mixed
requests — streams, whole answers, abandoned streams, hang-ups, follow-ups that hit the prefix
cache, malformed bodies, images on a vision fixture — with no hang, no 5xx and flat memory."""

import sys
from pathlib import Path

from live_server import serving

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak import KINDS_TEXT, Driver, png_data_url, soak  # noqa: E402


def test_mixed_requests_never_hang_never_5xx_and_memory_stays_flat(tmp_path):
    (tmp_path / "text").mkdir()
    (tmp_path / "vision").mkdir()
    with serving(tmp_path / "text", "tiny-llama") as text, serving(tmp_path / "vision", "tiny-qwen3-vl") as vision:
        drivers = [
            (Driver(text.url, text.token, "tiny-llama", max_tokens=16), KINDS_TEXT),
            (Driver(vision.url, vision.token, "tiny-qwen3-vl", max_tokens=8, image=png_data_url()),
             {"image": 2, "chat_stream": 1, "abandon_stream": 1}),
        ]
        result = soak(drivers, text.proc.pid, 240, workers=6, warmup=0.25, sample_every_s=0.25,
                      status=lambda: text.get("status"))
        for d, _ in drivers:
            d.close()
        final = text.get("status")
    summary = result.summary()
    assert len(result.outcomes) == 240
    assert result.hangs == 0, [o for o in result.outcomes if o.status == -1][:3]
    assert result.server_errors == 0, [o for o in result.outcomes if o.status >= 500][:3]
    kinds = summary["by_kind"]
    assert set(kinds["bad_input"]) <= {"400", "404", "413", "422"}, kinds["bad_input"]
    assert kinds["hang_up"].get("0") and kinds["abandon_stream"].get("0"), kinds
    assert kinds["image"].get("200"), kinds["image"]
    assert final["prefix_cache"]["hits"]["exact"] + final["prefix_cache"]["hits"]["shorter"] + \
        final["prefix_cache"]["hits"]["trimmed"] > 0, final["prefix_cache"]
    assert final["requests"] == [] and final["batch_size"] == 0, "abandoned requests were left in the batch"
    assert result.rss_growth() < 0.10, f"server RSS grew {100 * result.rss_growth():.1f}% after the warm-up"
