"""`--speculative-config`: vLLM's JSON naming the drafter and its settings, read and checked."""

import json
from dataclasses import dataclass

METHODS = ("ngram", "mtp")
ALIASES = {"deepseek_mtp": "mtp", "[ngram]": "ngram"}  # vLLM's other spellings of the same methods
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
EXAMPLE = '\'{"method": "ngram", "num_speculative_tokens": 3}\''


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """The drafter and how many tokens it proposes a step; n-gram's pattern lengths (vLLM's defaults: 5, 5)."""

    method: str  # "ngram" | "mtp"
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5


def parse_spec_config(text: str) -> SpecConfig:
    """A SpecConfig from the flag's JSON; ValueError naming the problem and the fix."""
    flag = "--speculative-config"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not JSON ({exc.msg} at character {exc.pos}): give an object such as "
                         f"{EXAMPLE}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{flag} must be a JSON object such as {EXAMPLE}, not {type(data).__name__}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"{flag}: unknown key(s) {', '.join(unknown)}: this engine reads {', '.join(KEYS)}")
    method = ALIASES.get(data.get("method"), data.get("method"))
    if method not in METHODS:
        raise ValueError(f"{flag}: method {data.get('method')!r} is not known: use \"ngram\" (prompt lookup) or "
                         "\"mtp\" (the model's multi-token prediction module)")
    k = data.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{flag}: num_speculative_tokens must be a whole number of at least 1, not {k!r}")
    low, high = data.get("prompt_lookup_min"), data.get("prompt_lookup_max")
    if method == "mtp" and (low is not None or high is not None):
        raise ValueError(f"{flag}: prompt_lookup_min/max are n-gram settings: drop them for method \"mtp\"")
    # vLLM's rule: both unset -> 5 and 5; one set -> the other takes its value
    low, high = (5, 5) if low is None and high is None else (low if low is not None else high,
                                                              high if high is not None else low)
    for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{flag}: {name} must be a whole number of at least 1, not {value!r}")
    if low > high:
        raise ValueError(f"{flag}: prompt_lookup_min ({low}) is above prompt_lookup_max ({high}): swap them")
    return SpecConfig(method, k, low, high)
