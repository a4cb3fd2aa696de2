"""What the benchmarks share: one request through callgate's WSGI application."""

from __future__ import annotations

import io
import sys

from callgate.wsgi import application  # the server's start-up, including its gc.freeze()


def call(
    method: str, path: str, body: bytes, key: str, content_type: str = "application/json"
) -> tuple[int, bytes]:
    """One request through the WSGI application, as a WSGI server (gunicorn) calls it."""
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "bench",
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
    response = application(environ, lambda code, headers, exc_info=None: status.append(code))
    try:
        content = b"".join(response)
    finally:
        response.close()
    return int(status[0].split()[0]), content
