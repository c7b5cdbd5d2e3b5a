from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import Execution


@admin.register(Execution)
class ExecutionAdmin(admin.ModelAdmin):
    """Read-only: rows are written by the jobs themselves."""

    list_display = [
        "job",
        "lock_name",
        "outcome",
        "attempt",
        "pid",
        "fencing_token",
        "started_at",
        "finished_at",
    ]
    list_filter = ["job", "outcome"]
    search_fields = ["lock_name", "task_id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
