"""What the tokenizer-side stage UDFs share with the engine UDF
(ray_stream_llm/integrations/ray/udfs.py): secrets that never show, the model handed on as
it is without a plan, and Ray's UDF classes named for pickling by reference."""

from __future__ import annotations

import logging
import os

import pytest

from ray_stream_llm.integrations.ray import udfs
from ray_stream_llm.integrations.ray.compat import TokenizeUDF

SECRET = "s3cr3t-VALUE-5a4b"


@pytest.fixture
def package_logger():
    """``_prepare`` sets up the actor's logging: the package logger is restored after."""
    package = logging.getLogger("ray_stream_llm")
    level, handlers = package.level, list(package.handlers)
    yield
    package.setLevel(level)
    package.handlers[:] = handlers


def test_secrets_are_applied_and_never_shown(monkeypatch, package_logger):
    monkeypatch.delenv("RSL_TEST_SECRET", raising=False)
    secret = udfs.SecretEnv({"RSL_TEST_SECRET": SECRET})
    assert SECRET not in repr(secret) and "RSL_TEST_SECRET" in repr(secret)
    assert udfs._prepare(secret, None, "org/model") == "org/model"  # no plan: as it is
    assert os.environ["RSL_TEST_SECRET"] == SECRET


def test_a_model_that_is_not_a_uri_is_handed_on_as_it_is(tmp_path):
    assert udfs.local_metadata(str(tmp_path)) == str(tmp_path)
    assert udfs.local_metadata("org/model") == "org/model"
    assert udfs.local_metadata(None) is None


def test_each_streaming_stage_is_rays_stage_under_a_module_attribute_of_its_name():
    cls = udfs.StreamingTokenizeUDF
    assert issubclass(cls, TokenizeUDF)
    assert cls.__name__ == "StreamingTokenizeUDF" and cls.__module__ == udfs.__name__
    assert getattr(udfs, cls.__qualname__) is cls  # what pickle looks up
