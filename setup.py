"""tb-parity: find where a TF1 -> TF2 port first trains differently."""

from setuptools import find_packages, setup

setup(
    name="tb-parity",
    version="0.1.0",
    description="Compare a TF1 run with its TF2 port step by step; TensorBoard plugin, CLI and pytest API",
    packages=find_packages(include=["tb_parity_plugin", "tb_parity_plugin.*"]),
    package_data={"tb_parity_plugin": ["static/*"]},
    python_requires=">=3.9",
    # The reader, engine, CLI and plugin run without TensorFlow (as TensorBoard does);
    # only the logging shim needs it, via the [tf] extra.
    install_requires=[
        "tensorboard>=2.21,<2.22",
        "numpy>=1.26",
        "protobuf>=4.21",
        "werkzeug>=3.0",
        "google-crc32c>=1.5",
        # user patterns (overrides, mappings): RE2 cannot backtrack, so no pattern stalls the server
        "google-re2>=1.1",
    ],
    extras_require={
        "tf": ["tensorflow-cpu==2.21.*", "tf-keras==2.21.*"],
        # %tb_parity / notebook.show() and progress bars; ipywidgets turns the bar into a widget.
        "notebook": ["ipython>=8", "tqdm>=4.66"],
        # Remote logdirs (s3://, gs://, any fsspec URL): fsspec plus the protocol's client library.
        "remote": ["fsspec>=2024.2"],
        "s3": ["fsspec>=2024.2", "s3fs>=2024.2"],
        "gcs": ["fsspec>=2024.2", "gcsfs>=2024.2"],
        # `make lint`: ruff's rules change between minor versions, so stay on one (exact pins in requirements.txt).
        "dev": ["ruff>=0.17,<0.18", "mypy>=2.4,<3"],
        # The remote-logdir tests run a real S3-compatible server on loopback (moto's server mode).
        "test-remote": ["s3fs>=2024.2", "moto[s3]>=5", "flask>=3", "flask-cors>=4"],
    },
    entry_points={
        "tensorboard_plugins": ["tb_parity = tb_parity_plugin.dashboard.loader:ParityLoader"],
        "console_scripts": ["tb-parity = tb_parity_plugin.cli:main"],
    },
)
