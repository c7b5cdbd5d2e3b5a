"""Test command: a ``LockedCommand`` that skips (exit 0) when busy, without ``--skip-if-locked``."""

from __future__ import annotations

from typing import Any

from django_redislock.management.base import LockedCommand


class Command(LockedCommand):
    help = "Shares slow_guarded's lock; says why it skipped when that one runs."
    lock_key = "command:slow_guarded"
    lock_on_busy = "skip"

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("ran")
