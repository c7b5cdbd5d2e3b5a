from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RedisLockConfig(AppConfig):
    name = "django_redislock"
    verbose_name = _("Redis locks")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_redislock import checks
        from django_redislock.decorators import register_adapter
        from django_redislock.management import command_adapter

        checks.register_checks()
        register_adapter(command_adapter)
        # Celery's receivers (task_revoked, lock_lost, the task-id provider) are connected here, not
        # when django_redislock.celery is imported, and only when Celery is installed.
        if importlib.util.find_spec("celery") is not None:
            from django_redislock.celery import receivers

            receivers.connect()
