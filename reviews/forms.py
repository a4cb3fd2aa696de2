"""Input parsing for the review pages (no logic: services validate and act)."""

from __future__ import annotations

from typing import cast

from django import forms
from django.core.validators import validate_email
from django.http import QueryDict

from callgate.outbound import url_refusal
from reviews.models import ProjectNotifications
from reviews.services import DECISIONS, MAX_EXTEND_SECONDS


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[(d, d) for d in DECISIONS])
    reason = forms.CharField(required=False, max_length=2000)
    preset = forms.CharField(required=False, max_length=500)
    override = forms.BooleanField(required=False)

    def reason_text(self) -> str:
        return (self.cleaned_data.get("reason") or "").strip() or (
            self.cleaned_data.get("preset") or ""
        ).strip()


class CommentForm(forms.Form):
    text = forms.CharField(max_length=5000)


class ExtendForm(forms.Form):
    seconds = forms.IntegerField(min_value=1, max_value=MAX_EXTEND_SECONDS)


class BulkForm(forms.Form):
    action = forms.ChoiceField(
        choices=[("reject", "Reject"), ("assign", "Assign"), ("claim", "Claim")]
    )
    all_matching = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=2000)
    preset = forms.CharField(required=False, max_length=500)
    assignee = forms.CharField(required=False, max_length=150)

    def ids(self) -> list[int]:
        """The explicitly selected item ids (``ids`` may repeat)."""
        posted = cast(QueryDict, self.data)  # the form is bound to request.POST
        return [int(v) for v in posted.getlist("ids") if str(v).isdigit()][:1000]

    def reason_text(self) -> str:
        return (self.cleaned_data.get("reason") or "").strip() or (
            self.cleaned_data.get("preset") or ""
        ).strip()


# --- notifications outside the dashboard --------------------------------------------------------


class ProjectNotificationsForm(forms.ModelForm):
    """A project's Slack incoming webhook and email addresses (managers)."""

    slack_webhook_url = forms.URLField(
        label="Slack incoming webhook URL",
        required=False,
        assume_scheme="https",
        help_text=ProjectNotifications._meta.get_field("slack_webhook_url").help_text,
    )

    class Meta:
        model = ProjectNotifications
        fields = ["slack_webhook_url", "emails"]
        labels = {"slack_webhook_url": "Slack incoming webhook URL", "emails": "Email addresses"}

    def clean_slack_webhook_url(self) -> str:
        url = self.cleaned_data["slack_webhook_url"]
        if url and (refusal := url_refusal(url)):
            raise forms.ValidationError(f"callgate may not post to this address: {refusal}")
        return url

    def clean_emails(self) -> str:
        addresses = [e.strip() for e in self.cleaned_data["emails"].split(",") if e.strip()]
        for address in addresses:
            try:
                validate_email(address)
            except forms.ValidationError:
                raise forms.ValidationError(f"{address!r} is not an email address.") from None
        return ", ".join(addresses)


class EmailDecisionForm(forms.Form):
    """The reason typed (or picked) on an email link's confirmation page."""

    reason = forms.CharField(required=False, max_length=2000)
    preset = forms.CharField(required=False, max_length=500)

    def reason_text(self) -> str:
        return (self.cleaned_data.get("reason") or "").strip() or (
            self.cleaned_data.get("preset") or ""
        ).strip()
