"""The AOT load fix, applied only in this library's engines (the plugin's ``register``).

vLLM 0.29 saves each engine's torch.compile result as an AOT artifact and, on the next
start, loads it in ``vllm.compilation.decorators._try_load_aot_compiled_fn``, which calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`` unconditionally. Only
vLLM's own ``VllmSerializableFunction`` has ``finalize_loading``; the CPU build compiles
with the ``"inductor"`` backend, whose artifact torch wraps in
``torch._dynamo.aot_compile_types.BundledAOTAutogradSerializableCallable``, which forwards
unknown attributes to the inner function: every load fails ("Compiling model again due to
a load failure") and compiles again. That artifact needs no finalising, so :func:`apply`
gives the class a ``finalize_loading`` that does nothing, only where vLLM calls it and
torch's class lacks it (feature-detected: a vLLM that checks first, or a torch that has
one, is left as it is). ``RAY_STREAM_LLM_AOT_LOAD_FIX=0`` turns it off.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

FIX_ENV = "RAY_STREAM_LLM_AOT_LOAD_FIX"


def _finalize_nothing(self: Any, vllm_config: Any) -> None:
    """Torch's bundled AOTAutograd artifact is complete once deserialised."""


def needs_fix() -> bool:
    """Whether this vLLM calls ``finalize_loading`` on every loaded artifact and torch's
    ``BundledAOTAutogradSerializableCallable`` (what the ``inductor`` backend's artifacts
    load as) has none of its own."""
    if os.environ.get(FIX_ENV, "1") == "0":
        return False
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
        from vllm.compilation import decorators
    except ImportError:
        return False
    loader = getattr(decorators, "_try_load_aot_compiled_fn", None)
    if loader is None:
        return False
    try:
        source = inspect.getsource(inspect.unwrap(loader))  # under the claim wrapper, if set
    except (OSError, TypeError):
        return False
    calls = "compiled_fn.finalize_loading(" in source
    # the class's own attributes: its __getattr__ would forward a lookup on an instance
    mro = BundledAOTAutogradSerializableCallable.__mro__
    has_own = any("finalize_loading" in vars(k) for k in mro)
    return calls and not has_own


def apply() -> bool:
    """Apply the load fix where it is needed (idempotent); whether it was applied now."""
    if not needs_fix():
        return False
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    cls.finalize_loading = _finalize_nothing
    return True
