"""Fetching a request's http(s) image, when remote images are allowed, without becoming a proxy
into the server's network.

- Resolve, check, then pin: the host is resolved once, every address must be public (not
  loopback, private, link-local, shared, reserved, multicast or unspecified) unless
  `allow_private` says otherwise, and the connection goes to the address that was checked, so a
  second DNS answer cannot swap in an internal one. HTTPS still verifies the certificate against
  the host name.
- Redirects are followed by hand, at most MAX_REDIRECTS, each hop checked like the first.
- One deadline for the whole fetch (every hop, the headers and the body); when it passes, the
  connection is closed under the fetching thread.
- Fetches run on their own few threads, never on the executor the server's routes share; the
  server awaits them (`afetch`, via images.prefetch_remote_images) before it submits the request.
- Failures say "could not fetch", never the upstream status or error: the route must not become
  an oracle for what answers where.

Why hand-written on http.client: urllib and httpx resolve the name again when they connect and
have no hook to connect to a checked address while keeping the name for TLS and `Host`;
`HTTPConnection.connect` is the documented place to choose the socket.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from mlx_nb.engine.types import RequestError, TooLargeError

MAX_REDIRECTS = 5
FETCH_THREADS = 4
_EXECUTOR = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="mlx-nb-image-fetch")
_REDIRECTS = {301, 302, 303, 307, 308}


def resolve(host: str, port: int) -> list[str]:
    """The host's addresses. `ImageOptions.resolve` and `.connect` are the network as the fetch
    sees it: these defaults are the real one; tests put a pretend internet there."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def connect(ip: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((ip, port), timeout)


def refusal(ip: str) -> str:
    """Why `ip` is not a public address (empty if it is)."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):  # most specific first
        if getattr(addr, f"is_{kind}"):
            return kind.replace("_", "-")
    return "" if addr.is_global else "non-public"


class _Pinned(http.client.HTTPConnection):
    """Connects to `ip`; `host` stays the name (Host header). `pinned` is the socket, also after
    http.client hands it to the response."""

    pinned: socket.socket | None = None

    def __init__(self, host: str, port: int, ip: str, timeout: float, opts: Any):
        super().__init__(host, port, timeout=timeout)
        self.ip, self.opts = ip, opts

    def connect(self):
        self.sock = self.pinned = self.opts.connect(self.ip, self.port, self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    """`_Pinned` over TLS: the certificate is checked against the host name, not the address."""

    pinned: socket.socket | None = None

    def __init__(self, host: str, port: int, ip: str, timeout: float, opts: Any):
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.ip, self.opts = ip, opts

    def connect(self):
        sock = self.opts.connect(self.ip, self.port, self.timeout)
        self.sock = self.pinned = self.tls.wrap_socket(sock, server_hostname=self.host)


class _Fetch:
    """One fetch on a fetch thread; `cancel()` (from the waiting thread) closes its connection."""

    def __init__(self, url: str, where: str, opts: Any):
        self.url, self.where, self.opts = url, where, opts
        self.deadline = time.monotonic() + opts.timeout_s
        self.conn: _Pinned | _PinnedTLS | None = None
        self.cancelled = threading.Event()

    def fail(self, why: str) -> RequestError:
        return RequestError(f"{self.where}: could not fetch the image at {self.url}: {why}", self.where)

    def cancel(self) -> None:
        self.cancelled.set()
        self.hang_up(self.conn)

    @staticmethod
    def hang_up(conn) -> None:
        """End the connection now, also when http.client's response still holds the socket."""
        sock = getattr(conn, "pinned", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.cancelled.is_set():
            raise self.fail(f"no answer within {self.opts.timeout_s:g} s")
        return left

    def target(self, url: str) -> tuple[urllib.parse.SplitResult, int, str]:
        """(parts, port, the checked address to pin) for `url`, or the RequestError that says why not."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise self.fail("not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self.fail("only http(s) URLs with a host are fetched")
        try:
            ips = self.opts.resolve(parts.hostname, port)
        except (OSError, UnicodeError):
            raise self.fail(f"the host {parts.hostname} does not resolve") from None
        if not ips:
            raise self.fail(f"the host {parts.hostname} does not resolve")
        if not self.opts.allow_private:
            for ip in ips:
                if why := refusal(ip):
                    raise RequestError(
                        f"{self.where}: image host {parts.hostname} is a {why} address ({ip}); remote images "
                        "must be on public addresses (a server setting, allow_private_image_hosts, lifts this)",
                        self.where,
                    )
        return parts, port, ips[0]

    def run(self) -> bytes:
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            parts, port, ip = self.target(url)
            cls = _PinnedTLS if parts.scheme == "https" else _Pinned
            self.conn = conn = cls(parts.hostname, port, ip, self.left(), self.opts)
            try:
                path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
                conn.request("GET", path, headers={"Accept": "image/*", "User-Agent": "mlx-nb"})
                resp = conn.getresponse()
                if resp.status in _REDIRECTS and resp.getheader("Location"):
                    url = urllib.parse.urljoin(url, resp.getheader("Location"))
                    continue
                if resp.status != 200:
                    raise self.fail("the server did not answer with an image")
                return self.body(resp)
            except RequestError:
                raise
            except (OSError, http.client.HTTPException, ValueError):  # ValueError: e.g. a host that is not ASCII
                self.left()  # a cancelled or late fetch says so
                raise self.fail("the connection failed") from None
            finally:
                self.hang_up(conn)
                conn.close()
        raise self.fail(f"more than {MAX_REDIRECTS} redirects")

    def body(self, resp: http.client.HTTPResponse) -> bytes:
        limit, chunks, size = self.opts.max_bytes, [], 0
        while size <= limit:
            self.conn.pinned.settimeout(self.left())
            chunk = resp.read1(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise TooLargeError(f"{self.where}: image is larger than {limit} bytes", self.where)


def fetch(url: str, where: str, opts: Any) -> bytes:
    """The image's bytes, fetched on a fetch thread; the calling thread waits (library use)."""
    job = _Fetch(url, where, opts)
    future = _EXECUTOR.submit(job.run)
    try:
        return future.result(timeout=max(0.0, job.deadline - time.monotonic()))
    except FutureTimeout:
        job.cancel()
        raise job.fail(f"no answer within {opts.timeout_s:g} s") from None


async def afetch(url: str, where: str, opts: Any) -> bytes:
    """`fetch` for an event loop: awaits the fetch thread without holding any other thread."""
    job = _Fetch(url, where, opts)
    future = asyncio.wrap_future(_EXECUTOR.submit(job.run))
    try:
        return await asyncio.wait_for(future, max(0.0, job.deadline - time.monotonic()))
    except asyncio.TimeoutError:
        job.cancel()
        raise job.fail(f"no answer within {opts.timeout_s:g} s") from None


def remote_url(part: dict) -> Any:
    """The http(s) URL an image part points at, if any."""
    value = part.get("image")
    if value is None:
        value = part.get("image_url")
    if value is None and isinstance(part.get("source"), dict):
        value = part["source"].get("url")
    if isinstance(value, dict):
        value = value.get("url")
    if isinstance(value, str) and value.strip()[:8].lower().startswith(("http://", "https://")):
        return value.strip()
    return None
