"""`speculative`, engine-neutral, on a deployment and on a lever: what it takes and each mistake's one error."""

import pytest

from rooftop.errors import RooftopError
from rooftop.spec.campaign import apply_lever, parse_campaign
from rooftop.spec.deployment import LEVER_DEPLOYMENT_KEYS
from rooftop.spec.load import deployment_from_dict

BASE = '[campaign]\nname = "c"\n[model]\npath = "/m"\n[deployment]\nengine = "vllm"\n'


def lever(table: str, extra: str = "") -> str:
    return BASE + f'[[lever]]\nname = "spec"\nspeculative = {table}\n{extra}'


def test_a_lever_sets_speculative_and_is_quality_checked_by_default():
    spec = parse_campaign(lever('{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_min = 2, '
                                'prompt_lookup_max = 4 }'))
    (lv,) = spec.levers
    assert "speculative" in LEVER_DEPLOYMENT_KEYS
    assert lv.changes() == {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                            "prompt_lookup_max": 4}}
    assert lv.quality_check is True  # speculation must not change greedy outputs: checked unless turned off
    applied = apply_lever(spec.deployment, [lv])
    assert spec.deployment.speculative is None
    assert applied.speculative.method == "ngram" and applied.speculative.label() == "ngram 2-4, k=3"
    off = parse_campaign(lever('{ method = "mtp", num_speculative_tokens = 1 }', "quality_check = false\n"))
    assert off.levers[0].quality_check is False
    plain = parse_campaign(BASE + '[[lever]]\nname = "eager"\nargs = { enforce-eager = true }\n')
    assert plain.levers[0].quality_check is False  # other levers keep the old default


def test_the_baseline_can_speculate_and_a_lever_replaces_it():
    spec = parse_campaign(BASE + 'speculative = { method = "mtp", num_speculative_tokens = 1 }\n'
                          '[[lever]]\nname = "eagle"\n'
                          'speculative = { method = "eagle3", num_speculative_tokens = 3, model = "/d" }\n')
    assert spec.deployment.speculative.label() == "mtp, k=1"
    applied = apply_lever(spec.deployment, spec.levers).speculative
    assert (applied.method, applied.num_speculative_tokens, applied.model) == ("eagle3", 3, "/d")
    dep = deployment_from_dict({"engine": "sglang", "model": "/m",
                                "speculative": {"method": "eagle", "num_speculative_tokens": 2, "model": "/e"}},
                               "d.toml")
    assert dep.speculative.label() == "eagle, k=2"


@pytest.mark.parametrize(("table", "message"), [
    ('{ method = "ngram", num_speculative_tokens = 3, lookup_max = 4 }',
     r'lever #1 "spec"\.speculative: no key \'lookup_max\' \(did you mean \'prompt_lookup_max\'\?\): speculative '
     r"takes method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model"),
    ('{ method = "medusa", num_speculative_tokens = 3 }',
     r"speculative\.method: Input should be 'ngram', 'mtp', 'eagle' or 'eagle3' \(got 'medusa'\)"),
    ('{ method = "ngram", num_speculative_tokens = 0 }',
     r"speculative\.num_speculative_tokens: Input should be greater than or equal to 1"),
    ('{ method = "ngram" }', r"speculative\.num_speculative_tokens: required key is missing"),
    ('{ method = "ngram", num_speculative_tokens = true }', r"num_speculative_tokens: Input should be a valid integer"),
    ('{ method = "eagle", num_speculative_tokens = 2 }', r"method 'eagle' drafts with an EAGLE head: give its weights"),
    ('{ method = "mtp", num_speculative_tokens = 2, prompt_lookup_max = 3 }',
     r"prompt_lookup_max is an ngram setting \(prompt lookup\), and method is 'mtp'"),
    ('{ method = "ngram", num_speculative_tokens = 2, prompt_lookup_min = 5, prompt_lookup_max = 3 }',
     r"prompt_lookup_min \(5\) is above prompt_lookup_max \(3\): swap them"),
    ('{ method = "ngram", num_speculative_tokens = 2, model = "/d" }', r"with no draft model: drop `model`"),
    ('"ngram"', r"speculative: a table such as \{ method = \"ngram\", num_speculative_tokens = 3 \}, not str"),
])
def test_each_mistake_is_one_error_naming_the_key_and_the_fix(table, message):
    with pytest.raises(RooftopError, match=message) as info:
        parse_campaign(lever(table))
    assert info.value.problem.count("<campaign>:") == 1  # one line, not a cascade


def test_a_deployment_file_names_the_key_too():
    with pytest.raises(RooftopError, match=r"d\.toml: deployment\.speculative: no key 'steps'"):
        deployment_from_dict({"engine": "vllm", "speculative": {"method": "ngram", "num_speculative_tokens": 1,
                                                                 "steps": 2}}, "d.toml")
