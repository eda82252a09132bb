"""Scoped API keys on an in-process server: the generated key (owner-only, atomic, reused) and the
configured ones open every mlx/v1 route and no Jupyter route; Jupyter's own auth still works on
the mlx routes; kernels are handed the key, never the Jupyter token."""

import json
import os
import stat

import pytest
from server_helpers import HELLO, MODEL, body, server_config

from jupyter_ext.keys import KEY_FILE, load_or_create_key

EXTRA_KEY = "sk-configured-for-an-editor"
GETS = [("models",), ("models", MODEL), ("status",), ("cache",), ("health",)]
POSTS = {
    ("chat", "completions"): HELLO,
    ("completions",): {"prompt": "hi", "max_tokens": 4},
    ("messages",): {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
}
JUPYTER_ROUTES = [("api", "kernels"), ("api", "contents"), ("api", "sessions"), ("api", "kernelspecs"),
                  ("api", "terminals"), ("api", "config", "x"), ("api", "me")]


@pytest.fixture
def jp_server_config():
    return server_config(api_keys=[EXTRA_KEY])


def generated_key(jp_runtime_dir) -> str:
    return (jp_runtime_dir / KEY_FILE).read_text().strip()


async def call(jp_fetch, parts, headers, post=None):
    kwargs = dict(method="POST", body=body(post)) if post is not None else {}
    return await jp_fetch(*parts, headers=headers, raise_error=False, follow_redirects=False, **kwargs)


def refused(r) -> bool:
    """Forbidden, or sent to the login page (what Jupyter does for an unauthenticated unknown path)."""
    return r.code in (401, 403) or (r.code == 302 and "/login" in r.headers["Location"])


def as_bearer(key):
    return {"Authorization": f"Bearer {key}"}


def as_x_api_key(key):
    return {"Authorization": "", "x-api-key": key}


async def test_keys_open_every_mlx_route(jp_fetch, jp_runtime_dir, mlx_ready):
    key = generated_key(jp_runtime_dir)
    assert key.startswith("mlxnb-") and key == mlx_ready.keys.kernel_key
    for credential in (as_bearer(key), as_x_api_key(key), as_bearer(EXTRA_KEY), {"Authorization": f"token {key}"}):
        for parts in GETS:
            r = await call(jp_fetch, ("mlx", "v1", *parts), credential)
            assert r.code == 200, (parts, credential, r.body)
        for parts, request in POSTS.items():
            r = await call(jp_fetch, ("mlx", "v1", *parts), credential, request)
            assert r.code == 200, (parts, credential, r.body)
        events = await jp_fetch("mlx", "v1", "events", params={"stream": "0"}, headers=credential)
        assert isinstance(json.loads(events.body), list)


async def test_keys_open_no_jupyter_route(jp_fetch, jp_runtime_dir, mlx_ready):
    key = generated_key(jp_runtime_dir)
    for credential in (as_bearer(key), as_x_api_key(key), as_bearer(EXTRA_KEY)):
        for parts in JUPYTER_ROUTES:
            for post in (None, {"name": "python3"}):
                r = await call(jp_fetch, parts, credential, post)
                assert refused(r), (parts, post, r.code)
    assert (await jp_fetch("api", "kernels")).code == 200  # the Jupyter token does open them


async def test_jupyter_auth_still_works_on_mlx_routes(jp_fetch, jp_serverapp, mlx_ready):
    token = jp_serverapp.identity_provider.token
    for credential in ({"Authorization": f"token {token}"}, as_bearer(token), as_x_api_key(token)):
        for r in (await call(jp_fetch, ("mlx", "v1", "models"), credential),
                  await call(jp_fetch, ("mlx", "v1", "chat", "completions"), credential, HELLO)):
            assert r.code == 200
            assert "Set-Cookie" not in r.headers  # an API client is handed no Jupyter login cookie
    for wrong in ({"Authorization": ""}, as_bearer("mlxnb-not-a-key"), as_x_api_key("nope")):
        r = await call(jp_fetch, ("mlx", "v1", "models"), wrong)
        assert r.code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="mlx"'


async def test_a_browser_session_still_works_on_mlx_routes(jp_fetch, jp_serverapp, mlx_ready):
    """Log in as a browser does (token form, cookies, XSRF), then call a route with the cookie only."""
    from http.cookies import SimpleCookie
    from urllib.parse import urlencode

    login = await jp_fetch("login", headers={"Authorization": ""})
    cookies = SimpleCookie(login.headers.get_list("Set-Cookie")[0])
    xsrf = cookies["_xsrf"].value
    r = await jp_fetch("login", method="POST", follow_redirects=False, raise_error=False,
                       headers={"Authorization": "", "Cookie": f"_xsrf={xsrf}"},
                       body=urlencode({"password": jp_serverapp.identity_provider.token, "_xsrf": xsrf}))
    assert r.code == 302
    for header in r.headers.get_list("Set-Cookie"):
        cookies.load(header)
    jar = "; ".join(f"{k}={v.value}" for k, v in cookies.items())
    browser = {"Authorization": "", "Cookie": jar, "X-XSRFToken": xsrf}
    assert (await call(jp_fetch, ("mlx", "v1", "models"), browser)).code == 200
    assert (await call(jp_fetch, ("mlx", "v1", "chat", "completions"), browser, HELLO)).code == 200
    no_xsrf = {"Authorization": "", "Cookie": jar}  # a cross-site form post: refused as before
    assert (await call(jp_fetch, ("mlx", "v1", "chat", "completions"), no_xsrf, HELLO)).code == 403


async def test_kernels_get_the_key_not_the_jupyter_token(jp_serverapp, jp_runtime_dir, jp_http_port, mlx_ext):
    assert os.environ["MLX_NB_TOKEN"] == generated_key(jp_runtime_dir)
    assert os.environ["MLX_NB_URL"] == f"http://127.0.0.1:{jp_http_port}/a%40b/mlx/v1"
    assert jp_serverapp.identity_provider.token not in "".join(os.environ.values())


@pytest.mark.parametrize("jp_server_config", [server_config(api_key_file="")])
async def test_no_generated_key_when_asked(jp_fetch, jp_runtime_dir, mlx_ext):
    assert not (jp_runtime_dir / KEY_FILE).exists() and mlx_ext.keys.accepted == []
    assert "MLX_NB_TOKEN" not in os.environ
    assert (await call(jp_fetch, ("mlx", "v1", "models"), as_bearer("mlxnb-anything"))).code == 401


# -- the key file ---------------------------------------------------------------------------------
def test_key_file_is_owner_only_atomic_and_reused(tmp_path):
    path = tmp_path / "runtime" / KEY_FILE
    key = load_or_create_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text() == key + "\n"
    assert load_or_create_key(path) == key  # a restart keeps it: editors' settings keep working
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE]  # no temporary file left behind

    os.chmod(path, 0o644)  # readable by others: no longer a secret
    fresh = load_or_create_key(path)
    assert fresh != key and stat.S_IMODE(os.stat(path).st_mode) == 0o600

    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")  # not a regular file of ours: replaced, not followed
    (tmp_path / "elsewhere").write_text("planted")
    assert load_or_create_key(path) not in ("planted", fresh) and not path.is_symlink()
    assert (tmp_path / "elsewhere").read_text() == "planted"
