"""The inverted-pair count of the order check, against a count of every pair."""

from __future__ import annotations

import itertools
import random

import pytest

from chaos.verdict import inverted_pairs


def every_pair(seqs: list[int]) -> int:
    return sum(1 for a, b in itertools.combinations(seqs, 2) if a > b)


@pytest.mark.parametrize(
    ("seqs", "expected"),
    [([], 0), ([5], 0), ([1, 2, 3], 0), ([2, 1], 1), ([3, 2, 1], 3), ([1, 30, 2, 40, 3], 3)],
)
def test_known_counts(seqs: list[int], expected: int) -> None:
    assert inverted_pairs(seqs) == expected


@pytest.mark.parametrize("seed", range(30))
def test_matches_every_pair_on_shuffled_seqs(seed: int) -> None:
    rng = random.Random(seed)
    seqs = rng.sample(range(1, 500), rng.randint(2, 120))  # gaps, like seqs of one SKU
    rng.shuffle(seqs)
    assert inverted_pairs(seqs) == every_pair(seqs)


def test_one_entry_moved_to_the_end_inverts_a_pair_with_each_it_let_pass() -> None:
    assert inverted_pairs([*range(2, 101), 1]) == 99
