"""django-redislock: correct, fast, observable distributed locks on Redis for Django and Celery."""

from django_redislock.aio import AsyncLock
from django_redislock.decorators import distributed_lock
from django_redislock.exceptions import (
    LockBackendError,
    LockError,
    LockLostError,
    LockNotAcquiredError,
    LockNotOwnedError,
    LockOutcomeUnknown,
    RateLimited,
)
from django_redislock.latch import (
    AsyncBarrier,
    AsyncCountDownLatch,
    Barrier,
    BrokenBarrierError,
    CountDownLatch,
)
from django_redislock.leader import LeaderElection
from django_redislock.lock import Lock
from django_redislock.multilock import MultiLock
from django_redislock.operations import LockInfo, force_release, get_lock_info, list_locks
from django_redislock.ratelimit import AsyncRateLimiter, RateDecision, RateLimiter
from django_redislock.rwlock import AsyncReadWriteLock, ReadWriteLock
from django_redislock.semaphore import AsyncSemaphore, Semaphore

__version__ = "0.1.0"

__all__ = [
    "AsyncBarrier",
    "AsyncCountDownLatch",
    "AsyncLock",
    "AsyncRateLimiter",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "Barrier",
    "BrokenBarrierError",
    "CountDownLatch",
    "LeaderElection",
    "Lock",
    "LockBackendError",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotAcquiredError",
    "LockNotOwnedError",
    "LockOutcomeUnknown",
    "MultiLock",
    "RateDecision",
    "RateLimited",
    "RateLimiter",
    "ReadWriteLock",
    "Semaphore",
    "distributed_lock",
    "force_release",
    "get_lock_info",
    "list_locks",
]
