"""A small Celery project for the beat and ``redislock run`` subprocess tests.

``settings`` extends ``tests.settings``: the locks may live on a Redis of their own
(``REDISLOCK_TEST_LOCK_REDIS_URL``, so a test can stop it while the broker stays up) and
``REDISLOCK_TEST_DJANGO_CELERY_BEAT=1`` installs django-celery-beat on a file database
(``REDISLOCK_TEST_DB``). ``celery_app`` takes its beat schedule from the environment and records
every message a beat publishes in the suite's Redis, so tests can check who sent what and when.
"""
