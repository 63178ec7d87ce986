"""Tenancy's one writer: organizations, members and roles, API tokens.

The REST API, the pages, the demo and `manage.py create_organization` all go through these.
Organization names and slugs are unique across tenants, so creating an organization checks
them unscoped; everything else runs in the caller's tenant scope. Errors are domain errors.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from console.core import scoping
from console.core.errors import Conflict, Invalid, NotFound
from console.live.publish import publish_access_changed
from console.tenancy.models import ApiToken, Invitation, Membership, Organization, Role, TokenScope

INVITATION_TTL = timedelta(days=7)


@dataclass(frozen=True)
class MintedApiToken:
    token: ApiToken
    plaintext: str  # shown once, never stored


@dataclass(frozen=True)
class NewOrganization:
    organization: Organization
    owner_created: bool
    owner_password: str | None
    token: str


def _free_slug(base: str) -> str:
    base = base[:90] or "org"
    slug, n = base, 1
    while Organization.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def create_organization(name: str, owner, *, slug: str | None = None) -> Organization:
    """A new organization with `owner` as its owner. Names and slugs are global: taken ones are
    a Conflict naming the field."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise Invalid("An organization needs a name of 1 to 100 characters.", field="name")
    with scoping.unscoped("create a new tenant: names and slugs are unique across all of them"):
        try:
            with transaction.atomic():
                if Organization.objects.filter(name=name).exists():
                    raise Conflict(f"An organization named {name!r} exists.", field="name")
                if slug is not None:
                    if Organization.objects.filter(slug=slug).exists():
                        raise Conflict(f"The slug {slug!r} is taken.", field="slug")
                else:
                    slug = _free_slug(slugify(name))
                organization = Organization.objects.create(name=name, slug=slug)
                Membership.objects.create(organization=organization, user=owner, role=Role.OWNER)
        except IntegrityError:  # a concurrent creation took the name or slug first
            raise Conflict(f"An organization named {name!r} (or with slug {slug!r}) exists.", field="name") from None
    return organization


def rename_organization(organization: Organization, *, name: str | None = None, slug: str | None = None):
    with scoping.unscoped("rename a tenant: names and slugs are unique across all of them"):
        others = Organization.objects.exclude(pk=organization.pk)
        if name is not None:
            if others.filter(name=name).exists():
                raise Conflict(f"An organization named {name!r} exists.", field="name")
            organization.name = name
        if slug is not None:
            if others.filter(slug=slug).exists():
                raise Conflict(f"The slug {slug!r} is taken.", field="slug")
            organization.slug = slug
    organization.save()
    return organization


def create_organization_with_admin(name: str, admin_email: str, *, password: str | None = None,
                                   token_name: str = "initial admin token",  # noqa: S107  (a label)
                                   ) -> NewOrganization:
    """An organization, its owner (the user with that email, or a new one) and a write token:
    what `manage.py create_organization` prints."""
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.filter(email__iexact=admin_email).first()
        created_password = None
        if user is None:
            created_password = password or secrets.token_urlsafe(12)
            user = User.objects.create_user(username=admin_email, email=admin_email, password=created_password)
        elif password:
            user.set_password(password)
            user.save(update_fields=["password"])
        organization = create_organization(name, user)
        with scoping.for_organization(organization.pk):
            minted = mint_api_token(organization.pk, user, name=token_name, scope=TokenScope.WRITE)
    return NewOrganization(organization, created_password is not None, created_password, minted.plaintext)


# --- members ------------------------------------------------------------------------------------

def invite_member(organization: Organization, email: str, role: str, invited_by) -> Invitation:
    """An invitation of `email` to `organization`, whether or not an account has the address
    (the answer is the same either way); inviting the address again renews it with the new role.
    Nobody becomes a member until they accept (`accept_invitation`)."""
    email = email.strip().lower()
    if Membership.objects.filter(organization=organization, user__email__iexact=email).exists():
        raise Conflict(f"{email} is already a member.", field="email")
    invitation, _ = Invitation.objects.update_or_create(
        organization=organization, email=email,
        defaults={"role": role, "invited_by": invited_by, "expires": timezone.now() + INVITATION_TTL},
    )
    return invitation


