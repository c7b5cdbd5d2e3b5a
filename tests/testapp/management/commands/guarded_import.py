"""Test command: a ``LockedCommand`` whose lock key is a template over its options."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django_redislock.management.base import LockedCommand


class Command(LockedCommand):
    lock_key = "import:{options[source]}"

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("source")

    def handle(self, *args: Any, **options: Any) -> str:
        from django_redislock import get_lock_info

        info = get_lock_info(f"import:{options['source']}")
        return f"imported {options['source']} under token {info.fencing_token if info else None}"
