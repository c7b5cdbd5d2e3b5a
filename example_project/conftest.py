"""The demo's tests use django-redislock's pytest plugin: the ``redislock`` fixture puts the
locks on a private ``redis-server`` for the test (see the README, "Testing your code that uses
locks")."""

pytest_plugins = ["django_redislock.testing.pytest_plugin"]