def invitations_for(user) -> list[Invitation]:
    """The open invitations addressed to the user's e-mail, of any organization."""
    if not user.email:
        return []
    with scoping.unscoped("the invitations addressed to the signed-in user, whichever organization sent them"):
        return list(Invitation.objects.filter(email__iexact=user.email, expires__gt=timezone.now())
                    .select_related("organization"))


def _invitation_for(user, invitation_id) -> Invitation:
    found = next((i for i in invitations_for(user) if str(i.pk) == str(invitation_id)), None)
    if found is None:  # another person's invitation is not found, like one that does not exist
        raise NotFound("No such invitation for you.", field="invitation")
    return found


def accept_invitation(user, invitation_id) -> Membership:
    """The user joins with the invited role; the invitation is used up."""
    invitation = _invitation_for(user, invitation_id)
    with scoping.for_organization(invitation.organization_id), transaction.atomic():
        membership, created = Membership.objects.get_or_create(
            organization_id=invitation.organization_id, user=user, defaults={"role": invitation.role})
        invitation.delete()
    if created:
        publish_access_changed(user.pk)
    return membership


def decline_invitation(user, invitation_id) -> None:
    invitation = _invitation_for(user, invitation_id)
    with scoping.for_organization(invitation.organization_id):
        invitation.delete()


def change_role(membership: Membership, role: str) -> Membership:
    with transaction.atomic():
        _keep_an_owner(membership, new_role=role)
        membership.role = role
        membership.save(update_fields=["role", "updated"])
        publish_access_changed(membership.user_id)
    return membership


def remove_member(membership: Membership) -> None:
    with transaction.atomic():
        _keep_an_owner(membership, new_role=None)
        membership.delete()
        publish_access_changed(membership.user_id)


def _keep_an_owner(membership: Membership, new_role) -> None:
    if membership.role != Role.OWNER or new_role == Role.OWNER:
        return
    owners = Membership.objects.select_for_update().filter(organization_id=membership.organization_id, role=Role.OWNER)
    if not owners.exclude(pk=membership.pk).exists():
        raise Conflict("An organization needs at least one owner.", field="role")


# --- API tokens ---------------------------------------------------------------------------------

def mint_api_token(organization_id: int, user, *, name: str, scope: str = TokenScope.READ,
                   expires: datetime | None = None, parent: ApiToken | None = None) -> MintedApiToken:
    """A new token. Minted with another token (`parent`), it is bound by it: same organization,
    no wider scope, an expiry no later than the parent's (the parent's when none is asked)."""
    if expires is not None and expires <= timezone.now():
        raise Invalid("The expiry must be in the future.", field="expires")
    if parent is not None:
        if parent.organization_id != organization_id:
            raise Invalid("A token mints tokens of its own organization only.", field="organization")
        if TokenScope.rank(scope) > TokenScope.rank(parent.scope):
            raise Invalid(f"A token of the {parent.scope} scope cannot mint one of the {scope} scope.", field="scope")
        if parent.expires is not None:
            if expires is None:
                expires = parent.expires
            elif expires > parent.expires:
                raise Invalid(f"The expiry must not be later than the minting token's ({parent.expires.isoformat()}).",
                              field="expires")
    token = ApiToken(organization_id=organization_id, user=user, name=name, scope=scope, expires=expires,
                     parent=parent)
    plaintext = token.set_new_secret()
    token.save()
    return MintedApiToken(token, plaintext)


def revoke_api_token(token: ApiToken) -> None:
    """Revoke the token and every token minted from it, at any depth."""
    with transaction.atomic():
        token.revoke()
        generation = [token.pk]
        while generation:
            ApiToken.objects.filter(parent_id__in=generation, revoked_at__isnull=True).update(revoked_at=token.revoked_at)
            generation = list(ApiToken.objects.filter(parent_id__in=generation).values_list("pk", flat=True))
