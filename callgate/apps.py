from django.apps import AppConfig


class CallgateConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "callgate"
    verbose_name = "callgate"

    def ready(self) -> None:
        from callgate.metrics import register_collectors

        register_collectors()
