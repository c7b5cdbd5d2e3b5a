"""Fresh virtualenvs and built distributions for the install tests (tests/test_install.py,
tests/test_packaging.py): what a user gets from ``pip install``, outside this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Never copied into a "checkout": local state, not part of the repository.
_NOT_IN_A_CHECKOUT = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tox",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "test-artifacts",
    "var",
    "*.sqlite3",
)


def run(
    args: list[str],
    *,
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command and fail the test with its output unless it exits 0."""
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def outside_env(**extra: str) -> dict[str, str]:
    """This process's environment minus what points Python at the suite or at our venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "DJANGO", "VIRTUAL_ENV", "MAKE", "MFLAGS"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def build_dists(outdir: Path) -> dict[str, Path]:
    """``python -m build`` of this checkout: the sdist, and the wheel built *from the sdist*
    (so a file missing from MANIFEST.in is missing from the wheel too)."""
    # Run from outdir: the repository's own build/ folder would shadow the `build` package.
    probe = subprocess.run(
        [sys.executable, "-m", "build", "--version"], cwd=outdir, capture_output=True, check=False
    )
    assert probe.returncode == 0, "`build` is missing: it belongs in the `test` dependency group"
    run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(ROOT)],
        cwd=outdir,
    )
    wheels = list(outdir.glob("*.whl"))
    sdists = list(outdir.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in outdir.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def fresh_venv(path: Path, *, with_pip: bool = False) -> Path:
    """A new venv at ``path``; returns its python.

    Without pip (fast), install into it with :func:`pip_install`; with pip when the test runs
    ``pip`` itself, as a user does in an activated venv.
    """
    args = [sys.executable, "-m", "venv", str(path)]
    if not with_pip:
        args.insert(3, "--without-pip")
    run(args, timeout=120)
    return path / "bin" / "python"


def pip_install(python: Path, *requirements: str) -> None:
    """Install into another venv with this process's pip (``pip --python``); deps from the index."""
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *requirements],
        timeout=600,
    )


def copy_checkout(dest: Path) -> Path:
    """A copy of this checkout's files (no venvs, caches or build output), as a clone would be.

    Install commands that build in place (``pip install <dir>``, ``python -m build``) then write
    into the copy, never into the repository the suite runs from.
    """
    shutil.copytree(ROOT, dest, ignore=_NOT_IN_A_CHECKOUT)
    return dest
