"""Settings for the demo's own tests (``pytest`` in ``example_project/``; see ``conftest.py``).

The tests need no running demo and must not touch one: ``REDIS_URL`` points at a closed port, so
only the ``redislock`` fixture of ``django_redislock.testing.pytest_plugin`` (a private
``redis-server``, and the ``locks`` alias pointed at it for the test) can make a lock work.
Celery runs tasks eagerly, in the test, with their locks taken and released around the body.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["REDIS_URL"] = "redis://127.0.0.1:1"  # closed: nothing may reach a real Redis
os.environ.setdefault("DEMO_VAR_DIR", str(Path(__file__).resolve().parent.parent / "var" / "tests"))

from demo.settings import *  # noqa: F403

CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
DEMO_REPORT_SECONDS = 0.0
DEMO_SYNC_SECONDS = 0.0
