"""Errors of the Celery integration (shared with the other task integrations)."""

from __future__ import annotations

from django_redislock.singleflight import DuplicateTaskError

__all__ = ["DuplicateTaskError"]
