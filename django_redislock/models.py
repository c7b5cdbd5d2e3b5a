"""The admin's stand-in model for locks: no table, only permissions and the admin index entry.

Locks live in Redis, not in the database. Django's admin, however, hangs its index entry, its URL
names (``admin:django_redislock_lock_changelist``) and its permissions on a model, so this unmanaged
model exists for exactly that. Nothing ever queries it; its primary key is the lock name so a
``LogEntry`` about a force release points at ``<lock name>``.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

__all__ = ["Lock"]


class Lock(models.Model):
    """A lock as the admin sees it (read from Redis by the admin views, never from the database)."""

    name = models.CharField(_("name"), max_length=1024, primary_key=True)

    class Meta:
        managed = False
        # Only "view" is meaningful; add/change/delete do not exist for a lock.
        default_permissions = ("view",)
        permissions = [("force_release_lock", _("Can force-release locks"))]
        verbose_name = _("lock")
        verbose_name_plural = _("locks")

    def __str__(self) -> str:
        return self.name
