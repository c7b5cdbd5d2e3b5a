"""URLconf with a second, custom ``AdminSite`` hosting the Locks pages (tests/test_admin.py)."""

from django.contrib import admin
from django.urls import path

from django_redislock.admin import register


class OpsAdminSite(admin.AdminSite):
    site_header = "Ops console"


ops_site = OpsAdminSite(name="ops")
register(ops_site)

urlpatterns = [path("admin/", admin.site.urls), path("ops/", ops_site.urls)]
