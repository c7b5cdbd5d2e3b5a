"""MkDocs hook of the documentation build (mkdocs.yml ``hooks:``); not a page.

The package's docstrings name other objects with Sphinx roles (``:class:`LockError```). Rendered
as Markdown, a role's prefix would show as text before the code span (":class:LockError"); this
drops the prefix and keeps the code span.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj|ref):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub("", html)
