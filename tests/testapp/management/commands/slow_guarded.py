"""Test command: holds ``command:slow_guarded`` for ``--seconds`` (a ``LockedCommand``)."""

from __future__ import annotations

import time
from argparse import ArgumentParser
from typing import Any

from django_redislock.management.base import LockedCommand


class Command(LockedCommand):
    help = "Sleep while holding the command lock; prints 'started' once it holds it."
    lock_timeout = 2.0

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=0.0)

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("started")
        self.stdout.flush()
        time.sleep(options["seconds"])
        self.stdout.write("done")
