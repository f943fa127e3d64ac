"""Tools around the library, not part of it: the embedded local S3 store, the demo and its
model, the benchmarks, the job runner and the reference generator (the ``run`` and
``shard`` commands are product: :mod:`ray_stream_llm.commands`). Their extra
dependencies are in the ``[tools]`` extra."""
