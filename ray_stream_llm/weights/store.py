"""An engine's weights streamed from the store: vLLM's Run:ai loader reads every file from
the model's URI (a :class:`~ray_stream_llm.weights.source.WeightSource`)."""

from __future__ import annotations

from ray_stream_llm.fetch import FetchReport
from ray_stream_llm.uri import ModelURI
from ray_stream_llm.weights.marks import PullRecord


class StoreWeights:
    """Every file streamed from the store."""

    def __init__(self, uri: ModelURI, fetched: FetchReport, sharing: str = "off"):
        self.uri, self.fetched, self.sharing = uri, fetched, sharing

    @property
    def model_weights(self) -> str:
        return str(self.uri)

    def prepare(self) -> StoreWeights:
        return self

    def sizes(self) -> dict[str, int]:
        return dict(self.fetched.streamable)

    def pull(self) -> PullRecord | None:
        return None

    def release(self) -> None:
        pass
