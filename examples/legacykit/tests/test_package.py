import legacykit


def test_version_string():
    assert legacykit.__version__.count(".") == 2
