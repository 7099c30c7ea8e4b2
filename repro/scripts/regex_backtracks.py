"""Defect: a regular expression that backtracks for ever on one record.

A plain training script (no nsadiag import). Each record of the corpus is checked by
`is_clean`, whose pattern `^(\\w+\\s?)+$` nests one repetition inside another: on a long
run of words that ends in a character the pattern refuses, the regex engine tries every
way of splitting the words between the two repetitions, which takes longer than the age of
the universe. The first such record arrives after a few steps; from then on the main thread
spins inside `re.fullmatch` (native code: no Python line moves).

Expected verdict: STALL-BUSY; the line is the `fullmatch` call in `is_clean`, not the loop
over records; Next: rewrite the pattern without the nested repetition:

    nsadiag run --stall-timeout 5 -- python repro/scripts/regex_backtracks.py
"""

import re

import torch
from torch import nn

WORDS = re.compile(r"^(\w+\s?)+$")


def is_clean(text: str) -> bool:
    return WORDS.fullmatch(text) is not None


def records():
    for i in range(10_000):
        if i == 200:  # a scraped line: many words, then a character the pattern refuses
            yield "lorem ipsum dolor sit amet consectetur adipiscing elit sed do " * 3 + "!"
        else:
            yield f"record {i} holds a few plain words"


def main() -> None:
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for text in records():
        if not is_clean(text):
            continue
        x = torch.full((4, 8), float(len(text)) / 100)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("trained")


if __name__ == "__main__":
    main()
