"""A real HTTP image server on loopback, and a pretend internet in front of it (the network that
cannot exist here): public-looking names resolve to public-looking addresses, which connect to
the loopback server. It plugs into `ImageOptions.resolve` / `.connect`, the fetch's own hooks."""

from __future__ import annotations

import http.server
import io
import socket
import threading
import time
import urllib.parse

from mlx_nb.engine.inputs import remote_images

PUBLIC_NAME, PUBLIC_IP = "images.example.com", "93.184.216.34"
INTERNAL_NAME, INTERNAL_IP = "intranet.example.com", "10.0.0.7"


def png_bytes(size=(24, 16), color=(200, 30, 60)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


class ImageServer:
    """`/pic.png`; `/to?u=URL` redirects there; `/loop` redirects to itself; `/drip` sends a byte
    every 0.2 s until the client goes; anything else is a 404. `hits` lists the paths asked for."""

    def __init__(self):
        self.png = png_bytes()
        self.hits: list[str] = []
        self.drip_closed = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.hits.append(self.path)
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/pic.png":
                    self._answer(200, owner.png, "image/png")
                elif url.path == "/to":
                    self._redirect(urllib.parse.parse_qs(url.query)["u"][0])
                elif url.path == "/loop":
                    self._redirect("/loop")
                elif url.path == "/drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.end_headers()
                    try:
                        while True:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        owner.drip_closed.set()
                else:
                    self._answer(404, b"Not Found: nothing here", "text/plain")

            def _redirect(self, location: str):
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer(self, status: int, body: bytes, kind: str):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PretendInternet:
    """`resolve` / `connect` for ImageOptions: the public-looking and internal names above, routed
    to `server`; every other host goes to the real resolver. Records what the fetch did."""

    def __init__(self, server: ImageServer):
        self.server = server
        self.resolved: list[str] = []
        self.connected: list[tuple[str, int, str]] = []  # (address, port, thread name)

    def resolve(self, host: str, port: int) -> list[str]:
        self.resolved.append(host)
        return {PUBLIC_NAME: [PUBLIC_IP], INTERNAL_NAME: [INTERNAL_IP]}.get(host) or remote_images.resolve(host, port)

    def connect(self, ip: str, port: int, timeout: float) -> socket.socket:
        self.connected.append((ip, port, threading.current_thread().name))
        if ip == PUBLIC_IP:  # the "public" host is the loopback server
            ip, port = "127.0.0.1", self.server.port
        return socket.create_connection((ip, port), timeout)

    def hook(self, opts):
        opts.resolve, opts.connect = self.resolve, self.connect
        return opts
