"""Shared pytest setup: TF1-style layers need legacy Keras, set before TF is imported."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
