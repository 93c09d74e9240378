"""Bench settings as users give them, checked once for every caller."""

import urllib.parse


def dcgm_url_problem(url: str) -> str | None:
    """What is wrong with a dcgm-exporter URL in a few words (it needs http:// or https:// and a host),
    or None when it can be asked."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "needs http:// or https:// before the host"
    if not parts.hostname:
        return "names no host"
    return None
