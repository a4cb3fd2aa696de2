from django.core.management.base import BaseCommand, CommandError

from callgate import services


class Command(BaseCommand):
    help = "Create a project (the tenant). Idempotent: an existing slug is left as it is."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="URL name, e.g. 'support'")
        parser.add_argument("name", nargs="?", help="Display name (default: the slug)")

    def handle(self, *args, slug: str, name: str | None, **options):
        try:
            project, created = services.project_create(slug=slug, name=name or slug)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{'Created' if created else 'Exists'}: project {project.slug} ({project.name})"
        )
