"""Installing the package the way the README says, and running what a user runs next.

- The README's install commands are read out of its "Install" section and run, line by line, in
  a fresh venv against a copy of this checkout (the test breaks when the README changes them);
  then ``manage.py check`` and a lock taken and released in a tiny project on the suite's Redis.
- ``pip install '<wheel>[celery]'`` alone is enough for a real ``celery worker`` with a Redis
  broker to run a ``SingleFlightTask`` — on Django's own RedisCache, without django-redis.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.venvs import ROOT, copy_checkout, fresh_venv, outside_env, pip_install, run

# Fresh venvs, source builds, a Celery worker: `make test-packaging`, a CI step of its own.
pytestmark = [pytest.mark.slow, pytest.mark.packaging]

PLACEHOLDER = "/path/to/django-redislock"


def markdown_section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section, up to the next heading of level 1 or 2."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} )", text, re.M | re.S)
    assert match, f"README has no '## {heading}' section"
    return match.group(1)


def bash_blocks(section: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)


def commands(block: str) -> list[str]:
    """The block's command lines, trailing ``# comments`` and blank lines dropped."""
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_install_blocks() -> list[list[str]]:
    """The README's install-from-a-checkout and install-a-built-wheel blocks, as commands."""
    readme = (ROOT / "README.md").read_text()
    blocks = [commands(b) for b in bash_blocks(markdown_section(readme, "Install"))]
    local = [b for b in blocks if any(PLACEHOLDER in line for line in b)]
    assert len(local) == 2, f"expected a checkout block and a wheel block, got {local}"
    quickstart = [
        c for b in bash_blocks(markdown_section(readme, "Quickstart")) for c in commands(b)
    ]
    quick_pip = [c for c in quickstart if c.startswith("pip install")]
    assert quick_pip, "the Quickstart installs nothing"
    for line in quick_pip:  # the Quickstart's install line is one of the tested ones
        assert line in local[0], f"Quickstart line {line!r} is not in the Install section"
    return local


PROJECT_SETTINGS = """
import os

SECRET_KEY = "readme-install"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_redislock",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# As in the README's Quickstart: a dedicated alias for locks, Django's own RedisCache.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "locks": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ["PROJECT_LOCK_REDIS"],
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 5},
    },
}
REDISLOCK = {"CACHE": "locks", "KEY_PREFIX": os.environ["PROJECT_KEY_PREFIX"], "TIMEOUT": 10.0}
"""

MANAGE_PY = """
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project_settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""

TAKE_A_LOCK = """
import io, json
from django.core.management import call_command
from django_redislock import Lock, list_locks

lock = Lock("readme:smoke")
assert lock.acquire(blocking=False)
out = io.StringIO()
call_command("redislock", "list", "--json", stdout=out)
listed = [json.loads(line)["name"] for line in out.getvalue().splitlines()]
token = lock.fencing_token
lock.release()
print(json.dumps({"listed": listed, "token": token, "after": lock.locked(),
                  "file": __import__("django_redislock").__file__}))
