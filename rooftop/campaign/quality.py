"""Quality check of a lever: fixed prompts decoded greedily on both deployments, compared token by token.

Agreement is the mean, over prompts, of the common prefix of the two greedy outputs divided by the
longer output (after the first difference the contexts differ, so later matches mean little). KL is
the mean over positions inside the common prefix of KL(base || lever) between the next-token
distributions, estimated on the base's top-k tokens: a token missing from the lever's top-k gets the
lever's smallest shown probability (an upper bound on its true one), so the estimate is a lower bound.

A prompt whose outputs part at a near-tie — each side's logprobs of the two tokens within `tie_margin`
nats of each other, and the two next-token distributions there no further apart than the KL
threshold — parts by rounding: two correct implementations flip such ties (bf16 logits carry ~0.1 of
error, measured against float32), and on a model with flat logits they are common. The agreement
flag counts those prompts as agreeing and the raw agreement is reported beside it. Nothing after a
parting can be compared (the contexts differ), so a lever that went wrong only after a near-tie
parting would pass: more prompts, or longer common prefixes, narrow that. Ties need `logprobs` >= 2
(a top-1 list never shows the other token); a parting where one output ends is never a tie.

A lever that must not change greedy outputs (speculative decoding: the target model verifies every draft, so greedy
decoding yields the plain engine's tokens) is held to more: each prompt's first divergence is reported with the
baseline's top-2 logprob gap there. Where the baseline's logprobs of its token and the lever's are within
`tie_margin`, the divergence is a near-tie (the verify forward rounds differently from a decode step); beyond it, or
where no logprobs tell, it is flagged as a bug in the lever's verification.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import aiohttp

from rooftop.auth import auth_headers
from rooftop.errors import RooftopError

# Fixed prompts: plain text of mixed kinds, so a byte-level or BPE tokenizer both see varied input.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "In 1969, the first humans to walk on the Moon were",
    "A list of prime numbers: 2, 3, 5, 7,",
    "Translate to German: The weather is nice today. ->",
    "The three laws of thermodynamics state that",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "Once upon a time, in a small village by the sea,",
    "The derivative of sin(x) with respect to x is",
    "Key facts about the H200 GPU: memory",
    "{\"name\": \"rooftop\", \"version\":",
    "To make bread you need flour, water,",
    "The quick brown fox jumps over",
    "Photosynthesis converts light energy into",
    "git commit -m \"",
    "Roses are red, violets are blue,",
]


@dataclass(slots=True)
class GreedyOutput:
    """One prompt's greedy continuation: tokens as the server named them and their top logprobs."""

    prompt: str
    tokens: list[str]
    top_logprobs: list[dict[str, float]] | None  # per position; None where the server serves none


@dataclass(slots=True)
class QualityResult:
    """A lever's outputs against its base's on the same prompts."""

    prompts: int
    agreement: float  # mean common-prefix fraction
    exact_match: float  # share of prompts with identical outputs
    mean_kl: float | None  # nats; None without logprobs
    kl_positions: int
    flagged: bool
    reason: str
    tie_flips: int = 0  # prompts whose outputs part at a near-tie
    agreement_ties_as_agreeing: float | None = None  # what the flag uses: those prompts count as agreeing
    # each diverging prompt's first divergence (Divergence), and whether the lever must match greedy outputs exactly
    divergences: list[Divergence] = field(default_factory=list)
    must_match: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class Divergence:
    """Where one prompt's greedy outputs first part: the position, each side's pick there (None: that output ended),
    the baseline's top-2 logprob gap there (nats), and the baseline's logprob of its own pick over the lever's.
    kind: "near-tie" (within the margin: rounding), "bug" (beyond it), "unknown" (no logprobs tell). The fields say
    "pick", not "token": the store redacts any key named like a secret (rooftop/redact.py)."""

    prompt: int
    position: int
    base_pick: str | None
    lever_pick: str | None
    top2_gap: float | None  # nats; None where the baseline served fewer than two logprobs there
    gap: float | None  # base's token over the lever's, nats (None: not shown)
    gap_is_bound: bool  # the lever's token is not in the base's top list: `gap` is its lower bound
    kind: str


