"""``manage.py mcp_gateway``: serve a project's MCP gateway (``mcp_gateway.server``)."""

from __future__ import annotations

import os

import anyio
from django.core.management.base import BaseCommand, CommandError

from callgate.auth import api_key_verify
from callgate.services import project_by_slug
from mcp_gateway import services
from mcp_gateway.models import Upstream
from mcp_gateway.pool import UpstreamSpec
from mcp_gateway.server import Gateway


class Command(BaseCommand):
    help = (
        "Serve an MCP gateway for a project: MCP Streamable HTTP at http://BIND/mcp (or stdio), "
        "fronting the project's upstream MCP servers; every tools/call goes through callgate's gate."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="The project's slug.")
        parser.add_argument(
            "--upstream",
            action="append",
            default=[],
            metavar="NAME=URL_OR_COMMAND",
            help="An upstream MCP server (an http(s) URL, or a command line for stdio); "
            "registered for the project. Repeat for several. Without any: the project's "
            "enabled upstreams in the database.",
        )
        parser.add_argument(
            "--timeout", type=float, default=30.0, help="Per-call timeout of --upstream (s)."
        )
        parser.add_argument("--bind", default="127.0.0.1:8765", help="HOST:PORT to listen on.")
        parser.add_argument(
            "--stdio",
            action="store_true",
            help="Serve one client on stdin/stdout; the key comes from CALLGATE_API_KEY.",
        )

    def handle(self, *args, **options):
        try:
            project = project_by_slug(options["project"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for item in options["upstream"]:
            name, sep, target = item.partition("=")
            if not sep or not name or not target:
                raise CommandError(f"--upstream must be NAME=URL_OR_COMMAND, got {item!r}")
            try:
                services.upstream_set(
                    project=project, name=name, target=target, timeout_seconds=options["timeout"]
                )
            except ValueError as exc:
                raise CommandError(f"--upstream {name}: {exc}") from None
        names = {item.partition("=")[0] for item in options["upstream"]}
        rows = Upstream.objects.filter(project=project, enabled=True)
        if names:
            rows = rows.filter(name__in=names)
        specs = [
            UpstreamSpec(
                name=row.name,
                transport=row.transport,
                target=row.target,
                timeout=row.timeout_seconds,
                pk=row.pk,
            )
            for row in rows
        ]
        if not specs:
            raise CommandError(
                f"project {project.slug!r} has no enabled upstream: pass --upstream NAME=URL_OR_COMMAND"
            )
        if options["stdio"]:
            key = api_key_verify(os.environ.get("CALLGATE_API_KEY", ""))
            if key is None or key.project_id != project.pk:
                raise CommandError("--stdio needs CALLGATE_API_KEY: an active key of the project")
            anyio.run(Gateway(project=project, specs=specs, api_key=key).run_stdio)
            return
        host, _, port = options["bind"].rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--bind must be HOST:PORT, got {options['bind']!r}")
        import uvicorn

        app = Gateway(project=project, specs=specs).http_app()
        self.stderr.write(
            f"MCP gateway for {project.slug}: http://{options['bind']}/mcp "
            f"({', '.join(s.name for s in specs)})"
        )
        uvicorn.run(app, host=host, port=int(port), log_level="warning")
