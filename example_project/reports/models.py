"""What the demo's jobs did: one row per time a job body actually ran."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Execution(models.Model):
    """One run of a job body.

    The demo counts rows, not task publications: "5 clicks, 1 row" is what single-flight means.
    """

    class Outcome(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        RETRYING = "retrying"  # this attempt failed and published a retry

    job = models.CharField(max_length=50)
    lock_name = models.CharField(max_length=200)
    task_id = models.CharField(max_length=50, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    pid = models.PositiveIntegerField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.RUNNING)
    fencing_token = models.PositiveBigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"{self.job} {self.lock_name} ({self.outcome})"

    def finish(self, outcome: str = Outcome.DONE) -> None:
        self.outcome = outcome
        self.finished_at = timezone.now()
        self.save(update_fields=["outcome", "finished_at"])
