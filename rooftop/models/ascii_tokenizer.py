"""A Hugging Face tokenizer of printable ASCII, one character a token, written as plain JSON files.

Every id the model can emit decodes to one printable character, and that character encodes back to
the same id, so a client's token count of streamed text equals the server's `usage`. The vocabulary
is the 95 printable characters (ids 0-94) and nothing else: no BOS, no EOS, no special token that a
model with random weights could sample and a decoder would drop. (An EOS id past the model's
vocabulary breaks vLLM's min_tokens, which bans that id in the logits.) Generation ends at max_tokens.
"""

import json
from pathlib import Path

PRINTABLE = [chr(c) for c in range(0x20, 0x7F)]  # ' ' .. '~'
MODEL_VOCAB = len(PRINTABLE)  # 95: the config's vocab_size
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def tokenizer_json() -> dict:
    """tokenizer.json: a BPE model with single characters and no merges (no pre-tokenizer: each
    character is a token), no added BOS, a Fuse decoder (tokens joined without spaces)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {ch: i for i, ch in enumerate(PRINTABLE)}, "merges": []},
    }


def tokenizer_config(max_length: int) -> dict:
    """tokenizer_config.json: the fast tokenizer class, no special tokens, a plain chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(directory: Path, max_length: int) -> list[Path]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json in `directory`."""
    files = {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(max_length),
        "special_tokens_map.json": {},
    }
    out = []
    for name, content in files.items():
        path = directory / name
        path.write_text(json.dumps(content, indent=1, ensure_ascii=True) + "\n")
        out.append(path)
    return out
