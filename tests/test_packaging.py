"""The distributions ship everything the package needs, and the wheel works once installed.

``python -m build`` makes the sdist and, from it, the wheel (so a file missing from MANIFEST.in
is missing from the wheel too). The wheel is then installed, not editable, into a fresh venv
outside the repository, and a small Django project there takes and releases a lock on the
suite's real Redis, runs the system checks and migrations, and renders every packaged template.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

import django_redislock

pytestmark = pytest.mark.slow  # builds distributions, installs into fresh venvs

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_redislock"


def package_files() -> set[str]:
    """Every file of the package in the work tree, as ``django_redislock/...`` paths."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def run(
    args: list[str],
    *,
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # Run from a temporary folder: the repository's own build/ folder would shadow `build`.
    probe = subprocess.run(
        [sys.executable, "-m", "build", "--version"], cwd=out, capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.fail("`build` is not installed: it belongs in the `test` extra (setup.cfg)")
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], cwd=out)
    wheels = list(out.glob("*.whl"))
    sdists = list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


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
    assert {"CHANGELOG.md", "setup.cfg", "pyproject.toml"} <= names
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
    run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)])
    python = venv_dir / "bin" / "python"
    # The repository's pip installs into the new venv (no ensurepip); deps come from the index.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            str(dists["wheel"]),
        ],
        timeout=600,
    )

    project = tmp_path / "project"
    project.mkdir()
    (project / "smoke_settings.py").write_text(textwrap.dedent(SMOKE_SETTINGS))
    (project / "smoke.py").write_text(textwrap.dedent(SMOKE_SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DJANGO"))}
    env["DJANGO_SETTINGS_MODULE"] = "smoke_settings"
    env["SMOKE_REDIS_LOCATION"] = settings.CACHES["default"]["LOCATION"]
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
