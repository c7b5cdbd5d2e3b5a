"""Test command: at most two copies at once across the fleet (``lock_permits = 2``)."""

from __future__ import annotations

import time
from argparse import ArgumentParser
from typing import Any

from django_redislock.management.base import LockedCommand


class Command(LockedCommand):
    help = "Sleep while holding one of two permits; prints 'started' once it holds one."
    lock_timeout = 5.0
    lock_permits = 2

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=0.0)

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("started")
        self.stdout.flush()
        time.sleep(options["seconds"])
