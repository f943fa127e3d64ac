"""A user's resumable batch script, run by tests/e2e/test_resume.py in its own process.

Usage: python resume_job.py SPEC_JSON
SPEC_JSON: {"model": uri, "input": dir of JSONL files, "output": dir, "checkpoint": path,
            "num_cpus": int, "ray_temp_dir": path, "compile_cache_uri": uri | null,
            "report": path, "config": {more StreamingvLLMEngineProcessorConfig fields}}
Ray Data's job checkpointing (``ray.data.checkpoint.CheckpointConfig``, ``id_column="id"``)
around the library's processor: ``read_json`` of the input's files, the processor,
``write_parquet``; the engines' load reports (and their log lines) are written to ``report``
at the end.
"""

import json
import sys
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import ray
    from ray.data.checkpoint import CheckpointConfig
    from ray.data.llm import build_processor

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, load_reports

    ray.init(
        num_cpus=spec["num_cpus"],
        include_dashboard=False,
        _temp_dir=spec["ray_temp_dir"],
    )
    ray.data.DataContext.get_current().checkpoint_config = CheckpointConfig(
        id_column="id", checkpoint_path=spec["checkpoint"], delete_checkpoint_on_success=False
    )
    config = StreamingvLLMEngineProcessorConfig(
        model_source=spec["model"],
        engine_kwargs={"load_format": "runai_streamer", "dtype": "bfloat16", "seed": 0},
        batch_size=4,
        concurrency=1,
        compile_cache_uri=spec.get("compile_cache_uri"),
        **spec.get("config", {}),
    )
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0.0, max_tokens=4),
        ),
        postprocess=lambda row: dict(id=row["id"], answer=row["generated_text"]),
    )
    processor(ray.data.read_json(spec["input"])).write_parquet(spec["output"])
    reports = [{**r.to_dict(), "line": r.log_line()} for r in load_reports()]
    Path(spec["report"]).write_text(json.dumps(reports))
    ray.shutdown()


if __name__ == "__main__":
    main()
