"""`Authorization: Bearer lst_...` API tokens."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from console.core import scoping
from console.tenancy.models import ApiToken


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, plaintext = header.partition(" ")
        if scheme != self.keyword or not plaintext.startswith(f"{ApiToken.PREFIX}_"):
            return None  # not ours (e.g. a node credential on an API route): stay anonymous
        with scoping.unscoped("find the API token a request presents"):
            token = ApiToken.lookup(plaintext.strip(), queryset=ApiToken.objects.select_related("user"))
            if token is not None and not token.is_revoked and not token.is_expired and token.user.is_active:
                token.touch()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid API token.")
        if token.is_revoked:
            raise exceptions.AuthenticationFailed("This API token was revoked.")
        if token.is_expired:
            raise exceptions.AuthenticationFailed("This API token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The user of this API token is inactive.")
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API token: `lst_<key>.<secret>`."}
