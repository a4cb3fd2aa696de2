from django.core.management.base import BaseCommand, CommandError

from callgate import services
from callgate.auth import api_key_issue


class Command(BaseCommand):
    help = (
        "Create an API key for an agent (the agent is created if needed). The key is printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug")
        parser.add_argument("agent", help="agent name")
        parser.add_argument("--name", default="", help="a label for the key")
        parser.add_argument(
            "--can-decide",
            action="store_true",
            help="the key may report decision/approval_expired events (a runtime with its own "
            "approval UI); without it only operators decide",
        )

    def handle(self, *args, project: str, agent: str, name: str, can_decide: bool, **options):
        try:
            agent_row = services.agent_get_or_create(project_slug=project, name=agent)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        issued = api_key_issue(agent=agent_row, name=name, can_decide=can_decide)
        self.stderr.write("Copy this key now; it is not stored and cannot be shown again:")
        self.stdout.write(issued.plain)
