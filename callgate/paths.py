"""URL paths: for the rows of a list page, reversed once per page instead of once per row
(``PathOf``); absolute URLs for what leaves the browser (``absolute_url``).

``reverse`` costs about 30 µs (resolver look-up, the pattern's check, quoting); a list of 50
rows with a link or five each spent a sixth to a third of its time there."""

from __future__ import annotations

from urllib.parse import quote

from django.conf import settings
from django.urls import reverse
from django.utils.http import RFC3986_SUBDELIMS


class PathOf:
    """The paths of one URL pattern (``name``, its leading ``args`` fixed) for many values
    of its last argument: ``PathOf("reviews:item", slug)(42)`` is
    ``reverse("reviews:item", args=[slug, 42])``. The pattern is reversed once with a
    stand-in value whose place each value takes, quoted as ``reverse`` quotes (the ``pchar``
    characters of RFC 3986 §3.3 stay as they are); quoting is per character, so the pieces
    quoted apart give ``reverse``'s answer. Values are not checked against the pattern's
    converter: they come from rows the pattern serves (an ``int`` ID, an operation ID)."""

    STAND_IN = 987654321

    def __init__(self, name: str, *args) -> None:
        path = reverse(name, args=[*args, self.STAND_IN])
        self.head, _, self.tail = path.rpartition(str(self.STAND_IN))

    def __call__(self, value: int | str) -> str:
        text = (
            str(value) if isinstance(value, int) else quote(value, safe=RFC3986_SUBDELIMS + "/~:@")
        )
        return f"{self.head}{text}{self.tail}"


def absolute_url(path: str) -> str:
    """``path`` (``/p/…``) on ``settings.CALLGATE_BASE_URL``: the links of notifications
    (alert emails, webhooks and Slack texts, review-item emails and Slack messages), which
    leave the browser and so carry the scheme and host."""
    return settings.CALLGATE_BASE_URL.rstrip("/") + path
