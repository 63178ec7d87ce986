from rest_framework import serializers

from console.tenancy.scope import Scope


class ScopedPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A reference by id that only resolves inside the caller's organizations (fails closed:
    with no request in the context, nothing resolves). A foreign id reads as "does not exist"."""

    def get_queryset(self):
        request = self.context.get("request")
        queryset = super().get_queryset()
        if request is None:
            return queryset.none()
        field = "id" if queryset.model._meta.model_name == "organization" else "organization_id"
        return Scope.for_request(request).filter(queryset, field=field)
