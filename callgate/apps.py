from django.apps import AppConfig


class CallgateConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "callgate"
    verbose_name = "callgate"

    def ready(self) -> None:
        # Configure the Celery app before any task is sent, so ``shared_task``s use it (and its
        # broker) rather than Celery's default app.
        from callgate import celery, signals  # noqa: F401
        from callgate.prometheus import register_collectors

        register_collectors()
