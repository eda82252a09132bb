"""The coding agents this project was started for, unmodified (installed from npm into a cache, see
tests/agents/clis.py), each set up as docs/agents.md says, against a live `jupyter mlx`: each completes
a turn with no workaround flag.

Their prompts are long (Claude Code's is ~77k bytes: system prompt and two dozen tools), so the
model is a tiny random mamba2 with a long context: it reads a whole agent prompt in seconds (no
attention), its template renders no tools (they go in the generic format), and sampled at
temperature 1 (its generation_config) it ends its reply by itself within a few hundred tokens.
A second one has a thinking template (it opens `<think>` in the prompt): OpenCode, given a thinking
budget in its model options, shows the reasoning as its own part and the answer apart.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from live_server import serving

sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))
from clis import binary  # noqa: E402

from mlx_nb.models.tiny_tokenizer import VOCAB_SIZE  # noqa: E402

MODEL = "agent-model"


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own process."""
    yield


def agent_model(tmp_path_factory, name: str, template: str) -> Path:
    from mlx_nb.compat.configs import tiny_config
    from mlx_nb.models.fixtures import write_random_model

    model = tmp_path_factory.mktemp("models") / name
    model.mkdir()
    config = {**tiny_config("mamba2"), "max_position_embeddings": 262144}
    write_random_model(model, config, template, seed=11)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 1.0}))
    return model


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from mlx_nb.models.templates import LENIENT_CHATML

    with serving(tmp_path_factory.mktemp("live"), str(agent_model(tmp_path_factory, MODEL, LENIENT_CHATML))) as server:
        yield server


def run_agent(live, tmp_path, agent: str, env: dict, args: list) -> subprocess.CompletedProcess:
    exe, why = binary(agent)
    if exe is None:
        pytest.skip(f"NOT RUN: {why}")
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    # The random model samples at temperature 1 and its prompt changes with every run (the agents put
    # the working folder and the date in it), so now and then its whole reply is an end token or
    # blank, and the agent rightly prints nothing. Such a turn is asked again, once, with a new draw;
    # an agent that never prints the model's answer fails both.
    for attempt in range(2):
        since, before = live.last_seq(), live.get("status")
        done = subprocess.run([str(exe), *args], cwd=work, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(home), "NO_COLOR": "1", **env})
        assert done.returncode == 0, f"{agent} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        after = live.get("status")  # counters: a long random reply may push early events out of the log
        finished = [e for e in live.events(since) if e["kind"] == "filter"]
        assert finished and after["generated_tokens"] > before["generated_tokens"], f"{agent} never reached the model"
        assert after["prompt_tokens"] - before["prompt_tokens"] > 10_000  # the agent's whole prompt and tools were read
        reasons = {e["detail"]["reason"] for e in finished}  # "abort": OpenCode cancels its side requests at exit
        assert reasons & {"stop", "length"} and "error" not in reasons, reasons
        if done.stdout.strip():
            return done
    assert done.stdout.strip(), f"{agent} printed no answer, twice"
    return done


def home_config(tmp_path, relative: str, text: str) -> None:
    path = tmp_path / "home" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_claude_code(live, tmp_path):
    run_agent(live, tmp_path, "claude", {
        "ANTHROPIC_BASE_URL": live.url.removesuffix("/v1"), "ANTHROPIC_AUTH_TOKEN": live.key,
        "ANTHROPIC_MODEL": MODEL, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}, ["-p", "Say hi."])


def test_codex(live, tmp_path):
    home_config(tmp_path, ".codex/config.toml", (
        f'model = "{MODEL}"\nmodel_provider = "mlx"\n\n[model_providers.mlx]\nname = "mlx-nb"\n'
        f'base_url = "{live.url}"\nenv_key = "MLX_NB_API_KEY"\nwire_api = "responses"\n'))
    run_agent(live, tmp_path, "codex", {"MLX_NB_API_KEY": live.key}, ["exec", "--skip-git-repo-check", "Say hi."])


def opencode_config(live, model: str, options: dict) -> str:
    return json.dumps({"$schema": "https://opencode.ai/config.json", "model": f"mlx/{model}", "provider": {"mlx": {
        "npm": "@ai-sdk/openai-compatible", "name": "mlx-nb",
        "options": {"baseURL": live.url, "apiKey": "{env:MLX_NB_API_KEY}"}, "models": {model: options}}}})


def test_opencode(live, tmp_path):
    home_config(tmp_path, ".config/opencode/opencode.json", opencode_config(live, MODEL, {}))
    run_agent(live, tmp_path, "opencode", {"MLX_NB_API_KEY": live.key}, ["run", "Say hi."])


BUDGET = 8


def test_opencode_shows_a_thinking_models_reasoning_apart(tmp_path_factory, tmp_path):
    """The reasoning reaches OpenCode as `reasoning_content` and becomes its own part, closed by the
    thinking budget OpenCode's model options send (at most BUDGET byte tokens: a few characters);
    the answer part follows it, without the marker that closed the reasoning."""
    from mlx_nb.models.templates import THINKING_CHATML

    model = agent_model(tmp_path_factory, "thinking-agent", THINKING_CHATML)
    with serving(tmp_path_factory.mktemp("live-thinking"), str(model)) as live:
        assert live.get("status")["reasoning"] == "think"
        # a random model: bytes only (no end of turn, no `</think>` of its own: the budget writes it,
        # no special token spelled as many characters), and an answer as long as max_tokens, so both
        # parts always have text and the reasoning is at most BUDGET characters
        never = {str(i): -100 for i in range(256, VOCAB_SIZE)}
        options = {"reasoning_budget": BUDGET, "logit_bias": never, "max_tokens": 24}
        home_config(tmp_path, ".config/opencode/opencode.json",
                    opencode_config(live, model.name, {"options": options}))
        done = run_agent(live, tmp_path, "opencode", {"MLX_NB_API_KEY": live.key},
                         ["run", "--format", "json", "--thinking", "Say hi."])
    # one event a line; split on "\n" only: a random answer may hold U+2028, which JSON leaves unescaped
    parts = [json.loads(line)["part"] for line in done.stdout.split("\n") if line.startswith("{")]
    kinds = [p["type"] for p in parts if p["type"] in ("reasoning", "text")]
    assert kinds[:2] == ["reasoning", "text"], kinds
    reasoning = next(p["text"] for p in parts if p["type"] == "reasoning")
    answer = "".join(p["text"] for p in parts if p["type"] == "text")
    assert 0 < len(reasoning) <= BUDGET and answer.strip()
    assert "think>" not in reasoning + answer  # the marker the budget wrote is in neither part
