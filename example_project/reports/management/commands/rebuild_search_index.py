"""A cron-style command that must never run twice at once (two cron hosts, a slow run...).

Try it, from the checkout with the demo running, in two terminals:
``.venv/bin/python example_project/manage.py rebuild_search_index --seconds 20`` (prefixed with
``DEMO_PORT=8001`` for a demo on port 8001); the second one exits at once with status 1.
"""

from __future__ import annotations

import os
import time
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand
from django_redislock import distributed_lock

from reports.models import Execution


class Command(BaseCommand):
    help = "Rebuild the (pretend) search index; guarded by a distributed lock."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=5.0, help="how long the rebuild takes")

    # Busy lock + on_busy="raise" (the default) ends the command with a CommandError: exit 1.
    @distributed_lock("command:rebuild_search_index", blocking=False)
    def handle(self, *args: Any, **options: Any) -> None:
        run = Execution.objects.create(
            job="command", lock_name="command:rebuild_search_index", pid=os.getpid()
        )
        self.stdout.write(f"rebuilding the search index for {options['seconds']:g} s ...")
        time.sleep(options["seconds"])
        run.finish()
        self.stdout.write(self.style.SUCCESS("search index rebuilt"))
