"""Every touch of Ray's and vLLM's internals, so that a Ray or vLLM upgrade changes this
package only: registration with Ray's processor builder, the stage UDFs, settings
delivery through runtime_envs, progress bars, metrics and the cluster KV, the vLLM
plugin that measures the streamer, and the shared-memory clean-up. Nothing outside
this package imports ``ray.llm._internal``, ``ray._private`` or vLLM.
"""

from ray_stream_llm import fetch as _fetch
from ray_stream_llm.integrations.ray import progress as _progress

_fetch.register_progress(_progress.fetch_bar)  # the core imports nothing from here
