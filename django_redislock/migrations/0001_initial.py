"""The admin's ``Lock`` stand-in: unmanaged (no table), it only carries the permissions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Lock",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=1024, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
            ],
            options={
                "verbose_name": "lock",
                "verbose_name_plural": "locks",
                "permissions": [("force_release_lock", "Can force-release locks")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
