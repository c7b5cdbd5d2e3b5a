"""ASGI entry point of the demo: ``uvicorn demo.asgi:application`` (what ``make demo`` runs).

One server for every page: async views (``reports.views.counter``, under ``AsyncLock``) run on
uvicorn's event loop, sync views and the admin in Django's threads. With ``DEBUG`` the static files
(the admin's CSS) are served as ``runserver`` would serve them.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo.settings")
application = get_asgi_application()
if settings.DEBUG:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)
