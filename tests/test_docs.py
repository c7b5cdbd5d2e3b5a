"""The README, the documentation site and CONTRIBUTING.md say what the repository does.

Each test checks one promise the docs make against the file that keeps it: the README's two
commands are on its first screen and are what CI runs, every extra is documented, install lines
that need a PyPI release say so, the CI stages CONTRIBUTING.md lists are the Makefile's, the
tests the Guarantees page cites exist, and the site builds strictly (``make docs-check`` is the CI
step; the slow test here runs the same build).
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_install import readme_install_blocks
from tests.venvs import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
FIRST_SCREEN = 40  # lines


def readme_lines() -> list[str]:
    return README.read_text().splitlines()


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_the_readme_stays_short() -> None:
    assert len(readme_lines()) <= 300


def test_the_readme_shows_the_demo_and_the_tests_on_its_first_screen() -> None:
    first = "\n".join(readme_lines()[:FIRST_SCREEN])
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert "make demo" in commands
    assert "make test" in commands
    assert "pip install /path/to/django-redislock" in first  # and how to install it


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b.*# the README's test command", ci_run, re.M), ci_run
    assert "make test" in "\n".join(readme_lines()[:FIRST_SCREEN])


def test_the_install_blocks_the_install_test_runs_are_in_the_readme() -> None:
    checkout, wheel = readme_install_blocks()
    assert any("[celery]" in line for line in checkout)
    assert any("[django-redis]" in line for line in checkout)
    assert any("python -m build" in line for line in wheel)


def package_extras() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return list(config["options.extras_require"])


@pytest.mark.parametrize("page", [README, DOCS / "install.md"], ids=lambda p: p.name)
def test_every_extra_is_a_row_of_the_extras_table(page: Path) -> None:
    rows = re.findall(r"^\| `([\w-]+)` \|", page.read_text(), re.M)
    assert set(package_extras()) <= set(rows), (package_extras(), rows)


def test_every_install_from_pypi_says_it_needs_the_first_release() -> None:
    pypi_install = re.compile(r"pip install '?django-redislock\b")
    unmarked = []
    for page in [README, *doc_pages()]:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            context = " ".join(lines[max(0, number - 3) : number + 1]).lower()
            if pypi_install.search(line) and "first release" not in context:
                unmarked.append(f"{page.relative_to(ROOT)}:{number + 1}: {line}")
    assert not unmarked, "\n".join(unmarked)


def make_recipe(target: str) -> list[str]:
    """The ``$(MAKE) X`` steps of one Makefile target, in order."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert match, f"no {target} target"
    return re.findall(r"\$\(MAKE\) ([\w-]+)", match.group(1))


def test_contributing_lists_the_ci_stages_of_the_makefile() -> None:
    ci = make_recipe("ci")
    assert ci[-1] == "ci-beyond"
    stages = [*ci[:-1], *make_recipe("ci-beyond")]
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.findall(r"^(?:exec )?make ([\w-]+)", ci_run, re.M) == ci  # .ci/run = make ci
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    listed = re.findall(r"^\d+\. `([\w-]+)[^`]*`", contributing, re.M)
    assert listed == stages


CITED_TEST = re.compile(r"`((?:faults/)?test_\w+\.py)?(?:::)?(test_\w+)?(\*)?`")


def test_every_test_the_guarantees_page_cites_exists() -> None:
    tests = ROOT / "tests"
    everything = "\n".join(path.read_text() for path in tests.rglob("test_*.py"))
    missing = []
    for path, name, star in CITED_TEST.findall((DOCS / "guarantees.md").read_text()):
        if not path and not name:
            continue
        source = (tests / path).read_text() if path and (tests / path).exists() else None
        if path and source is None:
            missing.append(path)
            continue
        if name:
            end = "" if star else r"\("  # `name*`: a prefix; `name`: the whole name
            pattern = rf"^\s*(?:async )?def {name}{end}"
            if not re.search(pattern, source or everything, re.M):
                missing.append(f"{path}::{name}{star}")
    assert not missing, missing


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize(
    "page",
    [README, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_links_of_the_files_outside_the_site_resolve(page: Path) -> None:
    # The site's own links are checked by its strict build; these files are read on a forge.
    text = page.read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).exists() if path else anchor in anchors
        if not found:
            broken.append(target)
    assert not broken, broken


PRIVATE_MODULES = ("engine", "connection", "holds", "wakeups", "watchdog", "scripts")


def test_the_docs_site_names_no_private_engine_module() -> None:
    # Their names are free to change; the module map of CONTRIBUTING.md is the one place for them.
    private = re.compile(rf"django_redislock[./](?:{'|'.join(PRIVATE_MODULES)})\b")
    named = [
        f"{page.relative_to(ROOT)}: {match.group(0)}"
        for page in doc_pages()
        for match in private.finditer(page.read_text())
    ]
    assert not named, named


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the docs group needs Python >= 3.11")
def test_the_docs_build_strictly_without_a_warning(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "api" / "index.html").exists()
