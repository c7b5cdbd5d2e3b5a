"""The distributions ship everything the package needs, and the wheel works once installed.

``python -m build`` makes the sdist and, from it, the wheel (so a file missing from MANIFEST.in
is missing from the wheel too). The wheel is then installed, not editable, into a fresh venv
outside the repository, and a small Django project there takes and releases a lock on the
suite's real Redis, runs the system checks and migrations, and renders every packaged template.
"""

from __future__ import annotations

import json
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

import django_redislock
from tests.venvs import copy_checkout, fresh_venv, outside_env, pip_install, run

# Builds distributions, installs into fresh venvs: `make test-packaging`, a CI step of its own.
pytestmark = [pytest.mark.slow, pytest.mark.packaging]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_redislock"


def package_files() -> set[str]:
    """Every file of the package in the work tree, as ``django_redislock/...`` paths."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_version_comes_from_the_package(dists: dict[str, Path]) -> None:
    version = django_redislock.__version__
    assert dists["wheel"].name.startswith(f"django_redislock-{version}-")
    assert dists["sdist"].name == f"django_redislock-{version}.tar.gz"


def test_wheel_contains_every_package_file(dists: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = package_files() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for data in ("lua/", "templates/", "migrations/"):
        assert any(n.startswith(f"django_redislock/{data}") for n in names), data
    assert "django_redislock/py.typed" in names
    if (PACKAGE / "locale").is_dir():
        assert any(n.startswith("django_redislock/locale/") and n.endswith(".mo") for n in names)
    stray = sorted(
        n for n in names if n.split("/")[0] in {"tests", "example_project", "benchmarks"}
    )
    assert not stray, f"not part of the package: {stray}"


def test_sdist_contains_package_docs_and_changelog(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        top = tar.getnames()[0].split("/")[0]
        names = {n.removeprefix(f"{top}/") for n in tar.getnames()}
    missing = package_files() - names
    assert not missing, f"not in the sdist: {sorted(missing)}"
    assert {"CHANGELOG.md", "LICENSE", "setup.cfg", "pyproject.toml"} <= names
    if (ROOT / "README.md").exists():
        assert "README.md" in names


SMOKE_SETTINGS = """
import os

SECRET_KEY = "packaging-smoke"
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
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "smoke.sqlite3"}}
CACHES = {"default": {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": os.environ["SMOKE_REDIS_LOCATION"],
}}
REDISLOCK = {"KEY_PREFIX": "packaging-smoke", "TIMEOUT": 5.0}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""

SMOKE_SCRIPT = """
import io
import json
from pathlib import Path

import django

django.setup()

import django_redislock
from django.core.management import call_command
from django.template.loader import get_template
from django_redislock import Lock, list_locks

call_command("check", fail_level="ERROR")
call_command("migrate", verbosity=0)
root = Path(django_redislock.__file__).parent
templates = sorted(p.relative_to(root / "templates").as_posix()
                   for p in (root / "templates").rglob("*.html"))
for name in templates:
    get_template(name)
lock = Lock("packaging-smoke")
assert lock.acquire(blocking=False)
token = lock.fencing_token
listed = [info.name for info in list_locks()]
out = io.StringIO()
call_command("redislock", "list", "--json", stdout=out)
lock.release()
print(json.dumps({
    "file": django_redislock.__file__,
    "version": django_redislock.__version__,
    "token": token,
    "listed": listed,
    "command": out.getvalue(),
    "locked_after_release": lock.locked(),
    "lua": sorted(p.name for p in (root / "lua").glob("*.lua")),
    "templates": templates,
}))
"""


def test_installed_wheel_takes_a_lock_outside_the_repository(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    venv_dir = tmp_path / "venv"
    python = fresh_venv(venv_dir)
    # The smoke project's cache is django-redis: the extra that brings it.
    pip_install(python, f"{dists['wheel']}[django-redis]")

    project = tmp_path / "project"
    project.mkdir()
    (project / "smoke_settings.py").write_text(textwrap.dedent(SMOKE_SETTINGS))
    (project / "smoke.py").write_text(textwrap.dedent(SMOKE_SCRIPT))
    env = outside_env(
        DJANGO_SETTINGS_MODULE="smoke_settings",
        SMOKE_REDIS_LOCATION=settings.CACHES["default"]["LOCATION"],
    )
    proc = run([str(python), "smoke.py"], cwd=project, env=env, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    installed = Path(result["file"]).resolve()
    assert venv_dir.resolve() in installed.parents, f"imported from {installed}, not the venv"
    assert result["version"] == django_redislock.__version__
    assert isinstance(result["token"], int) and result["token"] >= 1
    assert "packaging-smoke" in result["listed"]
    assert "packaging-smoke" in result["command"]
    assert result["locked_after_release"] is False
    assert {p.name for p in (PACKAGE / "lua").glob("*.lua")} == set(result["lua"])
    assert result["templates"], "no templates were installed"


def test_wheel_metadata_license_extras_and_platforms(dists: dict[str, Path]) -> None:
    """What pip and PyPI read: SPDX license, the license file, user extras only, POSIX."""
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = whl.read(meta_name).decode()
    headers = meta.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: BSD-3-Clause" in headers
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [h for h in headers if h.startswith("Classifier: License ::")]
    assert "Classifier: Operating System :: OS Independent" not in headers
    assert "Classifier: Operating System :: POSIX :: Linux" in headers
    extras = {h.split(": ", 1)[1] for h in headers if h.startswith("Provides-Extra: ")}
    assert extras == {"celery", "django-redis", "otel", "prometheus", "tasks"}, extras
    requires = [h.split(": ", 1)[1] for h in headers if h.startswith("Requires-Dist: ")]
    unconditional = {r.split(">")[0].split("[")[0].lower() for r in requires if ";" not in r}
    assert unconditional == {"django", "redis"}, requires  # django-redis is optional
    assert any(r.startswith("celery[redis]") and 'extra == "celery"' in r for r in requires)


def test_build_prints_no_setuptools_warnings(tmp_path: Path) -> None:
    """Ignored data packages and deprecated license classifiers were warned about at every build."""
    proc = run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--wheel",
            "--outdir",
            str(tmp_path),
            str(copy_checkout(tmp_path / "checkout")),
        ],
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    for warning in (
        "SetuptoolsDeprecationWarning",
        "is absent from the `packages`",
        "License classifiers are deprecated",
    ):
        assert warning not in output, output
