"""A deployment's speculative decoding, engine-neutral: which drafter, how many tokens it drafts a step.

    speculative = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_min = 2, prompt_lookup_max = 4 }
    speculative = { method = "eagle3", num_speculative_tokens = 3, model = "/models/EAGLE3-draft" }

The keys are vLLM's `--speculative-config` names (vllm/config/speculative.py, SpeculativeConfig); each adapter
turns them into its engine's flags (rooftop/adapters/). `method`: "ngram" (prompt lookup, no draft model),
"mtp" (the model's own multi-token-prediction layers), "eagle" or "eagle3" (an EAGLE draft head, `model`).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

METHODS = ("ngram", "mtp", "eagle", "eagle3")
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")
EXAMPLE = '{ method = "ngram", num_speculative_tokens = 3 }'


class Speculative(BaseModel):
    """Speculative decoding as a deployment (or a lever) asks for it; checked here, spelled by each adapter."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["ngram", "mtp", "eagle", "eagle3"]
    num_speculative_tokens: int = Field(ge=1, strict=True)  # tokens drafted a step (k); a verify scores k + 1
    prompt_lookup_min: int | None = Field(default=None, ge=1, strict=True)  # ngram: shortest pattern matched
    prompt_lookup_max: int | None = Field(default=None, ge=1, strict=True)  # ngram: longest pattern matched
    model: str | None = None  # the draft's weights: an EAGLE head (required for eagle, eagle3); mtp: optional

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"a table such as {EXAMPLE}, not {type(data).__name__}")
        unknown = [k for k in data if k not in KEYS]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"no key {key!r}{hint}: speculative takes {', '.join(KEYS)} (vLLM's names); put an "
                             "engine's other speculative flags in args instead")
        return data

    @model_validator(mode="after")
    def _fits_method(self) -> Speculative:
        lookup = [k for k in ("prompt_lookup_min", "prompt_lookup_max") if getattr(self, k) is not None]
        if lookup and self.method != "ngram":
            raise ValueError(f"{lookup[0]} is an ngram setting (prompt lookup), and method is {self.method!r}: drop "
                             "it, or set method = \"ngram\"")
        if self.prompt_lookup_min is not None and self.prompt_lookup_max is not None \
                and self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) is above prompt_lookup_max "
                             f"({self.prompt_lookup_max}): swap them")
        if self.method in ("eagle", "eagle3") and not self.model:
            raise ValueError(f"method {self.method!r} drafts with an EAGLE head: give its weights as `model` (a "
                             "directory or a Hugging Face id)")
        if self.method == "ngram" and self.model:
            raise ValueError("method \"ngram\" drafts from the prompt, with no draft model: drop `model`")
        return self

    def label(self) -> str:
        """'ngram, k=3' (with the lookup window, 'ngram 2-4, k=3'): how a sentence names it."""
        window = ""
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            low = self.prompt_lookup_min if self.prompt_lookup_min is not None else self.prompt_lookup_max
            high = self.prompt_lookup_max if self.prompt_lookup_max is not None else self.prompt_lookup_min
            window = f" {low}-{high}" if low != high else f" {low}"
        return f"{self.method}{window}, k={self.num_speculative_tokens}"
