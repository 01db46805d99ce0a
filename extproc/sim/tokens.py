"""A cheap deterministic tokenizer, a chat template and vLLM-style chained KV block hashes.

There is no real vocabulary: text is cut into GPT-2-like pieces (special tokens, words with their
leading space, short digit runs, punctuation runs, whitespace) and each piece's id is a keyed blake2b
hash, so ids are identical in every process. A text prefix therefore maps to a token-id prefix
(except possibly its last, unfinished piece), which is what prefix caching and affinity rely on.
"""

from __future__ import annotations

import hashlib
import random
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

__all__ = [
    "FILLER_WORDS",
    "ChatTemplateError",
    "Tokenizer",
    "block_hashes",
    "render_chat",
]

# Bounded repeats stand in for BPE merges: an English word of up to 10 letters is one token, longer
# ones split; other scripts get about two characters per token. One regex pass, no Python loop.
_PIECE = re.compile(
    r"<\|[a-z_]+\|>"  # special tokens
    r"| ?[A-Za-z]{1,10}"
    r"| ?[^\W\d_A-Za-z]{1,2}"  # letters outside ASCII
    r"| ?\d{1,3}"
    r"| ?[^\s\w<]{1,4}"  # punctuation runs
    r"|<|_{1,8}"
    r"|\s{1,8}(?!\S)|\s{1,8}"  # whitespace, leaving one space to start the next word
)
_SPECIAL_IDS = 256  # the top of the vocabulary is reserved for <|...|> specials
_REVERSE_LIMIT = 200_000

FILLER_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "at", "by",
    "be", "this", "from", "or", "are", "an", "but", "not", "have", "you", "they", "we", "his", "her",
    "can", "one", "all", "were", "there", "when", "which", "will", "their", "out", "more", "about",
    "into", "some", "time", "data", "model", "token", "cache", "batch", "queue", "block", "prefix",
    "layer", "route", "pool", "node", "edge", "graph", "value", "delta", "stream", "signal", "vector",
    "matrix", "kernel", "tensor", "engine", "serve", "request", "answer", "reply", "policy", "tenant",
    "limit", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "light", "river", "stone",
    "cloud", "field", "green", "ocean", "north", "south", "east", "west", "summer", "winter", "spring",
    "autumn", "garden", "window", "mirror", "silver", "golden", "simple", "steady", "gentle", "bright",
    "system", "memory", "network", "latency", "region", "cluster", "server", "client", "gateway",
    "proxy", "filter", "scorer",
)


class ChatTemplateError(ValueError):
    """A `messages` list that cannot be rendered."""


class Tokenizer:
    """Maps text to token ids and back; one instance per replica (it keeps bounded memo tables)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._ids: dict[str, int] = {}
        self._pieces: dict[int, str] = {}
        self._seed_filler()

    def _seed_filler(self) -> None:
        for word in FILLER_WORDS:
            self.piece_id(word)
            self.piece_id(" " + word)

    def piece_id(self, piece: str) -> int:
        token_id = self._ids.get(piece)
        if token_id is None:
            digest = int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(), "little")
            if piece.startswith("<|") and piece.endswith("|>"):
                token_id = self.vocab_size - _SPECIAL_IDS + digest % _SPECIAL_IDS
            else:
                token_id = digest % (self.vocab_size - _SPECIAL_IDS)
            if len(self._ids) >= _REVERSE_LIMIT:
                self._ids.clear()
                self._pieces.clear()
                self._seed_filler()
            self._ids[piece] = token_id
            self._pieces[token_id] = piece
        return token_id

    def pieces(self, text: str) -> list[str]:
        pieces: list[str] = _PIECE.findall(text)
        return pieces

    def encode(self, text: str) -> list[int]:
        pieces = self.pieces(text)
        ids: list[int | None] = list(map(self._ids.get, pieces))
        if None not in ids:
            return cast(list[int], ids)
        piece_id = self.piece_id
        return [piece_id(p) if t is None else t for t, p in zip(ids, pieces, strict=True)]

    def decode(self, token_ids: Iterable[int]) -> str:
        """Exact for ids this tokenizer produced recently; unknown ids render as `<|id|>`."""
        pieces = self._pieces
        return "".join(pieces.get(t, f"<|{t}|>") for t in token_ids)

    def generate(self, count: int, seed: int) -> tuple[list[str], list[int]]:
        """`count` filler tokens whose text re-tokenizes to exactly the returned ids."""
        rng = random.Random(seed)
        words = rng.choices(FILLER_WORDS, k=count)
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        ids = self._ids
        return pieces, [ids[p] for p in pieces]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise ChatTemplateError("message content parts must be objects")
            kind = part.get("type")
            if kind == "text":
                parts.append(str(part.get("text", "")))
            elif kind in ("image_url", "input_image", "image"):
                parts.append("<|image|>")
            elif kind in ("input_audio", "audio_url"):
                parts.append("<|audio|>")
            else:
                raise ChatTemplateError(f"unsupported content part type {kind!r}")
        return "".join(parts)
    raise ChatTemplateError("message content must be a string, a list of parts or null")


def render_chat(
    messages: Sequence[Any],
    *,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """ChatML-like rendering; identical message prefixes give identical text prefixes."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    chunks: list[str] = []
    if tools:
        names = ", ".join(str(t.get("function", {}).get("name", "?")) for t in tools if isinstance(t, dict))
        chunks.append(f"<|im_start|>system\nTools available: {names}<|im_end|>\n")
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string role")
        text = _content_text(message.get("content"))
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                function = call.get("function") or {}
                text += f"\n<|tool_call|>{function.get('name', '')}({function.get('arguments', '')})"
        chunks.append(f"<|im_start|>{message['role']}\n{text}")
        if not (continue_final_message and i == last):
            chunks.append("<|im_end|>\n")
    if add_generation_prompt and not continue_final_message:
        chunks.append("<|im_start|>assistant\n")
    return "".join(chunks)


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str = "", parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks: h_i = H(h_{i-1}, salt, ids of block i), like vLLM.

    The salt carries what must separate caches with equal tokens (vLLM keys blocks by LoRA adapter).
    """
    raw = array("I", token_ids).tobytes()
    width = block_size * 4
    key = salt.encode()
    out: list[int] = []
    for start in range(0, (len(token_ids) // block_size) * width, width):
        h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8, key=key[:64])
        h.update(raw[start : start + width])
        parent = int.from_bytes(h.digest(), "little")
        out.append(parent)
    return out
