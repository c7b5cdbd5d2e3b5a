"""Contended lock traffic for the demo: bursts of concurrent POSTs to the async counter view.

``make demo`` runs it as its ``traffic`` process, so the admin's lock statistics have something
to show from the start: every burst makes requests queue for ``AsyncLock("counter:traffic")``
(waits), and the impatient ones (``?patience=``) sometimes give up (failed acquisitions).
Run by hand: ``python example_project/manage.py lock_traffic --url http://127.0.0.1:8000/``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from argparse import ArgumentParser
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Send bursts of concurrent requests to the AsyncLock counter view (lock statistics)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--url", default=None, help="the demo's base URL (default: http://127.0.0.1:PORT/)"
        )
        parser.add_argument("--name", default="traffic", help="counter (and lock) name")
        parser.add_argument("--every", type=float, default=2.0, help="seconds between bursts")
        parser.add_argument("--burst", type=int, default=6, help="concurrent requests per burst")
        parser.add_argument(
            "--patience",
            type=float,
            default=0.03,
            help="lock wait of every third request, seconds (the others wait up to 30 s)",
        )
        parser.add_argument(
            "--report-every", type=float, default=20.0, help="seconds between summary lines"
        )
        parser.add_argument("--bursts", type=int, default=0, help="stop after N bursts (0: never)")

    def handle(self, *args: Any, **options: Any) -> None:
        base = options["url"] or f"http://127.0.0.1:{settings.DEMO_PORT}/"
        url = f"{base.rstrip('/')}/counter/{options['name']}/"
        burst = max(1, options["burst"])
        patience = options["patience"]
        self.stdout.write(
            f"every {options['every']:g} s: {burst} concurrent POST {url} (AsyncLock "
            f"'counter:{options['name']}'; every third gives up after {patience:g} s)"
        )
        totals = {"ok": 0, "waited": 0, "busy": 0, "error": 0}
        value: int | None = None
        reported = time.monotonic()
        done = 0
        with ThreadPoolExecutor(burst) as pool:
            while not options["bursts"] or done < options["bursts"]:
                started = time.monotonic()
                patiences = [patience if i % 3 == 2 else None for i in range(burst)]
                for outcome, body in pool.map(lambda p: self._post(url, p), patiences):
                    totals[outcome] += 1
                    if outcome == "ok":
                        value = max(value or 0, int(body["value"]))
                        totals["waited"] += int(body["waited"] > 0.001)
                done += 1
                if time.monotonic() - reported >= options["report_every"]:
                    reported = time.monotonic()
                    self._report(totals, value)
                    totals = dict.fromkeys(totals, 0)
                time.sleep(max(0.0, options["every"] - (time.monotonic() - started)))
        self._report(totals, value)

    def _post(self, url: str, patience: float | None) -> tuple[str, Any]:
        query = f"?patience={patience:g}" if patience is not None else ""
        request = urllib.request.Request(url + query, data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=35) as response:
                return "ok", json.load(response)
        except urllib.error.HTTPError as exc:
            return ("busy" if exc.code == 409 else "error"), None
        except (urllib.error.URLError, OSError, ValueError):
            return "error", None  # the server is starting or stopping

    def _report(self, totals: dict[str, int], value: int | None) -> None:
        if not any(totals.values()):
            return
        line = (
            f"{totals['ok']} increments ({totals['waited']} waited for the lock), "
            f"{totals['busy']} gave up (lock busy)"
        )
        if totals["error"]:
            line += f", {totals['error']} failed requests"
        self.stdout.write(f"{line}; counter = {value}")
