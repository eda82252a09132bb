"""Record what a coding agent CLI sends: run it against a loopback server that saves each POST body
and answers with an error, so the agent gives up after its first try.

    python tests/agents/record_requests.py claude  /path/to/node_modules/.bin/claude
    python tests/agents/record_requests.py codex   /path/to/node_modules/.bin/codex

writes tests/agents/recorded/<agent>.json (the first generating request: path, headers without
credentials, body). The replay tests (test_agents_replay.py) send these bodies to the routes.
Paths, dates and the machine's details inside the body are whatever the agent put there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent
GENERATING = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
SECRET_HEADERS = {"authorization", "x-api-key", "cookie"}


def serve(seen: list) -> ThreadingHTTPServer:
    class Capture(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items() if k.lower() not in SECRET_HEADERS}
            seen.append({"path": self.path.split("?")[0], "headers": headers, "body": json.loads(body or b"{}")})
            reply = json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "recorded; this server does not answer"}})
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())

        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_agent(agent: str, binary: str, base: str, workdir: Path) -> None:
    env = {**os.environ, "NO_COLOR": "1", "HOME": str(workdir)}
    if agent == "claude":
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY="recording", DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        cmd = [binary, "-p", "Say hi."]
    elif agent == "codex":
        home = workdir / "codex-home"
        home.mkdir()
        (home / "config.toml").write_text(
            'model = "smollm2-135m-instruct"\nmodel_provider = "mlx"\n\n[model_providers.mlx]\n'
            f'name = "mlx-nb"\nbase_url = "{base}/v1"\nenv_key = "MLX_KEY"\nwire_api = "responses"\n')
        env.update(CODEX_HOME=str(home), MLX_KEY="recording")
        cmd = [binary, "exec", "--skip-git-repo-check", "Say hi."]
    else:
        raise SystemExit(f"unknown agent {agent!r}: claude or codex")
    try:
        subprocess.run(cmd, cwd=workdir, env=env, timeout=90, capture_output=True, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass  # it kept retrying: what it sent first is recorded


def main(agent: str, binary: str) -> Path:
    seen: list = []
    server = serve(seen)
    with tempfile.TemporaryDirectory() as tmp:
        run_agent(agent, binary, f"http://127.0.0.1:{server.server_address[1]}", Path(tmp))
    server.shutdown()
    first = next((r for r in seen if r["path"].endswith(GENERATING)), None)
    if first is None:
        raise SystemExit(f"{agent} sent no generating request (saw {[r['path'] for r in seen]})")
    out = HERE / "recorded" / f"{agent}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(first, indent=1, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2]))
