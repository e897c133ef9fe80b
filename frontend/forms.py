"""Forms of the organization and member pages. They parse input only; the rules
(slug format, who may grant which role) live in tenancy.services."""

from __future__ import annotations

from django import forms
from django.utils.text import slugify

from tenancy.models import Role


class OrganizationForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Shown in the header and in invitations.")
    slug = forms.CharField(
        max_length=63, required=False,
        help_text="Lowercase letters, digits and '-'; used in URLs and the X-Organization header. Left empty, "
                  "it is made from the name.",
    )

    def clean_name(self) -> str:
        return self.cleaned_data["name"].strip()

    def clean_slug(self) -> str:
        return self.cleaned_data["slug"].strip()

    def clean(self):
        data = super().clean()
        if not data.get("slug") and data.get("name"):
            # "Acme Data, Inc." -> "acme-data-inc" (tenancy.services checks it as any slug).
            made = slugify(data["name"])[:63].strip("-_").replace("_", "-")
            if made:
                data["slug"] = made
            else:
                self.add_error("slug", "The name has no letters or digits to make a slug from: enter one.")
        return data


class SwitchOrganizationForm(forms.Form):
    organization = forms.UUIDField()


class RoleField(forms.ChoiceField):
    """A role. Every role is accepted (the service refuses what the actor may not
    grant, with a 403); ``offered`` narrows only the options shown."""

    def __init__(self, *, offered: list[tuple[str, str]] | None = None, **kwargs) -> None:
        super().__init__(choices=Role.choices, **kwargs)
        if offered is not None:
            self.widget.choices = offered


def offered_roles(actor_role: str | None) -> list[tuple[str, str]]:
    """The roles ``actor_role`` may hand out: every role for an owner, all but owner otherwise."""
    return [
        (value, label) for value, label in Role.choices if value != Role.OWNER or actor_role == Role.OWNER
    ]


class InviteForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = RoleField(initial=Role.MEMBER)

    def __init__(self, *args, actor_role: str | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["role"].widget.choices = offered_roles(actor_role)


class RoleForm(forms.Form):
    role = RoleField()
