from django.core.management.base import BaseCommand, CommandError

from demo.seeding import seed_scale


class Command(BaseCommand):
    help = (
        "Add N realistic calls (10 agents, 20 tools, about 3% escalated, spread over D days) "
        "to a project, with events, review items and rollups as ingest writes them; "
        "set-based SQL, PostgreSQL only. For benchmarks and scale tests."
    )

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug (created if missing)")
        parser.add_argument("--calls", type=int, required=True, help="how many calls to add")
        parser.add_argument("--days", type=int, default=30, help="spread over the last D days")
        parser.add_argument("--seed", type=int, default=1, help="same seed, same calls")

    def handle(self, *args, project: str, calls: int, days: int, seed: int, **options):
        try:
            result = seed_scale(
                slug=project, calls=calls, days=days, seed=seed, say=self.stderr.write
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{result.project.slug}: {result.calls} calls added in {result.seconds:.1f} s "
            f"({result.events} events, {result.review_items} review items in the project)"
        )
