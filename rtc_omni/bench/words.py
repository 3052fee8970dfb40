"""Word error rate: how far a transcript is from what was said, word by word; and the sentences the
recogniser's benchmarks and tests have espeak-ng say."""

from __future__ import annotations

import re

SENTENCES = [
    "What colour is this?",
    "Tell me what you can hear.",
    "The quick brown fox jumps over the lazy dog.",
    "Please describe the picture on the table.",
    "How many people are standing in the kitchen?",
    "I would like to book a flight to Paris tomorrow morning.",
    "Turn the lights off in the living room.",
    "My favourite number is seven and my favourite colour is green.",
]
SPELLINGS = {"colour": "color", "favourite": "favorite"}  # British and American spellings count as one


def normalised(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return [SPELLINGS.get(word, word) for word in re.findall(r"[a-z0-9']+", text.lower())]


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Substitutions, deletions and insertions: the word-level edit distance."""
    row = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp_word in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref_word != hyp_word))
    return row[-1]
