"""Every mlx-vlm family with a tiny fixture batches exactly as mlx_vlm generates alone, or is served
one request at a time exactly so.

Per family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, Gemma 3, Idefics3, SmolVLM, LLaVA, LLaVA-Next,
Pixtral, Mistral 3, PaliGemma, InternVL, GLM-4V, Kimi-VL, LFM2-VL; Mllama one request at a time):
image and text-only requests
served together, one joining while the batch decodes and one aborted, each against mlx_vlm's own
`stream_generate` alone (mlx_nb.compat.vision_check). The fixtures' answers must depend on the
request and on the image, or equality would prove nothing. The committed matrix
(mlx_nb/compat/mlx_vlm.json) must say what this run finds.
"""

import json

import pytest

from mlx_nb.compat.vision_check import check_family
from mlx_nb.models.fixtures_vision import VISION_CONFIGS
from mlx_nb.models.vision import COMPAT_FILE

MATRIX = {e["architecture"]: e for e in json.loads(COMPAT_FILE.read_text())["entries"]}


@pytest.mark.parametrize("name", sorted(VISION_CONFIGS))
def test_family_batches_as_mlx_vlm_generates_alone(name):
    report = check_family(name, prefill_step_size=16)
    committed = MATRIX[report.architecture]
    fixture = committed["instances"][0]  # the fixture's own weight draw; the others are other seeds
    assert (fixture["verdict"], committed["cache_types"]) == (report.verdict, report.cache_types), \
        f"{report.reason}: mlx_nb/compat/mlx_vlm.json is stale: run python -m mlx_nb.compat.vision_sweep"
    failed = {k: report.details.get(k, "") for k, v in report.checks.items() if v is not True}
    assert not failed, f"{name}: {failed}"
    assert report.verdict in ("batched", "sequential"), report.reason
    assert (report.details["policy"] == "sequential") == (report.verdict == "sequential"), report.details


def test_matrix_lists_every_required_family():
    required = {"qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "idefics3", "smolvlm", "llava", "llava_next",
                "pixtral", "mistral3", "paligemma", "internvl_chat", "glm4v", "kimi_vl"}
    assert required <= set(MATRIX)
    for entry in MATRIX.values():
        assert entry["package"] == "mlx_vlm" and entry["verdict"] in ("batched", "prefill_alone", "sequential", "untestable")
        assert entry["reason"] and "\n" not in entry["reason"]
