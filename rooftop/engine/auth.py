"""`--api-key`: the OpenAI routes (/v1/...) want `Authorization: Bearer KEY`, as vLLM's and SGLang's do;
health, metrics, tokenize and the profiler stay open."""

import hmac

from rooftop.engine.api_schemas import ApiError


def check_key(api_key: str | None, authorization: str | None) -> None:
    """Refuse a request (HTTP 401) whose Authorization header is not `Bearer api_key`; no key, no check."""
    if not api_key:
        return
    if not hmac.compare_digest((authorization or "").encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, "this server wants an API key: send the header Authorization: Bearer <key> "
                            "(the key it was started with, --api-key)", code="invalid_api_key",
                       type_="authentication_error")


def bearer(api_key: str | None) -> dict[str, str]:
    """The header that passes `check_key` (none without a key): the router's requests to its workers."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
