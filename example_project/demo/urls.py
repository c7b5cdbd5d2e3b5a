from django.contrib import admin
from django.urls import path

from reports import views

urlpatterns = [
    path("", views.index, name="index"),
    path("enqueue/report/", views.enqueue_report, name="enqueue-report"),
    path("enqueue/invoice/", views.enqueue_invoice, name="enqueue-invoice"),
    path("enqueue/import/", views.enqueue_import, name="enqueue-import"),
    path("status.json", views.status, name="status"),
    path("counter/<slug:name>/", views.counter, name="counter"),
    path("admin/", admin.site.urls),
]
