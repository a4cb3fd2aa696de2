"""Input parsing for the review pages (no logic: services validate and act)."""

from __future__ import annotations

from typing import cast

from django import forms
from django.http import QueryDict

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
