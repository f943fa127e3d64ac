"""Loaded (through PYTHONPATH) only by the processes of tests/e2e/test_reporters_script.py's
control: Ray 2.48's own downloader creates ``pyarrow.fs.S3FileSystem()`` with no
endpoint, and pyarrow reads no endpoint variable, so on its own it reaches only AWS.
This points it at the local S3 server ($AWS_ENDPOINT_URL), as AWS itself would be
reached; what Ray downloads, and where it writes it, is Ray's own code, unchanged."""

import os

import pyarrow.fs

_S3FileSystem = pyarrow.fs.S3FileSystem


def _local_s3(*args, **kwargs):
    kwargs.setdefault("endpoint_override", os.environ["AWS_ENDPOINT_URL"])
    kwargs.setdefault("region", os.environ.get("AWS_REGION", "us-east-1"))
    return _S3FileSystem(*args, **kwargs)


if os.environ.get("AWS_ENDPOINT_URL"):
    pyarrow.fs.S3FileSystem = _local_s3
