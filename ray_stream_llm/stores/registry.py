"""The stores this library reads, one entry per URI scheme (a leaf: it imports nothing of
the package), and the settings every store shares."""

from __future__ import annotations

import dataclasses

TIMEOUT_ENV = "RAY_STREAM_LLM_STORE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0  # the driver's preflight: it fails fast, before any actor starts


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """What one URI scheme needs: the module that lists and reads it here, the client
    package that module imports, the streamer's backend package, and the pip line."""

    scheme: str
    module: str
    client_package: str
    streamer_package: str
    pip_line: str


# The one table keyed by scheme.
BACKENDS: dict[str, BackendSpec] = {
    spec.scheme: spec
    for spec in (
        BackendSpec(
            "s3",
            "ray_stream_llm.stores.s3",
            "boto3",
            "runai_model_streamer_s3",
            "pip install 'runai-model-streamer[s3]==0.17.1'",
        ),
        BackendSpec(
            "gs",
            "ray_stream_llm.stores.gcs",
            "google.cloud.storage",
            "runai_model_streamer_gcs",
            "pip install 'ray-stream-llm[gcs]'",
        ),
        # runai-model-streamer[azure]==0.17.1 asks for runai-model-streamer-azure==0.17.1, which
        # the package index does not have; 0.17.0 streams with the 0.17.1 streamer
        BackendSpec(
            "az",
            "ray_stream_llm.stores.azure",
            "azure.storage.blob",
            "runai_model_streamer_azure",
            "pip install 'ray-stream-llm[azure]'",
        ),
    )
}
