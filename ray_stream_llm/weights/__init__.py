"""Where an engine's weights come from, and the node memory they need: the node's shared
region (``region``: one pull per node from the store into ``/dev/shm``, read by every
engine of the node, kept warm on request) and the memory rules (``memory``: what a node,
a container or a pod can give a region, a KV cache and the streamer's buffer)."""
