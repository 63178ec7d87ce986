"""Secrets handed out once and stored only as a keyed digest.

Shape: `<prefix>_<key>.<secret>`. The key (12 characters) is stored in clear and indexed for
lookup; the secret is stored as HMAC-SHA256 under `settings.TOKEN_PEPPER`, compared in constant
time. A stolen database therefore yields no usable token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

KEY_LENGTH = 12
_KEY_ALPHABET = string.ascii_letters + string.digits
# last_used is refreshed at most this often, so authentication stays a read on the hot path.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class ParsedToken:
    key: str
    secret: str


def parse_token(prefix: str, plaintext: str) -> ParsedToken | None:
    head = f"{prefix}_"
    if not isinstance(plaintext, str) or not plaintext.startswith(head):
        return None
    key, dot, secret = plaintext[len(head):].partition(".")
    if not dot or len(key) != KEY_LENGTH or not secret or len(secret) > 128:
        return None
    return ParsedToken(key, secret)


def digest(secret: str) -> str:
    return hmac.new(settings.TOKEN_PEPPER.encode(), secret.encode(), hashlib.sha256).hexdigest()


class HashedToken(models.Model):
    """Abstract: a revocable, expiring secret stored as key + digest."""

    PREFIX: str = ""

    key = models.CharField(
        verbose_name="key",
        max_length=KEY_LENGTH,
        unique=True,
        editable=False,
    )
    digest = models.CharField(
        verbose_name="digest",
        max_length=64,
        editable=False,
    )
    expires = models.DateTimeField(
        verbose_name="expires",
        null=True,
        blank=True,
    )
    last_used = models.DateTimeField(
        verbose_name="last used",
        null=True,
        blank=True,
        editable=False,
    )
    revoked_at = models.DateTimeField(
        verbose_name="revoked at",
        null=True,
        blank=True,
        editable=False,
    )

    class Meta:
        abstract = True

    def set_new_secret(self) -> str:
        """Give this (unsaved or rotated) token a fresh key and secret; return the plaintext."""
        self.key = "".join(secrets.choice(_KEY_ALPHABET) for _ in range(KEY_LENGTH))
        secret = secrets.token_urlsafe(32)
        self.digest = digest(secret)
        return f"{self.PREFIX}_{self.key}.{secret}"

    @property
    def prefix_display(self) -> str:
        """What lists show: enough to recognize a token, not to use it."""
        return f"{self.PREFIX}_{self.key}"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires is not None and self.expires <= timezone.now()

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.digest, digest(secret))

    @classmethod
    def lookup(cls, plaintext: str, queryset=None):
        """The stored token for this plaintext, whatever its state, or None if none matches."""
        parsed = parse_token(cls.PREFIX, plaintext)
        if parsed is None:
            return None
        qs = queryset if queryset is not None else cls.objects.all()
        # key is unique: no ordering, no LIMIT games, one indexed lookup on the hot path.
        found = list(qs.filter(key=parsed.key).order_by()[:1])
        if not found or not found[0].matches(parsed.secret):
            return None
        return found[0]

    def touch(self) -> None:
        now = timezone.now()
        if self.last_used is None or now - self.last_used > LAST_USED_RESOLUTION:
            type(self).objects.filter(pk=self.pk).update(last_used=now)
            self.last_used = now

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            type(self).objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=self.revoked_at)
