from __future__ import annotations

import os
import subprocess
import sys

from extproc.sim.tokens import FILLER_WORDS, Tokenizer, block_hashes, render_chat

VOCAB = 128_256


def test_encoding_is_deterministic_across_instances_and_processes() -> None:
    text = "Hello, world! The quick brown fox 12345 internationalization"
    ids = Tokenizer(VOCAB).encode(text)
    assert ids == Tokenizer(VOCAB).encode(text)
    code = f"from extproc.sim.tokens import Tokenizer; print(Tokenizer({VOCAB}).encode({text!r}))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == str(ids)


def test_ids_stay_inside_the_vocabulary_and_specials_sit_at_the_top() -> None:
    tok = Tokenizer(VOCAB)
    ids = tok.encode("<|im_start|>user\nsome words, and 42 things<|im_end|>")
    assert all(0 <= t < VOCAB for t in ids)
    assert ids[0] >= VOCAB - 256 and ids[-1] >= VOCAB - 256
    assert all(t < VOCAB - 256 for t in ids[1:-1])


def test_roughly_one_token_per_english_word() -> None:
    text = " ".join(["the model serves a request from the queue"] * 50)
    count = len(Tokenizer(VOCAB).encode(text))
    assert 350 <= count <= 500


def test_text_prefix_gives_token_prefix() -> None:
    tok = Tokenizer(VOCAB)
    base = "System prompt: you are helpful. " * 20
    a = tok.encode(base + "First question?")
    b = tok.encode(base + "Second, different question!")
    # The last piece of the prefix (here its trailing space) may merge with what follows.
    common = tok.encode(base)[:-1]
    assert len(common) > 100
    assert a[: len(common)] == common and b[: len(common)] == common
    assert a != b


def test_decode_inverts_encode_for_seen_text() -> None:
    tok = Tokenizer(VOCAB)
    text = "<|im_start|>user\nWhat's up?  Fine.\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([7, 8]) == "<|7|><|8|>"  # ids nobody produced have no text


def test_generated_text_retokenizes_to_the_generated_ids() -> None:
    tok = Tokenizer(VOCAB)
    pieces, ids = tok.generate(200, seed=3)
    assert len(pieces) == len(ids) == 200
    assert Tokenizer(VOCAB).encode("".join(pieces)) == ids
    assert pieces[0] in FILLER_WORDS and pieces[1].startswith(" ")
    assert tok.generate(200, seed=3) == (pieces, ids)
    assert tok.generate(200, seed=4)[1] != ids


def test_chat_template_extends_prefix_across_turns() -> None:
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    second = [*first, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    one = render_chat(first, add_generation_prompt=True)
    two = render_chat(second)
    assert one.endswith("<|im_start|>assistant\n")
    assert two.startswith(one + "Hello<|im_end|>")
    tok = Tokenizer(VOCAB)
    assert tok.encode(two)[: len(tok.encode(one))] == tok.encode(one)


def test_chat_template_handles_content_parts() -> None:
    text = render_chat([{"role": "user", "content": [{"type": "text", "text": "look"},
                                                      {"type": "image_url", "image_url": {"url": "x"}}]}])
    assert "look<|image|>" in text


def test_block_hashes_chain_and_ignore_partial_blocks() -> None:
    ids = list(range(100, 150))  # 3 full blocks of 16 plus 2 tokens
    hashes = block_hashes(ids, 16)
    assert len(hashes) == 3
    changed_first = block_hashes([0, *ids[1:]], 16)
    assert all(x != y for x, y in zip(hashes, changed_first, strict=True))
    changed_third = [*ids[:40], 0, *ids[41:]]
    assert block_hashes(changed_third, 16)[:2] == hashes[:2]
    assert block_hashes(changed_third, 16)[2] != hashes[2]
    assert block_hashes([*ids[:48], 1, 2, 3], 16) == hashes


def test_block_hashes_salt_and_parent_continuation() -> None:
    ids = list(range(64))
    assert block_hashes(ids, 16, salt="adapter") != block_hashes(ids, 16)
    whole = block_hashes(ids, 16)
    head = block_hashes(ids[:32], 16)
    assert head + block_hashes(ids[32:], 16, parent=head[-1]) == whole
