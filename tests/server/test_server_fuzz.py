"""Malformed requests, generated (tests/server/malformed.py), against the real routes of an
in-process Jupyter server: every one is a 4xx in its route's error shape, none is a 5xx, and the
server answers a good request afterwards."""

import json
from collections import Counter

import pytest
from malformed import HUGE_BYTES, MODEL, PATHS, VALID, malformed_requests
from server_helpers import server_config

CASES = malformed_requests()


@pytest.fixture
def jp_server_config():
    return server_config(model=MODEL, max_body_bytes=HUGE_BYTES)


def _error_message(route: str, body: dict) -> str:
    if route == "messages":  # Anthropic's shape
        assert body["type"] == "error" and body["error"]["type"]
    else:  # OpenAI's
        assert body["error"]["type"] and "param" in body["error"] and "code" in body["error"]
    return body["error"]["message"]


async def test_malformed_requests_are_4xx_never_5xx(jp_fetch, mlx_ready):
    assert len(CASES) >= 60 and {route for route, _, _ in CASES} == set(PATHS)
    wrong, statuses, messages = [], Counter(), []
    for route, why, raw in CASES:
        r = await jp_fetch("mlx", "v1", *PATHS[route].split("/"), method="POST", body=raw, raise_error=False)
        statuses[r.code] += 1
        try:
            message = _error_message(route, json.loads(r.body))
            assert 400 <= r.code < 500 and message and "\n" not in message
            messages.append(message)
        except (AssertionError, ValueError, KeyError, TypeError):
            wrong.append((route, why, r.code, r.body[:300]))
    print(f"\n{len(CASES)} malformed requests: {dict(statuses)}")
    assert not wrong, f"{len(wrong)} of {len(CASES)} not a clean 4xx: {wrong[:10]}"
    # the cases reached the checks they aim at, not only the first one on the way
    for reached in ("lone UTF-16 surrogate", "not valid base64", "not a readable image", "not valid JSON"):
        assert any(reached in m for m in messages), reached

    for route, body in VALID.items():  # still serving
        r = await jp_fetch("mlx", "v1", *PATHS[route].split("/"), method="POST", body=json.dumps(body))
        assert r.code == 200
