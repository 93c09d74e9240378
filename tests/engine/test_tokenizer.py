from rooftop.engine.model.config import PRESETS
from rooftop.engine.tokenizer import ByteTokenizer


def test_encode_decode_round_trip_with_unicode():
    tok = ByteTokenizer()
    text = "héllo, 世界 🚀\n"
    ids = tok.encode(text)
    assert ids[0] == 256
    assert ids[1:] == list(text.encode("utf-8"))
    assert len(ids) == 1 + len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode("ab", add_bos=False) == [97, 98]


def test_decode_skips_specials_and_replaces_bad_utf8():
    tok = ByteTokenizer()
    assert tok.decode([256, 104, 105, 257, 258, 300]) == "hi"
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"


def test_stream_decoder_waits_for_whole_characters():
    tok = ByteTokenizer()
    feed = tok.stream_decoder()
    pieces = [feed(i) for i in tok.encode("a世", add_bos=False)]
    assert pieces == ["a", "", "", "世"]
    assert feed(257) == ""


def test_vocab_covers_specials():
    for config in PRESETS.values():
        assert config.vocab_size >= ByteTokenizer.num_ids
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (256, 257, 258)


def test_render_chat():
    tok = ByteTokenizer()
    prompt = tok.render_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert prompt == "system: be brief\nuser: hi\nassistant: "
