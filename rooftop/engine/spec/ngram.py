"""The n-gram drafter (prompt lookup, vLLM's `ngram`): find the sequence's last n tokens earlier in it and
propose the tokens that followed them."""

from array import array

_WIDTH = 4  # bytes of one token id in the array searched


def propose_ngram(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of token_ids of
    min_n..max_n tokens (longest first, as vLLM's proposer); [] when no such suffix occurs earlier.

    The search is bytes.rfind over the ids packed 4 bytes each (a hit must fall on a token boundary), so it
    runs at C speed over a long context."""
    num_tokens = len(token_ids)
    if k <= 0 or num_tokens <= min_n:
        return []
    data = array("i", token_ids).tobytes()
    # an occurrence must end before the last token, so that at least one token follows it
    end = (num_tokens - 1) * _WIDTH
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        pattern = data[-n * _WIDTH:]
        hit = data.rfind(pattern, 0, end)
        while hit > 0 and hit % _WIDTH:  # inside a token: look further back
            hit = data.rfind(pattern, 0, hit + len(pattern) - 1)
        if hit >= 0 and hit % _WIDTH == 0:
            start = hit // _WIDTH + n
            return token_ids[start:start + k]
    return []
