"""/metrics of a real server counts the prefix cache as vLLM names it: tokens looked up and tokens found
cached, by model_name; with --no-enable-prefix-caching it finds none."""

import pytest
from engine_server import post_json, request, start_engine

QUERIES = 'vllm:prefix_cache_queries_total{model_name="tiny"}'
HITS = 'vllm:prefix_cache_hits_total{model_name="tiny"}'
PROMPT = [256] + [(31 * i) % 250 + 2 for i in range(39)]  # 40 tokens: two 16-token pages and 8 of a third


def scrape(url: str) -> dict[str, float]:
    text = request(url, "/metrics")[1].decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def complete(url: str, prompt: list[int]) -> list[int]:
    status, body = post_json(url, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0,
                                                      "ignore_eos": True, "return_token_ids": True})
    assert status == 200, body
    return body["choices"][0]["token_ids"]


@pytest.mark.parametrize("flags", [(), ("--engine-process", "on"), ("--no-enable-prefix-caching",)],
                         ids=["on", "on-engine-process", "off"])
def test_metrics_count_prefix_cache_tokens(flags):
    server = start_engine("--context-length", "128", "--page-size", "16", "--kv-cache-tokens", "1024", *flags)
    try:
        before = scrape(server.url)
        first = complete(server.url, PROMPT)
        second = complete(server.url, PROMPT + [7, 8, 9, 10, 11])  # shares 2 full pages and part of the third
        again = complete(server.url, PROMPT)
        after = scrape(server.url)
    finally:
        server.stop()
    assert first == again and len(second) == 3
    queries, hits = after[QUERIES] - before[QUERIES], after[HITS] - before[HITS]
    if "--no-enable-prefix-caching" in flags:
        assert (queries, hits) == (0, 0)
    else:
        # the first finds nothing; the second 2 pages; the third 2 pages (its third page is not full)
        assert (queries, hits) == (40 + 45 + 40, 2 * 16 + 2 * 16)
