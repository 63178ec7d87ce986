"""Creating organizations with their first owner (used by the management command and the demo)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from console.tenancy.models import ApiToken, Membership, Organization, Role, TokenScope


@dataclass(frozen=True)
class NewOrganization:
    organization: Organization
    owner_created: bool
    owner_password: str | None
    token: str


def create_organization(
    name: str,
    admin_email: str,
    *,
    password: str | None = None,
    token_name: str = "initial admin token",  # noqa: S107  (a label, not a secret)
) -> NewOrganization:
    """Create an organization, its owner (or reuse the user with that email) and a write token."""
    User = get_user_model()
    with transaction.atomic():
        base = slugify(name)[:90] or "org"
        slug, n = base, 1
        while Organization.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{base}-{n}"
        organization = Organization.objects.create(name=name, slug=slug)
        user = User.objects.filter(email__iexact=admin_email).first()
        created_password = None
        if user is None:
            created_password = password or secrets.token_urlsafe(12)
            user = User.objects.create_user(username=admin_email, email=admin_email, password=created_password)
        elif password:
            user.set_password(password)
            user.save(update_fields=["password"])
        Membership.objects.create(organization=organization, user=user, role=Role.OWNER)
        token = ApiToken(organization=organization, user=user, name=token_name, scope=TokenScope.WRITE)
        plaintext = token.set_new_secret()
        token.save()
    return NewOrganization(organization, created_password is not None, created_password, plaintext)
