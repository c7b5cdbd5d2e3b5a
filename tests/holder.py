"""A lock holder in its own process: ``python -m tests.holder NAME [--hold S] [--timeout T]``.

Prints one JSON line once the lock is held (``{"token": N, "pid": P}``), holds it for ``--hold``
seconds (default: until killed), releases it and prints ``{"released": true, "lost": bool}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--hold", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--using", default=None)
    parser.add_argument("--no-renew", action="store_true")
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django_redislock import Lock

    lock = Lock(
        opts.name,
        timeout=opts.timeout,
        using=opts.using,
        auto_renew=False if opts.no_renew else None,
    )
    lock.acquire()
    print(json.dumps({"token": lock.fencing_token, "pid": os.getpid()}), flush=True)
    if opts.hold is None:
        while True:
            time.sleep(3600)
    time.sleep(opts.hold)
    lost = lock.lost
    if not lost:
        lock.release()
    print(json.dumps({"released": not lost, "lost": lost}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
