"""Scoped API keys: credentials that open the `mlx/v1` routes and nothing else of the server.

The Jupyter token opens everything (kernels, files, terminals), so it is not what an editor's
OpenAI settings or a notebook's kernel should hold. The mlx routes also accept:
- the keys in `MLXExtension.api_keys`, and
- one generated key, kept owner-only (0600, via jupyter_core's `secure_write`) in Jupyter's
  runtime dir, written atomically, reused across restarts (delete the file for a new one) and
  logged at start. Kernels get this key (kernel_env.py).

A key arrives as `Authorization: Bearer|token <key>` (the openai SDK) or `x-api-key: <key>` (the
anthropic SDK). Only MLXHandler consults this module, so no other route ever accepts a key; a
request without one goes through Jupyter's own auth as before.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Optional

from jupyter_core.paths import secure_write
from jupyter_server.auth.identity import User

KEY_FILE = "mlx-nb-api-key"
KEY_USER = User(username="mlx-api-key", name="mlx API key", display_name="mlx API key")


def load_or_create_key(path: Path, log=None) -> str:
    """The key stored at `path`, or a new one written there atomically (0600). A file anyone else
    could have read (group/other bits, not ours, not a regular file) is replaced, not trusted."""
    try:
        info = os.lstat(path)
        trusted = stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
        key = path.read_text().strip() if trusted else ""
        if key:
            return key
        if log is not None:
            log.warning("mlx: %s is not an owner-only file of this user: writing a new key", path)
    except FileNotFoundError:
        pass
    key = "mlxnb-" + secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with secure_write(str(temp)) as f:
        f.write(key + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    return key


class Keys:
    """The keys the mlx routes accept; `kernel_key` is the one kernels get (None: no key at all)."""

    def __init__(self, configured: list[str], generated: Optional[str]):
        self.accepted = [k for k in [generated, *configured] if k]
        self.kernel_key = self.accepted[0] if self.accepted else None

    def presented(self, headers) -> Optional[str]:
        """The credential a request carries, if any."""
        scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and value.strip():
            return value.strip()
        return headers.get("x-api-key", "").strip() or None

    def accepts(self, credential: Optional[str]) -> bool:
        if not credential:
            return False
        given = credential.encode("utf-8", "replace")
        return any([hmac.compare_digest(given, key.encode()) for key in self.accepted])  # every key compared


class KeyIdentity:
    """The server's IdentityProvider as seen by a request that presented a valid key: the user is
    the key's and, like a token, the key skips XSRF and origin checks (it is not an ambient
    credential a browser sends by itself); everything else is the server's provider's."""

    def __init__(self, provider):
        self._provider = provider

    def get_user(self, handler) -> User:
        return KEY_USER

    def is_token_authenticated(self, handler) -> bool:
        return True

    def should_check_origin(self, handler) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._provider, name)


class KeyAuthorizer:
    """A key grants the `mlx` resource, the only one its routes ask about."""

    def is_authorized(self, handler, user, action: str, resource: str) -> bool:
        return resource == "mlx"
