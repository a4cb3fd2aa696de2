"""``manage.py classify PATH``: replay a case file offline (``shared/cases/README.md``)."""

from __future__ import annotations

import json
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from pydantic import ValidationError

from callgate.replay import read_cases, replay_case


class Command(BaseCommand):
    help = (
        "Replay a file of tool-call cases (JSON lines) through callgate's ingest path and print one JSON line "
        "per case: {id, reason, category, route, observation, operation_id, calls}. Nothing is stored. '-' reads standard input."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="a JSON-lines case file, or - for standard input")

    def handle(self, *args, path: str, **options):
        self.migrate_if_needed()
        try:
            stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc}") from exc
        failed = 0
        with stream:
            for number, case, error in read_cases(stream):
                if case is None:
                    self.stderr.write(error)
                    failed += 1
                    continue
                try:
                    result = replay_case(case)
                except (ValidationError, ValueError, KeyError, TypeError) as exc:
                    self.stderr.write(f"line {number} ({case.get('id')}): cannot replay: {exc}")
                    failed += 1
                    continue
                self.stdout.write(json.dumps(result, ensure_ascii=False))
        if failed:
            raise CommandError(f"{failed} line(s) could not be read")

    def migrate_if_needed(self) -> None:
        """A replay needs the tables (it runs in a transaction that is rolled back); a fresh
        checkout's embedded SQLite database has none yet, so migrate it first."""
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            self.stderr.write("classify: migrating the database first")
            call_command("migrate", verbosity=0, interactive=False)
