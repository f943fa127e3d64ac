"""The AOT load fix (integrations/vllm/aot_fix.py): feature-detected on this stack."""

from __future__ import annotations

from ray_stream_llm.integrations.vllm import aot_fix


def test_the_load_fix_is_feature_detected():
    """On this stack (vLLM 0.29 calls finalize_loading on every loaded artifact, torch's
    bundled artifact has none) the fix is needed; once applied it is not needed again,
    and it only adds a method that does nothing."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    had = "finalize_loading" in vars(cls)
    try:
        if not had:
            assert aot_fix.needs_fix()
        aot_fix.apply()
        assert not aot_fix.needs_fix()
        assert cls.finalize_loading(object.__new__(cls), None) is None
    finally:
        if not had and "finalize_loading" in vars(cls):
            del cls.finalize_loading
