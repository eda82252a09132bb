"""Kernels of a `make lab`-style server (a real `jupyter server` process with the extension enabled,
as `jupyter lab` has it) reach the shared engine with the server's mlx API key, never the Jupyter
token: under Jupyter's default auth settings, over TLS with password auth, and on a unix socket."""

import datetime
import json
import time
from contextlib import contextmanager

import httpx
import pytest
from live_server import serving
from server_helpers import MODEL

KERNEL_CHECK = """
import json, os
from mlx_nb import Client
reply = Client().chat("hello from a kernel", max_tokens=4)
print(json.dumps({"env": dict(os.environ), "finish": reply.finish_reason}))
"""
KERNEL_CHAT = """
import os, httpx
reply = httpx.post(os.environ["MLX_NB_URL"] + "/chat/completions", timeout=60, trust_env=False,
                   headers={"Authorization": "Bearer " + os.environ["MLX_NB_TOKEN"]},
                   json={"messages": [{"role": "user", "content": "hello from a kernel"}], "max_tokens": 24})
print(reply.json()["id"])
"""


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own processes."""
    yield


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Jupyter's default auth settings: it makes its own token, unauthenticated access as it defaults."""
    with serving(tmp_path_factory.mktemp("lab"), MODEL, app="server", token=None) as server:
        yield server