async def greedy_outputs(base_url: str, model: str, n_prompts: int, max_tokens: int, logprobs: int,
                         timeout_s: float = 300.0, api_key: str | None = None) -> list[GreedyOutput]:
    """Decode the first n fixed prompts greedily through /v1/completions (one at a time, deterministic),
    with the deployment's API key where it has one."""
    url = base_url.rstrip("/") + "/v1/completions"
    out = []
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(n_prompts)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     headers=auth_headers(api_key)) as session:
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "stream": False, "seed": 0}
            if logprobs:
                body["logprobs"] = logprobs
            try:
                async with session.post(url, json=body) as resp:
                    data = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise RooftopError(f"quality check: {url} answered HTTP {resp.status}: {data}",
                                           "check that the server serves /v1/completions")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise RooftopError(f"quality check: no answer from {url} ({type(exc).__name__})",
                                   "check that the deployment is up") from exc
            choice = data["choices"][0]
            lp = choice.get("logprobs") or {}
            tokens = lp.get("tokens") or list(choice.get("text", ""))  # no tokens served: compare characters
            top = lp.get("top_logprobs")
            out.append(GreedyOutput(prompt, list(tokens), [dict(t or {}) for t in top] if top else None))
    return out


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def kl_top(p_log: dict[str, float], q_log: dict[str, float]) -> float | None:
    """KL(p || q) in nats over p's shown tokens, both renormalised there (see the module docstring)."""
    if not p_log or not q_log:
        return None
    floor = min(q_log.values())
    p = {t: math.exp(v) for t, v in p_log.items()}
    q = {t: math.exp(q_log.get(t, floor)) for t in p_log}
    zp, zq = sum(p.values()), sum(q.values())
    return sum((pv / zp) * (math.log(pv / zp) - math.log(q[t] / zq)) for t, pv in p.items() if pv > 0)


def near_tie(base: GreedyOutput, lever: GreedyOutput, n: int, margin: float, kl_max: float) -> bool:
    """Whether the outputs part at position n by rounding (see the module docstring)."""
    if margin <= 0 or n >= min(len(base.tokens), len(lever.tokens)):
        return False
    if not base.top_logprobs or not lever.top_logprobs or n >= min(len(base.top_logprobs), len(lever.top_logprobs)):
        return False
    mine, theirs = base.tokens[n], lever.tokens[n]
    for top, pick, other in ((base.top_logprobs[n], mine, theirs), (lever.top_logprobs[n], theirs, mine)):
        if pick not in top or other not in top or top[pick] - top[other] > margin:
            return False
    k = kl_top(base.top_logprobs[n], lever.top_logprobs[n])
    return k is not None and k <= kl_max


def top2_gap(top: dict[str, float] | None) -> float | None:
    """The gap between the two largest logprobs of a position (nats); None with fewer than two."""
    if not top or len(top) < 2:
        return None
    first, second = sorted(top.values(), reverse=True)[:2]
    return first - second


def first_divergence(i: int, base: GreedyOutput, lever: GreedyOutput, margin: float) -> Divergence | None:
    """Prompt `i`'s first divergence, judged by the baseline's logprobs there; None where the outputs are equal."""
    if base.tokens == lever.tokens:
        return None
    n = _common_prefix(base.tokens, lever.tokens)
    mine = base.tokens[n] if n < len(base.tokens) else None
    theirs = lever.tokens[n] if n < len(lever.tokens) else None
    top = base.top_logprobs[n] if base.top_logprobs and n < len(base.top_logprobs) else None
    gap, bound = None, False
    if top and mine in top and theirs in top:
        gap = top[mine] - top[theirs]
    elif top and mine in top and theirs is not None and len(top) > 1:
        gap, bound = top[mine] - min(top.values()), True  # the lever's token is below every one shown
    elif top and theirs is None:
        gap = top2_gap(top)  # the lever ended here: its end-of-sequence token is not named in the base's list
    if gap is None:
        kind = "unknown"
    else:
        kind = "bug" if gap > margin else "unknown" if bound else "near-tie"
    return Divergence(i, n, mine, theirs, top2_gap(top), gap, bound, kind)


def first_divergences(base: list[GreedyOutput], lever: list[GreedyOutput], margin: float) -> list[Divergence]:
    """Each diverging prompt's first divergence (prompts in order)."""
    return [d for i, (b, c) in enumerate(zip(base, lever, strict=True))
            if (d := first_divergence(i, b, c, margin)) is not None]


def divergence_text(d: Divergence, margin: float | None = None) -> str:
    """'prompt 3 at token 5: ' the' vs ' a', the baseline's top-2 gap 1.31 nats (> 0.2)'."""
    def name(token: str | None) -> str:
        return "its end" if token is None else repr(token)

    gap = ("no logprobs there" if d.top2_gap is None else f"the baseline's top-2 gap {d.top2_gap:.3g} nats")
    if d.gap is not None and (d.top2_gap is None or abs(d.gap - d.top2_gap) > 1e-9):
        gap += f", {'at least ' if d.gap_is_bound else ''}{d.gap:.3g} to the lever's token"
    if margin is not None and d.kind != "unknown":
        gap += f" ({'≤' if d.kind == 'near-tie' else '>'} {margin:g})"
    return f"prompt {d.prompt + 1} at token {d.position + 1}: {name(d.base_pick)} vs {name(d.lever_pick)}, {gap}"


