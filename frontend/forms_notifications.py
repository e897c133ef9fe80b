"""Forms of the webhook pages and the failure-email toggle (issue 19). They check shapes only;
the rules (the URL and the egress policy, the limits) are engine.notifications', whose
errors the views put on the field they name."""

from __future__ import annotations

from django import forms

from engine.models import NotificationType
from engine.notifications import MAX_DESCRIPTION_CHARS
from engine.webhooks import MAX_URL_CHARS

EVENT_CHOICES = [
    (NotificationType.RUN_FAILED.value, "run.failed — a run failed (a task failed, or it timed out)"),
    (NotificationType.TASK_FAILED.value, "task.failed — a task failed for good (no attempt left)"),
    (NotificationType.RUN_SUCCEEDED.value, "run.succeeded — a run finished, every task succeeded"),
    (NotificationType.RUN_CANCELLED.value, "run.cancelled — a run was cancelled"),
]
# How long a replaced secret keeps signing, offered in the rotate form (seconds).
GRACE_CHOICES = [(0, "No: stop signing with it now"), (3600, "For 1 hour"), (86400, "For 24 hours"),
                 (7 * 86400, "For 7 days")]


class WebhookForm(forms.Form):
    """Create or change a webhook endpoint."""

    url = forms.CharField(label="Endpoint URL", max_length=MAX_URL_CHARS, strip=False,
                          widget=forms.TextInput(attrs={"placeholder": "https://hooks.example.com/flowforge", "inputmode": "url",
                                                        "autocomplete": "off", "spellcheck": "false",
                                                        "class": "mono"}),
                          help_text="An http(s) URL on the internet. Internal, loopback and link-local addresses are "
                          "refused, now and at every delivery.")
    event_types = forms.MultipleChoiceField(label="Events", choices=EVENT_CHOICES,
                                            widget=forms.CheckboxSelectMultiple,
                                            initial=[NotificationType.RUN_FAILED.value])
    workflow_name = forms.CharField(label="Only runs of the workflow", max_length=200, required=False,
                                    help_text="The name of one of the organization's workflows (any version, "
                                    "archived ones included); leave empty for every workflow.")
    description = forms.CharField(max_length=MAX_DESCRIPTION_CHARS, required=False)
    enabled = forms.BooleanField(required=False, initial=True, help_text="A disabled endpoint gets no new "
                                 "deliveries; those pending wait until it is enabled again.")

    def clean_url(self) -> str:
        return self.cleaned_data["url"].strip()


class RotateSecretForm(forms.Form):
    """Rotate an endpoint's signing secret."""

    previous_valid_seconds = forms.TypedChoiceField(
        label="Keep signing with the current secret too?", choices=GRACE_CHOICES, coerce=int, initial=0,
        help_text="While it does, each delivery carries two signatures (two v1= in FlowForge-Signature), so your "
        "receiver can switch to the new secret without refusing one.")


class FailureEmailsForm(forms.Form):
    """The workflow page's toggle: email me when a run of this workflow fails."""

    subscribe = forms.TypedChoiceField(choices=[("1", "on"), ("0", "off")], coerce=lambda v: v == "1")
