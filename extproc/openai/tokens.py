"""Token counting without a tokenizer: a calibrated character-ratio estimate.

A per-model `tokenizers` file replaces this in the scheduler work; until then routing only needs
an order of magnitude (admission estimates and long-prompt rules).
"""

from __future__ import annotations

# English text with BPE tokenizers of the Llama-3 / GPT-4 family averages ~4 characters per token.
CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    return max(1, int(len(text) / chars_per_token + 0.5)) if text else 0


def estimate_chars(chars: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """The same estimate for a character count."""
    return max(1, int(chars / chars_per_token + 0.5)) if chars else 0
