"""KubeRay RayJob entrypoint: batch answers from a model streamed from S3, one pull per GPU node.

Runs on the head pod of ``rayjob.yaml`` (beside this file), mounted there from the
ConfigMap ``rsl-kuberay-entrypoint``; see README.md. The store settings are in every pod's
environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` from the
Secret ``rsl-object-store``), the standard AWS way, so the config names no store.

With ``weight_sharing="node"`` each worker pod's first stage actor pulls the weights once
into ``/dev/shm/ray_stream_llm/`` (the pod's memory-backed ``/dev/shm``), and the pod's 8
engines stream from there. "node" fails (``WeightSharingError``, naming the sizes) rather
than fall back to 8 reads of the store per pod when the pod's memory or /dev/shm cannot hold
the weights: ``rayjob.yaml`` is sized for ``MODEL_WEIGHT_BYTES`` below.

Environment: ``RSL_NUM_PROMPTS`` (default 1000) and ``RSL_OUTPUT_URI`` (Parquet written there,
e.g. ``s3://results/llama-8b/``; default: print a few rows).
"""

from __future__ import annotations

import os
import sys

# --- what rayjob.yaml is sized for (README.md, "Sizing") ---------------------------------
# (tests/unit/project/test_kuberay.py checks it)
MODEL_URI = "s3://models/Llama-3.1-8B-Instruct/"
# The bytes of the model's *.safetensors, `ray-stream-llm inspect`'s weight_bytes; for
# meta-llama/Llama-3.1-8B-Instruct: 4,976,698,672 + 4,999,802,720 + 4,915,916,176
# + 1,168,138,808 (its four shards, bf16).
MODEL_WEIGHT_BYTES = 16_060_556_376
WORKER_NODES = 2  # the worker group's replicas
GPUS_PER_NODE = 8  # nvidia.com/gpu of each worker pod: one engine per GPU


def main() -> int:
    import ray
    from ray.data.llm import build_processor

    from ray_stream_llm import StreamingvLLMEngineProcessorConfig, inspect_model, load_reports

    # Before any pod pulls: a model larger than the pods were sized for would be refused on
    # every node by the memory rule; say so here, with the fix.
    weight_bytes = inspect_model(MODEL_URI).weight_bytes
    if weight_bytes > MODEL_WEIGHT_BYTES:
        sys.exit(
            f"entrypoint.py: {MODEL_URI} has {weight_bytes:,} bytes of weights; the worker "
            f"pods of rayjob.yaml are sized for {MODEL_WEIGHT_BYTES:,}: size /dev/shm and the "
            "pod memory for it (README.md, Sizing) and set MODEL_WEIGHT_BYTES"
        )

    ray.init()  # the RayJob's cluster (RAY_ADDRESS is set by `ray job submit`)
    config = StreamingvLLMEngineProcessorConfig(
        model_source=MODEL_URI,
        engine_kwargs={"load_format": "runai_streamer", "max_model_len": 8192},
        weight_sharing="node",  # one pull per node; "auto" would fall back to the store
        concurrency=WORKER_NODES * GPUS_PER_NODE,  # one engine per GPU
        batch_size=64,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0.0, max_tokens=64),
        ),
        postprocess=lambda row: dict(question=row["question"], answer=row["generated_text"]),
    )
    prompts = int(os.environ.get("RSL_NUM_PROMPTS", "1000"))
    questions = ray.data.range(prompts).map(
        lambda row: {"question": f"In one sentence, what is special about the number {row['id']}?"}
    )
    results = processor(questions).materialize()
    output = os.environ.get("RSL_OUTPUT_URI")
    if output:
        results.write_parquet(output)
    else:
        for row in results.take(5):
            print(f"{row['question']!r} -> {row['answer']!r}")
    for report in load_reports():  # one line per engine: "from the node's shared pull ..."
        print(report.log_line())
    rows = results.count()
    print(f"ROWS {rows}", flush=True)
    return 0 if rows == prompts else 1


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    sys.exit(main())
