"""Reproducible sampling."""
import random


def pick(items, k, seed=0):
    """k distinct items from any collection (lists, sets, ...), reproducibly."""
    rng = random.Random(seed)
    return sorted(rng.sample(items, k))


def shuffled(items, seed=0):
    rng = random.Random(seed)
    out = list(items)
    rng.shuffle(out)
    return out
