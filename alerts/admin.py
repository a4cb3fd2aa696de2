from django.contrib import admin

from alerts.models import AlertDelivery, AlertEvent, AlertRule

admin.site.register(AlertRule)
admin.site.register(AlertEvent)
admin.site.register(AlertDelivery)
