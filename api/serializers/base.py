"""The base of every serializer that reads a request body: JSON types exactly as the schema
states them. DRF would coerce (`"description": 5` becomes "5", `"max_uses": "5"` becomes 5,
`"yes"` a boolean); a value of the wrong JSON type is a 400 naming the field instead."""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers

# (DRF field class, test of the JSON value, what the error says), most specific first.
_JSON_TYPES = (
    (serializers.BooleanField, lambda v: isinstance(v, bool), "true or false"),
    (serializers.IntegerField, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    (serializers.FloatField, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    (serializers.CharField, lambda v: isinstance(v, str), "a string"),
    (serializers.ChoiceField, lambda v: isinstance(v, str), "a string"),
    (serializers.DateTimeField, lambda v: isinstance(v, str), "an ISO 8601 string"),
    (serializers.PrimaryKeyRelatedField, lambda v: isinstance(v, int) and not isinstance(v, bool), "an id (an integer)"),
)


class StrictModelSerializer(serializers.ModelSerializer):
    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            problems = {}
            for name, field in self.fields.items():
                if field.read_only or name not in data or (data[name] is None and field.allow_null):
                    continue
                for kind, fits, what in _JSON_TYPES:
                    if isinstance(field, kind):
                        if not fits(data[name]):
                            problems[name] = f"must be {what}, got {data[name]!r}"
                        break
            if problems:
                raise serializers.ValidationError(problems)
        return super().to_internal_value(data)
