"""Organizations (tenants), their members and roles, and API tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from console.core.models import OrganizationOwnedModel, TenantOwned, TimestampedModel
from console.core.tokens import HashedToken

__all__ = ["ApiToken", "Invitation", "Membership", "Organization", "Role", "TokenScope"]


class Role(models.TextChoices):
    """What a member may do in an organization. Each role includes the ones below it."""

    OWNER = "owner", "Owner"  # members, tokens, everything an operator does
    OPERATOR = "operator", "Operator"  # clusters, topology, enrollment, commands
    VIEWER = "viewer", "Viewer"  # read only

    @classmethod
    def rank(cls, role: str) -> int:
        return {cls.VIEWER: 1, cls.OPERATOR: 2, cls.OWNER: 3}.get(role, 0)


class Organization(TenantOwned, TimestampedModel):
    """A tenant: a GPU cloud, a platform team, a customer. Owns every domain row, and itself:
    its queries are scoped like every other tenant-owned row's (a new one is created unscoped,
    by `console.tenancy.services.create_organization`)."""

    tenant_field = "id"

    name = models.CharField(
        verbose_name="name",
        max_length=100,
    )
    slug = models.SlugField(
        verbose_name="slug",
        max_length=100,
        unique=True,
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="tenancy_organization_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def organization_id(self) -> int:
        """An organization belongs to itself, so permission checks treat it like any row."""
        return self.pk


class Membership(TenantOwned, TimestampedModel):
    """A user's role in one organization."""

    organization = models.ForeignKey(
        to=Organization,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name="organization",
    )
    user = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name="user",
    )
    role = models.CharField(
        verbose_name="role",
        max_length=16,
        choices=Role.choices,
        default=Role.VIEWER,
    )

    class Meta:
        ordering = ["organization", "user"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "user"], name="tenancy_membership_unique_organization_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class Invitation(OrganizationOwnedModel):
    """An owner's offer of a role to an e-mail address; a membership once its user accepts it.

    Adding a member always makes one, whether or not an account has the address, so the answer
    says nothing about other people's accounts, and nobody joins an organization without consent.
    """

    email = models.EmailField(
        verbose_name="e-mail",
        max_length=254,
    )
    role = models.CharField(
        verbose_name="role",
        max_length=16,
        choices=Role.choices,
        default=Role.VIEWER,
    )
    invited_by = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name="invited by",
    )
    expires = models.DateTimeField(
        verbose_name="expires",
    )

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "email"], name="tenancy_invitation_unique_organization_email"),
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.organization_id} ({self.role})"


class TokenScope(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write"

    @classmethod
    def rank(cls, scope: str) -> int:
        return {cls.READ: 1, cls.WRITE: 2}.get(scope, 0)


class ApiToken(HashedToken, OrganizationOwnedModel):
    """A bearer token for the REST API, bound to one organization and acting for its creator.

    It never grants more than its creator's current role, and `read` tokens never write. One
    minted with another token (`parent`) expires no later than it, has no wider scope, and is
    revoked with it.
    """

    PREFIX = "lst"

    user = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_tokens",
        verbose_name="user",
    )
    name = models.CharField(
        verbose_name="name",
        max_length=100,
    )
    scope = models.CharField(
        verbose_name="scope",
        max_length=8,
        choices=TokenScope.choices,
        default=TokenScope.READ,
    )
    # The token that minted this one (None when minted signed in): a child never outlives or
    # out-ranks it, and is revoked with it.
    parent = models.ForeignKey(
        to="self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="children",
        verbose_name="parent",
        editable=False,
    )

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["organization", "user"], name="tenancy_apitoken_org_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix_display})"
