"""A port for the live-server tests of this package, in the range this branch may use."""

from __future__ import annotations

import socket

PORTS = range(8241, 8250)


def free_port() -> int:
    """The first port of ``PORTS`` that binds now (Django's live server binds without
    SO_REUSEADDR, so a port left in TIME_WAIT by the previous class is skipped); 0 (any
    free port) when none does."""
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("localhost", port))
            except OSError:
                continue
            return port
    return 0


class OwnPorts:
    """Mixin for a ``LiveServerTestCase``: its server listens on ``free_port()``, chosen
    when the class starts."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        super().setUpClass()
