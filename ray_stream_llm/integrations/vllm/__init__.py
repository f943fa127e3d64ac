"""vLLM's seam: what runs in vLLM's processes or touches vLLM's internals. The plugin vLLM
loads in each of its processes (``plugin``: the streamer's figures, the wait for the
node's region, the root cause of a failure), the streamer's log watch (``stream_watch``),
vLLM's shared memory and its clean-up (``shm``), and its compiled code (``compile_cache``:
loaded again, keyed by content, compiled once per node; ``compile_store``: shipped through
the store; ``compile_target``: the machine it is built for). Importing this package
imports no vLLM."""
