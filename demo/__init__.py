"""Demo: the migration guide's small dense model in TF1 and as a TF2 port, logged with tb-parity.

TF1-style layers need legacy Keras, which must be chosen before TensorFlow is imported.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
