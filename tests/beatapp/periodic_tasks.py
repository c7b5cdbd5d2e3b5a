"""``python -m tests.beatapp.periodic_tasks '<json list>'``: migrate the file database and create
django-celery-beat ``PeriodicTask`` rows, as an admin user would.

Each item: ``{"name", "task", "every" (seconds), "args", "queue", "headers"}``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.beatapp.settings")
os.environ.setdefault("REDISLOCK_TEST_DJANGO_CELERY_BEAT", "1")

import django

django.setup()

from django.core.management import call_command  # noqa: E402


def main(specs: list[dict[str, object]]) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    for spec in specs:
        every, _ = IntervalSchedule.objects.get_or_create(
            every=spec["every"], period=IntervalSchedule.SECONDS
        )
        PeriodicTask.objects.create(
            name=spec["name"],
            task=spec["task"],
            interval=every,
            args=json.dumps(spec.get("args", [])),
            queue=spec.get("queue"),
            headers=json.dumps(spec.get("headers", {})),
        )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
