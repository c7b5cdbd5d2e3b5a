"""Create (or reset) the demo's superuser and print its credentials."""

from __future__ import annotations

import json
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or reset the demo superuser (DEMO_ADMIN_USER / DEMO_ADMIN_PASSWORD)."

    def handle(self, *args: Any, **options: Any) -> None:
        # A local-only demo account on 127.0.0.1; the password is printed on purpose.
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "redislock-demo")
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(json.dumps({"username": username, "password": password}))
