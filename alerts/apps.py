from django.apps import AppConfig


class AlertsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        """Put the count of firing alerts nobody handled beside "Alerts" in the navigation
        (operators and above)."""
        from alerts.selectors import firing_unhandled_count
        from callgate.access import Role
        from callgate.context_processors import NAV_COUNTS

        NAV_COUNTS["alerts"] = (Role.OPERATOR, firing_unhandled_count)
