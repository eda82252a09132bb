"""The browser tests' `page` fixture (headless chromium), from lab_server."""

from lab_server import page  # noqa: F401
