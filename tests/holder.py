"""A lock holder in its own process: ``python -m tests.holder NAME [--hold S] [--timeout T]``
(``--side read|write``: a side of ``ReadWriteLock(NAME)`` instead).

Prints one JSON line once the lock is held (``{"token": N, "pid": P}``), holds it for ``--hold``
seconds (default: until killed), releases it and prints ``{"released": true, "lost": bool}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--hold", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--using", default=None)
    parser.add_argument("--no-renew", action="store_true")
    parser.add_argument("--side", choices=["read", "write"], default=None)
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django_redislock import Lock, ReadWriteLock

    renew = False if opts.no_renew else None
    lock: Lock | Any
    if opts.side is None:
        lock = Lock(opts.name, timeout=opts.timeout, using=opts.using, auto_renew=renew)
    else:
        rw = ReadWriteLock(opts.name, timeout=opts.timeout, using=opts.using)
        side = rw.read_lock if opts.side == "read" else rw.write_lock
        lock = side(auto_renew=renew)
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
