from django.core.management.base import BaseCommand, CommandError

from callgate import services
from callgate.models import Membership


class Command(BaseCommand):
    help = "Add a user to a project with a role (creates the user when --password is given)."

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug")
        parser.add_argument("username")
        parser.add_argument("role", choices=Membership.Role.values)
        parser.add_argument(
            "--password", help="create the user with this password if it does not exist"
        )

    def handle(
        self, *args, project: str, username: str, role: str, password: str | None, **options
    ):
        try:
            membership = services.membership_set(
                project_slug=project, username=username, role=role, password=password
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{membership.user.get_username()} is {membership.role} in {membership.project.slug}"
        )
