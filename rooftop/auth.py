"""The API key a server may want (vLLM's, SGLang's and the embedded engine's `--api-key`): every
request rooftop sends to an OpenAI-compatible endpoint carries it as `Authorization: Bearer KEY`.

`rooftop bench --api-key` (or ROOFTOP_API_KEY) gives it; a campaign sends its deployment's own
`api-key` arg. Keys never reach a document (redact.py).
"""

ENV = "ROOFTOP_API_KEY"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request headers for `api_key` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def refused_hint(status: int, what: str) -> str | None:
    """The fix for an HTTP 401/403 from a server that wants a key (None for other statuses)."""
    if status not in (401, 403):
        return None
    return f"the server wants an API key: pass {what}"
