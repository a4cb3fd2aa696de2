"""``manage.py simulator --port 8100``: serve the target-system simulator with wsgiref.

The service holds the demo data of ``demo.simulator.demo_service`` (tenants ``acme``
and ``globex`` with the tokens in ``DEMO_TENANTS``). It is single-process and in-memory:
restarting it forgets every write. Threaded, so a slow (``delay``) failure does not
block other requests.
"""

from __future__ import annotations

from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.core.management.base import BaseCommand

from demo.simulator import DEMO_TENANTS, demo_service


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    log: Callable[[str], None]  # set by the command: where _Handler writes request lines


class _Handler(WSGIRequestHandler):
    def get_environ(self):
        environ = super().get_environ()
        # the raw (still percent-encoded) path: keeps an encoded "/" inside an operation ID
        environ["simulator.raw_path"] = self.path.split("?", 1)[0]
        return environ

    def log_message(self, format, *args):
        self.server.log(format % args)


class Command(BaseCommand):
    help = "Serve the failure-injecting support-ticket simulator (the demo's target system)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)

    def handle(self, *args, host: str, port: int, **options):
        service = demo_service()
        server = make_server(
            host, port, service, server_class=_ThreadingWSGIServer, handler_class=_Handler
        )
        server.log = lambda line: self.stdout.write(line)
        tokens = ", ".join(f"{name}={token}" for name, token in DEMO_TENANTS.items())
        self.stdout.write(
            f"simulator on http://{host}:{port}/ (tenants: {tokens}); Ctrl-C stops it"
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
