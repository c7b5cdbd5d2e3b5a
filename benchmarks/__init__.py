"""Benchmarks of django-redislock against redis-py's ``Lock`` and python-redis-lock.

A package (not just a folder of scripts) so that spawned benchmark processes can import the
job functions by name (``benchmarks._contended.loop`` ...), whichever way the entry script was
started. The entry point is ``benchmarks/bench_locks.py``; ``README.md`` describes the method.
"""
