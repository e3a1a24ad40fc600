import pytest

from legacykit import media

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
GIF = b"GIF89a" + b"\0" * 16


def test_png():
    assert media.image_kind(PNG) == "png"


def test_gif():
    assert media.image_kind(GIF) == "gif"


def test_unknown_bytes():
    assert media.image_kind(b"hello world, not an image") is None


@pytest.mark.parametrize("header,value,params", [
    ("text/html; charset=UTF-8", "text/html", {"charset": "UTF-8"}),
    ("Application/JSON", "application/json", {}),
    ('multipart/form-data; boundary="abc"', "multipart/form-data", {"boundary": "abc"}),
])
def test_content_type(header, value, params):
    assert media.content_type(header) == (value, params)


def test_charset_default():
    assert media.charset("text/plain") == "utf-8"
