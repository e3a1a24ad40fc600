"""The `volume` and `async_volume` fixtures of E2B's volume file tests, made real.

E2B's own fixtures (the suite's conftest.py) answer every content call with an in-process mock.
Beside this file, forkbox's test puts E2B's `test_file.py` files unchanged; their volumes are
made, written, read and destroyed on the daemon the environment names (E2B_DOMAIN and
E2B_API_KEY), through E2B's published SDK and nothing else.
"""

import random
import string

import pytest
import pytest_asyncio

from e2b import AsyncVolume, Volume


def _name() -> str:
    tail = "".join(random.choices(string.ascii_lowercase + string.digits, k=8))
    return f"test-vol-{tail}"


@pytest.fixture
def volume(request) -> Volume:
    vol = Volume.create(_name())
    request.addfinalizer(lambda: Volume.destroy(vol.volume_id))
    return vol


@pytest_asyncio.fixture
async def async_volume():
    vol = await AsyncVolume.create(_name())
    yield vol
    await AsyncVolume.destroy(vol.volume_id)
