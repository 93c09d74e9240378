"""Model directories without downloads: real architectures' configs, an ASCII tokenizer whose counts round-trip."""

import json
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from rooftop.errors import RooftopError
from rooftop.models import ARCHS, PRESETS, init_model_dir, model_config
from rooftop.roofline.config import load_model_shape


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_configs_read_as_their_architecture(arch, preset, tmp_path):
    init_model_dir(tmp_path, arch, preset)
    cfg = json.loads((tmp_path / "config.json").read_text())
    shape = load_model_shape(tmp_path / "config.json")
    assert shape.vocab_size == cfg["vocab_size"] == 95 and shape.num_layers == cfg["num_hidden_layers"]
    if arch == "deepseek_v2":  # the only latent vLLM's CPU MLA backend takes, at every size
        assert shape.attention == "mla" and (shape.kv_lora_rank, shape.qk_rope_head_dim) == (512, 64)
    assert shape.is_moe == (arch != "llama")


def test_every_token_decodes_to_one_character_and_back(tmp_path):
    init_model_dir(tmp_path, "llama")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 95  # nothing a model could sample that a decoder would drop
    rng = random.Random(0)
    ids = [rng.randrange(95) for _ in range(500)]
    text = tok.decode(ids)
    assert len(text) == 500 and tok.encode(text, add_special_tokens=True).ids == ids


def test_bad_choices_and_an_existing_config_are_clear_errors(tmp_path):
    with pytest.raises(RooftopError, match="unknown architecture 'gpt5' — use one of: llama, qwen3_moe, deepseek_v2"):
        model_config("gpt5", "tiny")
    with pytest.raises(RooftopError, match="unknown preset 'huge'"):
        model_config("llama", "huge")
    init_model_dir(tmp_path, "llama")
    with pytest.raises(RooftopError, match="already exists .* --force"):
        init_model_dir(tmp_path, "qwen3_moe")
    init_model_dir(tmp_path, "qwen3_moe", force=True)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_cli_writes_a_directory_and_refuses_an_unknown_architecture(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "rooftop", "model", "init", "--arch", "deepseek_v2", str(tmp_path / "m")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and (tmp_path / "m" / "tokenizer.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "rooftop", "model", "init", "--arch", "mamba", str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown architecture 'mamba'" in bad.stderr and "Traceback" not in bad.stderr
