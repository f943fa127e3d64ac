"""Ray's seam: registration with Ray's processor builder and the stage graph it builds
(``registry``, ``builder``, ``compat``, ``engine_stage``: every difference across the
supported Ray range, ``version``), the stage UDFs (``udfs``: the tokenizer side, which never
imports vLLM; ``engine_udf``: the engine stage), settings delivery through runtime_envs
(``runtime_env``), progress bars (``progress``) and what the driver reads back of the
cluster (``telemetry``: load reports, metrics, typed errors)."""
