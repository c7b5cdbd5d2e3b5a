"""An enqueuing process for the Django-tasks tests: JSON commands on stdin, one JSON reply each.

Runs with ``tests.testapp.tasks_settings`` (the backport's database backend on the shared SQLite
file), which the test process itself cannot load. Commands:

- ``{"op": "enqueue", "task", "args", "kwargs", "queue", "raw"}`` -> ``{"id"}`` or
  ``{"error", "message", "task_id"}``;
- ``{"op": "result", "id"}`` -> the stored row;
- ``{"op": "count", "task"}`` -> how many rows the task has.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.testapp.tasks_settings")

import django

django.setup()

from django_tasks_db.models import DBTaskResult  # noqa: E402

from tests.testapp import background  # noqa: E402


def handle(command: dict[str, Any]) -> dict[str, Any]:
    op = command["op"]
    if op == "enqueue":
        task = getattr(background, command["task"])
        if command.get("queue"):
            task = task.using(queue_name=command["queue"])
        args, kwargs = command.get("args", []), command.get("kwargs", {})
        if command.get("raw"):  # straight to the backend, past the single-flight enqueue
            result = task.get_backend().enqueue(task, args, kwargs)
        else:
            result = task.enqueue(*args, **kwargs)
        return {"id": str(result.id)}
    if op == "result":
        row = DBTaskResult.objects.get(id=command["id"])
        return {
            "status": row.status,
            "exception": row.exception_class_path,
            "traceback": row.traceback,
            "return_value": row.return_value,
        }
    if op == "count":
        return {"count": DBTaskResult.objects.filter(task_path=command["task"]).count()}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as exc:
            reply = {
                "error": type(exc).__name__,
                "message": str(exc),
                "task_id": getattr(exc, "task_id", None),
            }
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
