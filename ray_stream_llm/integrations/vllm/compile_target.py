"""What compiled code is built for: the CPU instruction set torch and Inductor use
on this node, the accelerator and its compute capability, the torch and vLLM versions.

vLLM's CPU build compiles the model with Inductor, which emits C++ for the vector ISA it
picks (``torch._inductor.cpu_vec_isa.pick_vec_isa``: the widest that the CPU and the
compiler support, lowered by ``ATEN_CPU_CAPABILITY``: ``avx2`` picks AVX2 on an AMX
machine) and builds it with that ISA's flags; ATen's own kernels dispatch by
``torch.backends.cpu.get_cpu_capability()``. Neither vLLM's AOT key
(``aot_compile_hash_factors``) nor torch (torch 2.13's ``SystemInfo.check_compatibility``)
records the ISA, so an artifact compiled on an AVX-512/AMX node would load on an AVX2 node
and stop it with SIGILL; on CUDA, Triton's kernels are built for one compute capability.

:func:`target` is this process's answer. It names the engine's vLLM cache directory
(:func:`cache_root`: the engine actor sets ``VLLM_CACHE_ROOT`` to it, so vLLM's own key
finds only code built for this target), the store's key
(:func:`~ray_stream_llm.integrations.vllm.compile_store.cache_key`), and each shipped
artifact's marker, which a fetch compares with its own (:func:`mismatch`) before it unpacks
anything. Reading it never raises: a part that cannot be read is None.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import re
from typing import Any

logger = logging.getLogger(__name__)

# what each part of a target is called in a report, in order
LABELS = {
    "arch": "{}",
    "cpu_capability": "CPU {}",
    "vec_isa": "Inductor {}",
    "vec_isa_flags": "flags {!r}",
    "device": "device {}",
    "device_capability": "compute capability {}",
    "torch": "torch {}",
    "vllm": "vLLM {}",
}
# without these a target vouches for nothing (the store's key needs them)
REQUIRED = ("arch", "cpu_capability", "vec_isa", "device", "torch", "vllm")


def target() -> dict[str, str | None]:
    """What code compiled in this process is built for (read once per process): ``arch``
    (``x86_64``...), ``cpu_capability`` (ATen's: ``AVX512``, ``AVX2``, ``DEFAULT``...),
    ``vec_isa`` and ``vec_isa_flags`` (Inductor's pick and the compiler flags it builds
    with: ``avx512 avx512_vnni amx_tile``, ``avx2``, ``INVALID_VEC_ISA``), ``device``
    (vLLM's platform: ``cpu``, ``cuda``...) and ``device_capability`` (``9.0``; None on
    a CPU), the ``torch`` and ``vllm`` versions."""
    return dict(_target())


@functools.cache
def _target() -> dict[str, str | None]:
    found: dict[str, str | None] = dict.fromkeys(LABELS)
    found["arch"] = platform.machine() or None
    parts = {
        "torch": _torch,
        "cpu_capability": _cpu_capability,
        "vec_isa": _vec_isa,
        "device": _device,
        "vllm": _vllm,
    }
    for name, read in parts.items():
        try:
            found.update(read())
        except Exception:  # a torch or vLLM this code does not know: that part unknown
            logger.debug("compile target: %s not read", name, exc_info=True)
    return found


def _torch() -> dict[str, str | None]:
    import torch

    return {"torch": str(torch.__version__)}


def _cpu_capability() -> dict[str, str | None]:
    import torch

    return {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def _vec_isa() -> dict[str, str | None]:
    # Inductor's own choice; the first call in a process dry-compiles each ISA's probe
    # (cached in Inductor's cache directory, where Inductor reuses it)
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    return {"vec_isa": str(isa), "vec_isa_flags": str(isa.build_arch_flags())}


def _device() -> dict[str, str | None]:
    from vllm.platforms import current_platform

    capability = None
    if current_platform.device_type != "cpu":
        found = current_platform.get_device_capability()
        capability = found.as_version_str() if found is not None else None
    return {"device": str(current_platform.device_type), "device_capability": capability}


def _vllm() -> dict[str, str | None]:
    import vllm

    return {"vllm": str(vllm.__version__)}


def unknown(built_for: dict[str, str | None]) -> list[str]:
    """The parts of ``built_for`` a key needs that could not be read (an accelerator's
    compute capability among them)."""
    missing = [name for name in REQUIRED if not built_for.get(name)]
    if built_for.get("device") not in (None, "cpu") and not built_for.get("device_capability"):
        missing.append("device_capability")
    return missing


def digest(built_for: dict[str, str | None]) -> str:
    """A name for ``built_for`` (32 hex digits)."""
    return hashlib.sha256(json.dumps(built_for, sort_keys=True).encode()).hexdigest()[:32]


def target_id(built_for: dict[str, str | None]) -> str:
    """A short directory name for ``built_for``: ``cpu-avx512-<12 hex digits>``."""
    kind = built_for.get("device") or "unknown"
    level = built_for.get("device_capability") or built_for.get("cpu_capability") or "unknown"
    kind, level = (re.sub(r"[^a-z0-9.]+", "_", part.lower()) for part in (kind, level))
    return f"{kind}-{level}-{digest(built_for)[:12]}"


def cache_root(base: str | os.PathLike[str], built_for: dict[str, str | None]) -> str:
    """The vLLM cache directory (``VLLM_CACHE_ROOT``) of code built for ``built_for`` under
    ``base`` (the user's, or vLLM's default): ``<base>/<target_id>``. vLLM's own key
    leaves the target out, so code for each target lives under its own root. ``base``
    already ending in that name is returned as it is (a second start of one engine)."""
    name = target_id(built_for)
    base = os.fspath(base)
    return base if os.path.basename(os.path.normpath(base)) == name else os.path.join(base, name)


def describe(built_for: dict[str, Any], names: list[str] | None = None) -> str:
    """``CPU AVX2, Inductor avx2``: the parts ``names`` (all by default) of a target."""
    shown = []
    for name in names if names is not None else LABELS:
        value = built_for.get(name)
        text = str(value)[:120] if value is not None else "unknown"
        shown.append(LABELS[name].format(text))
    return ", ".join(shown)


def mismatch(recorded: Any, ours: dict[str, str | None]) -> str | None:
    """Why code built for ``recorded`` (what an artifact's marker says) must not run where
    ``ours`` holds, e.g. ``artifact for CPU AVX512, Inductor avx512 avx512_vnni amx_tile;
    this node CPU AVX2, Inductor avx2``; None when they are the same. A marker that
    records no target (written by an earlier version of this library) never matches."""
    if not isinstance(recorded, dict):
        return "the artifact records no target (shipped by an earlier ray-stream-llm)"
    differ = [name for name in LABELS if recorded.get(name) != ours.get(name)]
    if not differ:
        return None
    if "vec_isa" in differ and "vec_isa_flags" in differ:
        differ.remove("vec_isa_flags")  # the flags follow from the ISA
    return f"artifact for {describe(recorded, differ)}; this node {describe(ours, differ)}"
