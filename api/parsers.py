"""The API's JSON parser: DRF's, with the strict reading every JSON body gets
(`console.core.limits.loads`: no NaN, bounded depth, no NUL or lone surrogate, integers in 64
bits), so a body that cannot be stored is a 400 naming the field before any view runs."""

from __future__ import annotations

from django.conf import settings
from rest_framework.parsers import JSONParser

from console.core import limits
from console.core.errors import Invalid


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise Invalid(f"The body is not {encoding} text: {exc}") from None
        return limits.loads(text)
