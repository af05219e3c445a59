"""Which logdirs are URLs (``s3://``, ``gs://``, ...) rather than local paths: decided once here."""

from __future__ import annotations


def is_url(logdir: str) -> bool:
    """True for ``scheme://...`` other than ``file://`` (which is read as a local path)."""
    scheme, sep, _ = logdir.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() != "file"