"""


def follow(block: list[str], workdir: Path, checkout: Path) -> Path:
    """Run one README block in a fresh, activated venv; return the venv's python."""
    venv = workdir / "venv"
    python = fresh_venv(venv, with_pip=True)
    # Activated: `pip` and `python` in the README lines are the venv's.
    env = outside_env(VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    script = "\n".join(["set -euxo pipefail", f"cd {workdir}", *block])
    run(["bash", "-c", script.replace(PLACEHOLDER, str(checkout))], env=env, timeout=600)
    return python


def installed(python: Path) -> set[str]:
    listed = run([str(python), "-m", "pip", "list", "--format", "json"]).stdout
    return {p["name"].lower() for p in json.loads(listed)}


def take_a_lock(python: Path, project: Path) -> dict[str, object]:
    """``manage.py check``, ``migrate`` and a lock taken and released, in a tiny project."""
    project.mkdir()
    (project / "project_settings.py").write_text(textwrap.dedent(PROJECT_SETTINGS))
    (project / "manage.py").write_text(textwrap.dedent(MANAGE_PY))
    env = outside_env(
        PROJECT_LOCK_REDIS=settings.CACHES["default"]["LOCATION"],
        PROJECT_KEY_PREFIX=f"readme-install-{project.parent.name}",
    )
    manage = [str(python), "manage.py"]
    checked = run([*manage, "check", "--fail-level", "WARNING"], cwd=project, env=env)
    assert "no issues" in checked.stdout, checked.stdout + checked.stderr
    run([*manage, "migrate", "--verbosity", "0"], cwd=project, env=env)
    shell = run([*manage, "shell", "-c", TAKE_A_LOCK], cwd=project, env=env, timeout=120)
    result: dict[str, object] = json.loads(shell.stdout.strip().splitlines()[-1])
    return result


def test_readme_install_lines_work_in_a_fresh_venv(tmp_path: Path) -> None:
    checkout_block, wheel_block = readme_install_blocks()
    checkout = copy_checkout(tmp_path / "django-redislock")
    for name, block, extras in (
        ("checkout", checkout_block, {"celery", "django-redis"}),
        ("wheel", wheel_block, set()),
    ):
        workdir = tmp_path / name
        workdir.mkdir()
        python = follow(block, workdir, checkout)
        names = installed(python)
        assert {"django-redislock", *extras} <= names, f"{name}: {sorted(names)}"
        result = take_a_lock(python, workdir / "project")
        venv = (workdir / "venv").resolve()
        assert venv in Path(str(result["file"])).resolve().parents, result["file"]
        assert result["listed"] == ["readme:smoke"], result
        assert isinstance(result["token"], int) and result["token"] >= 1
        assert result["after"] is False
    assert list((checkout / "dist").glob("django_redislock-*.whl")), "the wheel block built none"


CELERY_SETTINGS = """
import os

SECRET_KEY = "celery-install"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_redislock", "jobs"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "locks": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ["PROJECT_REDIS"] + "/4",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 5},
    },
}
REDISLOCK = {"CACHE": "locks", "TIMEOUT": 10.0}
CELERY_BROKER_URL = os.environ["PROJECT_REDIS"] + "/5"
CELERY_RESULT_BACKEND = os.environ["PROJECT_REDIS"] + "/6"
CELERY_TASK_DEFAULT_QUEUE = "install-test"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
"""

CELERY_APP = """
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""

JOBS_TASKS = """
import os
import time

import redis
from celery import shared_task
from django.conf import settings

from django_redislock.celery import SingleFlightTask


@shared_task(base=SingleFlightTask, lock_key="job:{n}", lock_timeout=10)
def job(n):
    marks = redis.Redis.from_url(settings.CACHES["locks"]["LOCATION"])
    marks.rpush(f"install-test:runs:{n}", os.getpid())
    time.sleep(1)
    return n * 2
"""

CELERY_CLIENT = """
import importlib.util
import json
import time

import django

django.setup()

from django_redislock import Lock
from jobs.tasks import job
from proj.celery import app

deadline = time.monotonic() + 60
while not app.control.ping(timeout=0.5):
    assert time.monotonic() < deadline, "the worker never answered a ping"
first = job.delay(21)
second = job.delay(21)  # queued or running: publishes nothing, returns the first
result = first.get(timeout=60)
deadline = time.monotonic() + 10
while Lock("job:21").locked() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({
    "first": first.id,
    "second": second.id,
    "result": result,
    "locked_after": Lock("job:21").locked(),
    "django_redis": importlib.util.find_spec("django_redis") is not None,
}))
"""


@pytest.fixture
def celery_dbs() -> Iterator[str]:
    """Databases 4-6 of the suite's Redis (locks, broker, results), empty before and after."""
    base = settings.CACHES["default"]["LOCATION"].rsplit("/", 1)[0]
    clients = [redis.Redis.from_url(f"{base}/{db}") for db in (4, 5, 6)]
    for client in clients:
        client.flushdb()
    yield base
    for client in clients:
        client.flushdb()
        client.close()


def test_wheel_with_the_celery_extra_runs_a_single_flight_task_in_a_real_worker(
    dists: dict[str, Path], tmp_path: Path, celery_dbs: str
) -> None:
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    pip_install(python, f"{dists['wheel']}[celery]")  # what the README says a worker needs

    project = tmp_path / "project"
    for folder in ("proj", "jobs"):
        (project / folder).mkdir(parents=True)
    (project / "proj" / "__init__.py").write_text("from .celery import app as celery_app\n")
    (project / "proj" / "celery.py").write_text(textwrap.dedent(CELERY_APP))
    (project / "proj" / "settings.py").write_text(textwrap.dedent(CELERY_SETTINGS))
    (project / "jobs" / "__init__.py").write_text("")
    (project / "jobs" / "tasks.py").write_text(textwrap.dedent(JOBS_TASKS))
    (project / "client.py").write_text(textwrap.dedent(CELERY_CLIENT))
    env = outside_env(DJANGO_SETTINGS_MODULE="proj.settings", PROJECT_REDIS=celery_dbs)

    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [str(python), "-m", "celery", "-A", "proj", "worker", "-P", "prefork", "-c", "1",
         "--without-mingle", "--without-gossip", "-n", "install-test@%h", "-l", "info"],
        cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = run([str(python), "client.py"], cwd=project, env=env, timeout=120)
    except AssertionError:
        raise AssertionError((tmp_path / "worker.log").read_text()[-5000:]) from None
    finally:
        worker.send_signal(signal.SIGTERM)  # warm shutdown, by PID
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
        log.close()

    result = json.loads(client.stdout.strip().splitlines()[-1])
    assert result["second"] == result["first"], "the duplicate published a second task"
    assert result["result"] == 42
    assert result["locked_after"] is False
    assert result["django_redis"] is False, "django-redis is optional: the extra must not need it"
    runs = redis.Redis.from_url(f"{celery_dbs}/4").lrange("install-test:runs:21", 0, -1)
    assert len(runs) == 1, f"the body ran {len(runs)} times"
    output = (tmp_path / "worker.log").read_text()
    assert "install-test@" in output and "ready" in output, output[-3000:]
    assert worker.returncode == 0, output[-3000:]
