"""A lock holder in its own process: ``python -m tests.holder NAME... [--hold S] [--timeout T]``
(``--side read|write``: a side of ``ReadWriteLock(NAME)`` instead).

Prints one JSON line once the locks are held (``{"token": N, "pid": P}``, the first lock's
token), holds them for ``--hold`` seconds (``--until-input``: until a line or the end of stdin;
default: until killed), releases them and prints ``{"released": true, "lost": bool, "at": T}``
(``at``: the wall-clock time the releases began).
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
    parser.add_argument("names", nargs="+")
    parser.add_argument("--hold", type=float, default=None)
    parser.add_argument("--until-input", action="store_true")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--using", default=None)
    parser.add_argument("--no-renew", action="store_true")
    parser.add_argument("--side", choices=["read", "write"], default=None)
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django_redislock import Lock, ReadWriteLock

    renew = False if opts.no_renew else None
    locks: list[Lock | Any] = []
    for name in opts.names:
        lock: Lock | Any
        if opts.side is None:
            lock = Lock(name, timeout=opts.timeout, using=opts.using, auto_renew=renew)
        else:
            rw = ReadWriteLock(name, timeout=opts.timeout, using=opts.using)
            side = rw.read_lock if opts.side == "read" else rw.write_lock
            lock = side(auto_renew=renew)
        lock.acquire()
        locks.append(lock)
    print(json.dumps({"token": locks[0].fencing_token, "pid": os.getpid()}), flush=True)
    if opts.until_input:
        sys.stdin.readline()
    elif opts.hold is None:
        while True:
            time.sleep(3600)
    else:
        time.sleep(opts.hold)
    at = time.time()
    lost = any(lock.lost for lock in locks)
    for lock in locks:
        if not lock.lost:
            lock.release()
    print(json.dumps({"released": not lost, "lost": lost, "at": at}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
