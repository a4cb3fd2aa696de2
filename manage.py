#!/usr/bin/env python
"""Django's command-line utility for callgate."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
    # manage.py is the local entry point (quick start, replay, set-up commands): development
    # mode unless told otherwise. Deployments set DEBUG=false (docker-compose.yml does), and
    # gunicorn (callgate.wsgi) never gets this default.
    os.environ.setdefault("DEBUG", "true")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