def exactness_reason(divs: list[Divergence], prompts: int, margin: float) -> str | None:
    """Why a lever that must keep greedy outputs is flagged (a divergence beyond a near-tie, or one no logprobs
    tell from one); None where every divergence is a near-tie."""
    bad = [d for d in divs if d.kind != "near-tie"]
    if not bad:
        return None
    bugs = sum(d.kind == "bug" for d in bad)
    what = (f"{bugs} beyond a near-tie" if bugs == len(bad) else
            f"{bugs} beyond a near-tie, {len(bad) - bugs} with no logprobs to tell" if bugs else
            f"{len(bad)} with no logprobs to tell from a near-tie")
    return (f"greedy outputs part at {len(bad)} of {prompts} prompts ({what}; first {divergence_text(bad[0], margin)}): "
            "speculation must not change greedy outputs, so its verify step (its acceptance, or its kernels against "
            "the decode step's) parts from plain decoding by more than rounding")


def ties_note(ties: int, prompts: int, agreement_ties: float | None, margin: float | None = None) -> str:
    """' (N of M prompts part at near-ties[ within X nats]: Y% counting them as agreeing)', '' without ties."""
    if not ties:
        return ""
    within = f" within {margin:g} nats" if margin is not None else ""
    return f" ({ties} of {prompts} prompts part at near-ties{within}: {agreement_ties or 0:.0%} counting them as agreeing)"


def compare_outputs(base: list[GreedyOutput], lever: list[GreedyOutput], kl_threshold: float,
                    agreement_threshold: float, tie_margin: float = 0.0, must_match: bool = False) -> QualityResult:
    """Agreement and mean KL of a lever's greedy outputs against its base's; flagged past the thresholds
    (agreement counting prompts that part at a near-tie, within `tie_margin` nats, as agreeing), and, where the lever
    `must_match` (speculative decoding), at any first divergence beyond a near-tie."""
    if len(base) != len(lever) or not base:
        raise ValueError("quality: both sides need the same, non-empty prompt list")
    fractions, counted, exact, kls, ties = [], [], 0, [], 0
    for b, c in zip(base, lever, strict=True):
        n = _common_prefix(b.tokens, c.tokens)
        same = b.tokens == c.tokens
        fraction = 1.0 if same else n / max(len(b.tokens), len(c.tokens))
        fractions.append(fraction)
        tie = not same and near_tie(b, c, n, tie_margin, kl_threshold)
        ties += tie
        counted.append(1.0 if tie else fraction)
        exact += same
        if b.top_logprobs and c.top_logprobs:
            for i in range(min(n + 1, len(b.top_logprobs), len(c.top_logprobs))):
                k = kl_top(b.top_logprobs[i], c.top_logprobs[i])
                if k is not None:
                    kls.append(k)
    agreement = sum(fractions) / len(fractions)
    agreement_ties = sum(counted) / len(counted)
    mean_kl = sum(kls) / len(kls) if kls else None
    reasons = []
    tie_text = ties_note(ties, len(base), agreement_ties, tie_margin)
    if agreement_ties < agreement_threshold:
        reasons.append(f"token agreement {agreement:.0%}{tie_text} < {agreement_threshold:.0%}")
    if mean_kl is not None and mean_kl > kl_threshold:
        reasons.append(f"mean KL {mean_kl:.3g} > {kl_threshold:.3g} nats")
    divs = first_divergences(base, lever, tie_margin)
    exact_reason = exactness_reason(divs, len(base), tie_margin) if must_match else None
    if exact_reason:
        reasons.insert(0, exact_reason)
    reason = "; ".join(reasons) or ("within thresholds" + (f": token agreement {agreement:.0%}{tie_text}"
                                                           if ties else ""))
    if must_match and divs and not exact_reason:
        reason += f"; {len(divs)} of {len(base)} prompts part, each at a near-tie (≤ {tie_margin:g} nats)"
    return QualityResult(len(base), agreement, exact / len(base), mean_kl, len(kls), bool(reasons), reason,
                         ties, agreement_ties, divs, must_match)


def outputs_to_dicts(outputs: list[GreedyOutput]) -> list[dict]:
    return [asdict(o) for o in outputs]


def outputs_from_dicts(rows: list[dict]) -> list[GreedyOutput]:
    return [GreedyOutput(r["prompt"], r["tokens"], r.get("top_logprobs")) for r in rows]
