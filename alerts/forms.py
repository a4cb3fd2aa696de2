from __future__ import annotations

from django import forms

from alerts.models import AlertRule
from callgate.outbound import url_refusal
from callgate.taxonomy import Category, Reason


class AlertRuleForm(forms.ModelForm):
    """A rule as a manager edits it. The target must fit the metric; a blank
    ``clear_threshold`` becomes 80 % of the threshold (the hysteresis band)."""

    webhook_url = forms.URLField(required=False, assume_scheme="https", label="Webhook URL")

    class Meta:
        model = AlertRule
        fields = [
            "name",
            "metric",
            "target",
            "tool",
            "agent",
            "window_minutes",
            "threshold",
            "clear_threshold",
            "min_calls",
            "enabled",
            "webhook_url",
            "webhook_format",
            "webhook_secret",
            "emails",
        ]
        help_texts = {
            "threshold": "A share as 0..1 (0.2 = 20 %), a number of calls, or seconds.",
            "clear_threshold": "Resolve below this; blank: 80 % of the threshold.",
        }

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["agent"].queryset = project.agents.order_by("name")
        self.fields["agent"].required = False
        self.fields["agent"].empty_label = "All agents"
        self.fields["metric"].choices = [("", "Pick a metric")] + [
            c for c in self.fields["metric"].choices if c[0]
        ]
        self.fields["clear_threshold"].required = False
        target_choices = [("", "—")]
        target_choices += [(c.value, f"Category: {c.label}") for c in Category]
        target_choices += [(r.value, f"Reason: {r.label}") for r in Reason]
        self.fields["target"] = forms.ChoiceField(
            choices=target_choices, required=False, label="Category or reason"
        )

    def clean_webhook_url(self) -> str:
        """The webhook URL, refused (beside the field) when the outbound guard would refuse
        to post there (``callgate.outbound.url_refusal``: loopback, private, metadata …)."""
        url = self.cleaned_data["webhook_url"]
        if url and (refusal := url_refusal(url)):
            raise forms.ValidationError(f"callgate may not post to this address: {refusal}")
        return url

    def clean(self):
        data = super().clean()
        metric, target = data.get("metric"), data.get("target") or ""
        threshold = data.get("threshold")
        if metric in ("category_rate", "category_count") and target not in Category.values:
            self.add_error("target", "Pick a category for this metric.")
        if metric in ("reason_rate", "reason_count") and target not in Reason.values:
            self.add_error("target", "Pick a reason for this metric.")
        if metric in ("review_age", "inbox_lag"):
            data["target"] = ""
        if threshold is not None:
            if threshold < 0:
                self.add_error("threshold", "Must be 0 or more.")
            if metric in ("category_rate", "reason_rate") and threshold > 1:
                self.add_error("threshold", "A share is between 0 and 1 (0.2 = 20 %).")
            clear = data.get("clear_threshold")
            if clear is None:
                data["clear_threshold"] = threshold * 0.8
            elif clear > threshold:
                self.add_error("clear_threshold", "Must not exceed the threshold.")
        if (
            data.get("webhook_format") == "callgate"
            and data.get("webhook_url")
            and not data.get("webhook_secret")
        ):
            self.add_error("webhook_secret", "The signed format needs a secret.")
        return data
