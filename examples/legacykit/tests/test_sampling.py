from legacykit import sampling


def test_pick_from_a_list_is_reproducible():
    assert sampling.pick(list(range(100)), 5, seed=1) == sampling.pick(list(range(100)), 5, seed=1)


def test_pick_from_a_set():
    got = sampling.pick({"a", "b", "c", "d"}, 2, seed=3)
    assert len(got) == 2 and set(got) <= {"a", "b", "c", "d"}


def test_shuffled_keeps_items():
    assert sorted(sampling.shuffled([3, 1, 2])) == [1, 2, 3]
