"""``manage.py demo [--seed N] [--agents N] [--calls N] [--trickle]``: the demo fleet.

Creates the ``demo`` project, the users ``operator`` and ``manager`` (passwords printed),
agents with API keys and tool contracts, then runs simulated agents against callgate and the
simulator in-process (no server needed) so that every reason of the taxonomy occurs and
review items wait in the queue, and seeds 30 days of history (``demo.history``) so the
reports and the overview have something to show. Running it again resets the demo
project's calls first (and says so) instead of piling them up. ``--trickle`` then keeps adding a call
every few seconds until interrupted (run it beside ``runserver``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create the demo project and run the simulated agent fleet (in-process)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--seed", type=int, default=1, help="random seed: the same seed replays the same calls"
        )
        parser.add_argument("--agents", type=int, default=4, help="number of agents (default 4)")
        parser.add_argument(
            "--calls",
            type=int,
            default=60,
            help="scripted calls to run (at least one per reason; default 60)",
        )
        parser.add_argument(
            "--trickle",
            action="store_true",
            help="afterwards keep adding a call every --interval seconds until Ctrl-C",
        )
        parser.add_argument(
            "--interval", type=float, default=5.0, help="seconds between trickle calls"
        )
        parser.add_argument(
            "--public-url",
            default="http://127.0.0.1:8000",
            help="where the server will run (the contracts' look-up URLs point there)",
        )
        parser.add_argument(
            "--serve",
            metavar="ADDR:PORT",
            help="then serve callgate in this process (runserver without reloading), with the "
            "trickle, the simulator under /simulator/ and the periodic jobs beside it",
        )
        parser.add_argument(
            "--no-history",
            action="store_true",
            help="only the fleet's calls, at the current time: no 30 days of history",
        )
        parser.add_argument(
            "--days",
            type=int,
            default=30,
            help="days of history to seed (demo.history; default 30)",
        )

    def handle(
        self,
        *args,
        seed: int,
        agents: int,
        calls: int,
        trickle: bool,
        interval: float,
        public_url: str,
        no_history: bool,
        days: int,
        serve: str | None,
        **options,
    ):
        from demo.fleet import demo_run, demo_trickle

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
        if agents < 1 or agents > 50:
            raise CommandError("--agents must be between 1 and 50")
        if calls < 1 or calls > 100_000:
            raise CommandError("--calls must be between 1 and 100000")
        started = time.monotonic()
        width = 30

        interactive = self.stdout.isatty()

        def progress(done: int, total: int, name: str) -> None:
            filled = width * done // total
            if interactive:
                self.stdout.write(
                    f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[:24]:<24}",
                    ending="",
                )
            elif done == total or done % max(total // 10, 1) == 0:  # a log file: a line per tenth
                self.stdout.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            self.stdout.flush()

        if serve:
            public_url = f"http://{serve}"
        if not 1 <= days <= 365:
            raise CommandError("--days must be between 1 and 365")

        from callgate.models import Project
        from demo.fleet import PROJECT_SLUG
        from demo.history import demo_reset, history_seed

        earlier = Project.objects.filter(slug=PROJECT_SLUG).first()
        if earlier is not None:
            removed = demo_reset(project=earlier)
            self.stdout.write(
                f"reset: removed the {removed:,} calls and the API keys of an earlier demo run (users, agents "
                "and contracts stay; the passwords below are new)"
            )
        setup, stats = demo_run(
            seed=seed,
            agents=agents,
            calls=calls,
            public_url=public_url,
            spread_days=0 if no_history else 1,
            progress=progress,
        )
        self.stdout.write("")
        from demo.sink import demo_alert_rules

        rules = demo_alert_rules(project=setup.project, public_url=public_url)
        self.stdout.write(
            f"alerts: {len(rules)} demo rules deliver to {public_url}/simulator/webhook-sink/"
        )
        if not no_history:
            history = history_seed(project=setup.project, seed=seed, days=days)
            incidents = ", ".join(f"{k} {v:,}" for k, v in sorted(history.by_incident.items()))
            self.stdout.write(
                f"history: {history.calls:,} calls over {days} days "
                f"({history.review_items:,} decided review items; incidents: {incidents})"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"demo: {stats.calls} calls by {len(setup.keys)} agents in {time.monotonic() - started:.1f} s "
                f"(seed {seed})"
            )
        )
        outcome = ", ".join(f"{k} {v}" for k, v in sorted(stats.statuses.items()))
        self.stdout.write(f"  agent outcomes: {outcome}")
        self.stdout.write(f"  project: /p/{setup.project.slug}/")
        self.stdout.write(f"  operator login: operator / {setup.operator_password}")
        self.stdout.write(f"  manager login:  manager / {setup.manager_password}")
        self.stdout.write(
            f"  admin login:    admin / {setup.admin_password}  (also the Django admin at /admin/)"
        )
        name, key = next(iter(setup.keys.items()))
        self.stdout.write(f"  API key of {name}: {key}")
        if serve:
            self.serve(
                serve,
                setup=setup,
                trickle=trickle,
                interval=interval,
                agents=agents,
                public_url=public_url,
            )
            return
        if trickle:
            self.stdout.write(f"trickling a call every {interval:g} s; Ctrl-C to stop")
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):  # also when started in the background
                signal.signal(signum, lambda *_: stop.set())
            try:
                demo_trickle(
                    setup=setup, interval=interval, agents=agents, public_url=public_url, stop=stop
                )
            except KeyboardInterrupt:
                pass
            self.stdout.write("trickle stopped")

    def serve(
        self, addr: str, *, setup, trickle: bool, interval: float, agents: int, public_url: str
    ) -> None:
        """One process for the quick start: the server, the demo's trickle and simulator (so
        "Reconcile now" looks the demo's operations up in the same simulator the agents wrote
        to), and the periodic jobs that beat runs in production."""
        from django.core.management import call_command

        from callgate.celery import run_periodic_in_process
        from demo.fleet import demo_trickle

        stop = threading.Event()
        threading.Thread(
            target=run_periodic_in_process, args=(stop,), daemon=True, name="periodic"
        ).start()
        if trickle:
            threading.Thread(
                target=demo_trickle,
                daemon=True,
                name="trickle",
                kwargs=dict(
                    setup=setup, interval=interval, agents=agents, public_url=public_url, stop=stop
                ),
            ).start()
        self.stdout.write(
            f"serving on http://{addr}/ with the periodic jobs"
            + (f" and a call every {interval:g} s" if trickle else "")
        )
        try:
            call_command("runserver", addr, use_reloader=False)
        finally:
            stop.set()
