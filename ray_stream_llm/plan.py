"""What the driver resolves once when it builds a streamed processor: the :class:`Plan`
every stage UDF gets as one constructor argument (``plan=``). Nothing downstream parses the
model's URI again or decides sharing or the retry policy again; a stage without a plan
(Ray's own load path) does not stream.
"""

from __future__ import annotations

import dataclasses

from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights.region import Sharing


@dataclasses.dataclass(frozen=True)
class Plan:
    """A streamed processor's decisions, made on the driver."""

    uri: ModelURI  # the model, parsed and checked once
    sharing: Sharing = dataclasses.field(default_factory=lambda: Sharing("off"))
    load_retries: int = 0  # engine starts retried when the weights were the problem
    load_retry_backoff_s: float = 0.0
    compile_cache_uri: str | None = None  # vLLM's compiled artifacts shipped through here
    weight_checksums: bool = False  # each engine process records what it holds, once loaded

    @property
    def model(self) -> str:
        """The model's URI as text (what the stages hand Ray as ``model``)."""
        return str(self.uri)

    @property
    def shares(self) -> bool:
        """Whether the engines of a node share one pull of the weights."""
        return self.sharing.mode == "node"
