"""Recompute the report rollups from the calls, the review rollups from the closed review
items and the refusal rollups from the events: after an installation, an upgrade, or a change made without ``updated_at``.
Safe to run while the system is live (each bucket is recomputed atomically, serialised with
the periodic refresh; a project's review rollups in one transaction that holds its open
items)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from callgate.models import Project
from callgate.reports.tallies import counts_rebuild
from callgate.timeparse import parse_time


class Command(BaseCommand):
    help = (
        "Recompute CallRollup buckets from ToolCall (all projects, or one; all hours, or from "
        "--since), ReviewRollup and ClosedItemCount from the closed review items and "
        "RefusalRollup from the refused proposals (every hour)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", help="Project slug (default: every project).")
        parser.add_argument(
            "--since", help="ISO date or date-time (UTC unless an offset is given)."
        )

    def handle(self, *args, project=None, since=None, **options):
        project_id = None
        if project:
            found = Project.objects.filter(slug=project).first()
            if found is None:
                raise CommandError(f"No project with slug {project!r}.")
            project_id = found.pk
        since_at = None
        if since:
            try:
                since_at = parse_time(since)
            except ValueError as exc:
                raise CommandError(f"--since {exc}.") from None

        verbosity = options.get("verbosity", 1)

        def progress(done: int, total: int, bucket) -> None:
            if verbosity >= 1 and (done == total or done % 100 == 0 or verbosity >= 2):
                self.stdout.write(
                    f"{done}/{total} buckets ({done * 100 // total}%) · last {bucket[1]:%Y-%m-%d %H:00}Z"
                )

        result = counts_rebuild(project_id=project_id, since=since_at, progress=progress)
        self.stdout.write(
            self.style.SUCCESS(
                f"Done: {result['buckets']} buckets, {result['rows']} rollup rows, "
                f"{result['review_cells']} review rollup rows, "
                f"{result['refusal_cells']} refusal rollup rows."
            )
        )
