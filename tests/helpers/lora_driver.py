"""A user's LoRA batch script, run by tests/e2e/test_lora.py in an isolated environment.

Usage: python lora_driver.py SPEC_JSON OUT_JSON
SPEC_JSON: {"model": uri, "lora_path": uri, "adapters": [names], "questions": [...],
            "max_tokens": int, "ray_temp_dir": path, "object_store": {ObjectStoreConfig fields}}
Every question is asked of the base model (the row's ``model`` is the model's URI) and of
each adapter (the row's ``model`` is its sub-folder name), greedy; the store is set only in
the config (the script's environment holds no AWS variable).
"""

import json
import sys
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import os

    import ray

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, build_llm_processor
    from ray_stream_llm.commands import LOCAL_ENV
    from ray_stream_llm.stores.settings import ObjectStoreConfig
    from ray_stream_llm.tools.job import CPU_ENGINE_KWARGS

    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=spec["ray_temp_dir"])
    config = StreamingvLLMEngineProcessorConfig(
        model_source=spec["model"],
        engine_kwargs={
            **CPU_ENGINE_KWARGS,
            "load_format": "runai_streamer",
            "enable_lora": True,
            "max_lora_rank": 8,
            "max_loras": 2,
            "max_model_len": 256,
            # one sequence at a time: every row is computed alone, whatever rows run beside it
            "max_num_seqs": 1,
        },
        dynamic_lora_loading_path=spec["lora_path"],
        object_store=ObjectStoreConfig(**spec["object_store"]),
        batch_size=8,
        concurrency=1,
    )
    max_tokens = spec["max_tokens"]
    processor = build_llm_processor(
        config,
        preprocess=lambda row: dict(
            model=row["model"],
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        ),
        postprocess=lambda row: dict(
            question=row["question"],
            model=row["model"],
            answer=row["generated_text"],
            tokens=list(row["generated_tokens"]),
        ),
    )
    names = [spec["model"], *spec["adapters"]]
    items = [{"question": q, "model": m} for q in spec["questions"] for m in names]
    rows = [dict(r) for r in processor(ray.data.from_items(items)).iter_rows()]
    ray.shutdown()
    Path(sys.argv[2]).write_text(json.dumps({"rows": rows}))


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
