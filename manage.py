#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys

# Commands that read neither store: they run with no URLs set and start no server (the image build
# runs collectstatic so).
NO_STORAGE = {"collectstatic", "help", "version", "--help", "-h", "--version"}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    if sys.argv[1:2] and sys.argv[1] not in NO_STORAGE:
        # Settings start nothing: a command that may use storage gets the embedded servers here
        # when DATABASE_URL / REDIS_URL are unset.
        from sentinel.embedded import ensure_environment

        ensure_environment()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
