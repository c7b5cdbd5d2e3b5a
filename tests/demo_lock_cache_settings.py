"""The demo's settings (``example_project/demo/settings.py``) with another lock cache entry.

``DEMO_TEST_LOCK_CACHE`` picks how ``CACHES["locks"]`` is written, as new users write it: ``bare``
(django-redis without ``OPTIONS``: redis-py's own defaults) or ``builtin`` (Django's own
``RedisCache``, no ``OPTIONS``). Needs ``example_project`` on ``sys.path``.
"""

from __future__ import annotations

import os

from demo.settings import *  # noqa: F403
from demo.settings import CACHES

BACKENDS = {
    "bare": "django_redis.cache.RedisCache",
    "builtin": "django.core.cache.backends.redis.RedisCache",
}

CACHES = {
    **CACHES,
    "locks": {
        "BACKEND": BACKENDS[os.environ["DEMO_TEST_LOCK_CACHE"]],
        "LOCATION": CACHES["locks"]["LOCATION"],
    },
}
