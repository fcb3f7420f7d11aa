"""A mirror served over loopback HTTP for the length of a build: its files as they are (pip reads
the PEP 503 pages under simple/) and its bare repositories through `git http-backend` (git's
smart HTTP, which `git fetch --depth 1 URL COMMIT` needs; the dumb protocol cannot do shallow
fetches). Bound to 127.0.0.1 only: builds reach it with the build network `host`."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from .layout import GIT

_GIT_SERVICE = ("/info/refs", "/git-upload-pack")


class _Handler(SimpleHTTPRequestHandler):
    prefix = ""  # every URL starts with /<prefix>/ (the mirror's digest), which is taken off

    def _unprefixed(self) -> bool:
        head = f"/{self.prefix}/"
        if not self.path.startswith(head):
            self.send_error(404, "not this mirror")
            return False
        self.path = self.path[len(head) - 1 :]
        return True

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # a build's pip and git requests are not news

    def _is_git(self) -> bool:
        path = urlsplit(self.path).path
        return path.startswith(f"/{GIT}/") and path.endswith(_GIT_SERVICE)

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self._unprefixed():
            return
        if self._is_git():
            self._git(b"")
        else:
            super().do_GET()

    def do_POST(self):  # noqa: N802
        if not self._unprefixed():
            return
        if not self._is_git():
            self.send_error(405)
            return
        self._git(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _git(self, body: bytes) -> None:
        """One request through git http-backend (CGI): its headers, then its body."""
        parts = urlsplit(self.path)
        env = {
            "GIT_PROJECT_ROOT": self.directory, "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": parts.path, "QUERY_STRING": parts.query,
            "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)), "PATH": "/usr/bin:/bin",
            "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }  # fmt: skip
        proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


# The port a mirror is served on when it is free (else any free one): the same URL from build to
# build keeps BuildKit's cache of the RUN lines that name it (ATTNFORGE_MIRROR_PORT changes it).
PORT = int(os.environ.get("ATTNFORGE_MIRROR_PORT", "38503"))


def _server(folder: Path, prefix: str) -> ThreadingHTTPServer:
    handler = partial(type("Handler", (_Handler,), {"prefix": prefix}), directory=str(folder))
    try:
        return ThreadingHTTPServer(("127.0.0.1", PORT), handler)
    except OSError:  # taken (another build serves its mirror there): any free port
        return ThreadingHTTPServer(("127.0.0.1", 0), handler)


@contextmanager
def served(folder: Path, prefix: str = "mirror") -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 under /<prefix>/ while the block runs; yields its base URL.
    A build passes the mirror's digest as the prefix: the URLs its RUN lines name then change
    exactly when the mirror's contents do, and so does BuildKit's cache key for those lines."""
    server = _server(folder, prefix)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{prefix}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