@contextmanager
def kernel(server, jupyter: httpx.Client, headers: dict = {}):  # noqa: B006 (read only)
    """A kernel started through the server's REST API (as a notebook page does), and its client."""
    from jupyter_client import BlockingKernelClient

    r = jupyter.post(f"{server.base}/api/kernels", json={"name": "python3"}, headers=headers)
    r.raise_for_status()
    kid = r.json()["id"]
    kc = BlockingKernelClient(connection_file=str(server.runtime / f"kernel-{kid}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        wait_ready(kc)
        yield kc
    finally:
        kc.stop_channels()
        jupyter.delete(f"{server.base}/api/kernels/{kid}", headers=headers)


def wait_ready(kc, timeout: float = 120) -> None:
    """jupyter_client's wait_for_ready without its heartbeat check, which a client made from a
    connection file runs with a 1 s limit: a kernel starting on a busy machine is not dead."""
    from queue import Empty

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kc.kernel_info()
        try:
            if kc.get_shell_msg(timeout=5)["msg_type"] == "kernel_info_reply":
                kc.get_iopub_msg(timeout=1)  # iopub is connected too
                return
        except Empty:
            continue
    raise AssertionError(f"the kernel did not answer in {timeout:g} s")


def check_kernel(kc, server) -> dict:
    """Run KERNEL_CHECK: the kernel's Client() chats through the server; returns its environment."""
    (line,) = run(kc, [kc.execute(KERNEL_CHECK)], timeout=120)
    seen = json.loads(line)
    assert seen["finish"] in ("stop", "length")
    env = seen["env"]
    assert env["MLX_NB_TOKEN"] == server.key
    if server.token:
        assert server.token not in "".join(env.values()), "the Jupyter token reached the kernel"
    return env


def test_kernels_use_the_key_not_the_jupyter_token(lab):
    assert lab.token  # Jupyter made one: it must not reach kernels
    with kernel(lab, lab.jupyter) as kc:
        env = check_kernel(kc, lab)
    assert env["MLX_NB_URL"] == lab.url  # plain HTTP: the server's own port
    assert lab.http.post(f"{lab.base}/api/kernels", json={"name": "python3"}).status_code == 403
    for path in ("api/kernels", "api/contents", "api/terminals", "api/sessions"):  # the key opens none of them
        assert lab.http.get(f"{lab.base}/{path}").status_code == 403, path
        assert lab.jupyter.get(f"{lab.base}/{path}").status_code == 200, path  # they are served, to the token


KERNEL_LONG_CHAT = """
import json, os, httpx
body = {"messages": [{"role": "user", "content": "a long answer from the first kernel"}], "max_tokens": 3500,
        "stream": True, "logit_bias": {str(t): -100 for t in EOS}}
first = None
with httpx.stream("POST", os.environ["MLX_NB_URL"] + "/chat/completions", json=body, timeout=600, trust_env=False,
                  headers={"Authorization": "Bearer " + os.environ["MLX_NB_TOKEN"]}) as r:
    for line in r.iter_lines():
        if line.startswith("data: {") and first is None:
            first = json.loads(line[6:])["id"]
print(first)
"""


def test_two_kernels_share_the_engine(lab):
    """Overlapping by construction, not by timing: the first kernel's long answer (its end-of-text
    token barred) is decoding before the second kernel asks; then the first is aborted."""
    from mlx_nb.models import load_model

    eos = sorted(load_model(MODEL).tokenizer.eos_token_ids)
    with kernel(lab, lab.jupyter) as first, kernel(lab, lab.jupyter) as second:
        clients = [first, second]
        for kc in clients:
            # (httpx imported now, so the chat cells below start as soon as they arrive)
            assert run(kc, [kc.execute('import os, httpx; print(os.environ["MLX_NB_URL"])')]) == [lab.url]
        since = lab.last_seq()
        earlier = {r["id"] for r in lab.get("status")["requests"]}  # an earlier test's, still listed: not this one
        long_msg = first.execute(KERNEL_LONG_CHAT.replace("EOS", repr(eos)))
        deadline = time.monotonic() + 120
        while not (decoding := [r["id"] for r in lab.get("status")["requests"]
                                if r["phase"] == "decode" and r["id"] not in earlier]):
            assert time.monotonic() < deadline, "the first kernel's request never started decoding"
            time.sleep(0.05)
        (short_id,) = run(second, [second.execute(KERNEL_CHAT)], timeout=120)
        ended = lab.http.delete(f"{lab.url}/requests/{decoding[0]}")  # still running: ended now
        assert ended.status_code == 202, (ended.text, [e for e in lab.events(since)
                                                       if decoding[0] in e["requests"] and e["kind"] != "step"])
        (long_id,) = run(first, [long_msg], timeout=120)
        ids = [long_id.removeprefix("chatcmpl-"), short_id.removeprefix("chatcmpl-")]
        assert ids[0] == decoding[0]
        shared = [e for e in lab.events(since) if e["kind"] == "step" and set(ids) <= set(e["requests"])]
        assert shared, f"no batch step held both kernels' requests {ids}"


def self_signed(dirpath):
    """A certificate for 127.0.0.1 / localhost and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = dirpath / "cert.pem", dirpath / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def log_in(server, password: str) -> tuple[httpx.Client, dict]:
    """A browser-like session (cookies) logged in with the password, and the XSRF header it needs."""
    session = server.client()
    session.get(f"{server.base}/login")
    xsrf = session.cookies["_xsrf"]
    r = session.post(f"{server.base}/login", data={"password": password, "_xsrf": xsrf})
    assert r.status_code == 302 and "/login" not in r.headers["location"], (r.status_code, r.text[:300])
    return session, {"X-XSRFToken": xsrf}


def test_kernels_reach_the_engine_over_tls_with_password_auth(tmp_path):
    from jupyter_server.auth.security import passwd

    cert, key = self_signed(tmp_path)
    root = tmp_path / "server"
    root.mkdir()
    with serving(root, MODEL, f"--PasswordIdentityProvider.hashed_password={passwd('open sesame')}",
                 app="server", token="", cert=cert, key=key) as server:
        session, xsrf = log_in(server, "open sesame")
        try:
            with kernel(server, session, xsrf) as kc:
                env = check_kernel(kc, server)
        finally:
            session.close()
        url = env["MLX_NB_URL"]  # not the https URL: a loopback port of the mlx routes only
        assert url.startswith("http://127.0.0.1:") and url != server.url
        with httpx.Client(trust_env=False, timeout=30) as plain:
            kernel_base = url.removesuffix("/mlx/v1")
            assert plain.get(f"{url}/models", headers={"Authorization": f"Bearer {server.key}"}).status_code == 200
            assert plain.get(f"{url}/models").status_code == 401
            for path in ("api/kernels", "api/contents", "login", "static/favicon.ico"):
                assert plain.get(f"{kernel_base}/{path}").status_code == 404, path


def test_kernels_reach_the_engine_over_a_unix_socket(tmp_path):
    with serving(tmp_path, MODEL, app="server", sock=True) as server:
        with kernel(server, server.jupyter) as kc:
            env = check_kernel(kc, server)
        assert env["MLX_NB_URL"].startswith("http://127.0.0.1:")


def run(kc, msg_ids: list[str], timeout: float = 60) -> list[str]:
    """The stdout lines of executed cells (by message id), once each is idle; errors fail the test."""
    out: list[str] = []
    pending = set(msg_ids)
    while pending:
        msg = kc.get_iopub_msg(timeout=timeout)
        parent = msg["parent_header"].get("msg_id")
        if parent not in pending:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out += content["text"].splitlines()
        elif kind == "error":
            raise AssertionError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            pending.discard(parent)
    return out
