"""Recognising image data and parsing content types."""
import cgi
import imghdr


def image_kind(data):
    """'png', 'gif', 'jpeg', ... for image bytes; None when unknown."""
    return imghdr.what(None, h=data)


def content_type(header):
    """('text/html', {'charset': 'utf-8'}) from a Content-Type header."""
    value, params = cgi.parse_header(header)
    return value.lower(), params


def charset(header, default="utf-8"):
    return content_type(header)[1].get("charset", default)
