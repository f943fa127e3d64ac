"""A LoRA adapter from the model's store served by a real CPU vLLM engine (issue 35 item 2):
``dynamic_lora_loading_path`` under the same ``ObjectStoreConfig`` as the model, fetched
with the config's settings. The adapters are made for the tiny Llama of
tests/helpers/models.py by tests/helpers/adapters.py (safetensors and json, no peft).
``loud`` has a large ``lora_B`` (its answers must differ from the base model's); ``zero``
has ``lora_B = 0`` (its answers must equal the base model's: the difference is the
weights', not the LoRA path's)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from helpers.adapters import store_fields, upload_adapters
from helpers.jobs import wait_regions_released, weight_files_written
from helpers.paths import HELPERS
from helpers.s3log import AccessLog
from helpers.waiting import wait_until

from ray_stream_llm.tools.isolated import run_isolated

DRIVER = HELPERS / "lora_driver.py"


# --- one engine: the adapter served, fetched with the config's settings -----------------------
@pytest.mark.e2e
@pytest.mark.engine
@pytest.mark.s3
def test_engine_serves_the_adapter_from_the_same_store(s3_server, tiny_models, work, tmp_path):
    """Real Ray, real CPU vLLM, the store set only in the config: each question asked of
    the base model, of ``loud`` and of ``zero``. ``loud``'s answers differ from the base
    model's from their first token, ``zero``'s are the base model's, token for token;
    the store served each adapter's files, signed with the config's keys, and no adapter
    weight was left on local disk."""
    model = tiny_models["single"]
    lora_path = upload_adapters(
        s3_server, tmp_path, model.uri, {"loud": {"b_scale": 1.0}, "zero": {"b_scale": 0.0}}
    )
    questions = ["What is 2+2?", "Name three primary colors.", "Say hello in French."]
    spec = {
        "model": model.uri,
        "lora_path": lora_path,
        "adapters": ["loud", "zero"],
        "questions": questions,
        "max_tokens": 8,
        "ray_temp_dir": str(work / "ray"),
        "object_store": store_fields(s3_server),
    }
    (work / "spec.json").write_text(json.dumps(spec))
    log = AccessLog(s3_server)
    start = time.time()
    proc = run_isolated(
        [sys.executable, str(DRIVER), str(work / "spec.json"), str(work / "out.json")],
        work,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    rows = json.loads((work / "out.json").read_text())["rows"]
    assert len(rows) == 3 * len(questions)
    answers = {(r["model"], r["question"]): r["answer"] for r in rows}
    tokens = {(r["model"], r["question"]): r["tokens"] for r in rows}
    assert all(answers[(model.uri, q)] for q in questions), answers
    # The engine runs one sequence at a time (the driver's max_num_seqs=1): with eight at
    # once, the rows beside a row changed its float sums, and greedy decoding of the random
    # model, full of near-ties, followed them (c12, c15: zero left the base model's answer
    # at its sixth and third token; c54: at its first, while loud kept the base model's
    # first token). Alone, the zero adapter (B = 0) adds exactly nothing: its answer is the
    # base model's, token for token; loud changes the first token of every question.
    for q in questions:
        base, loud, zero = (tokens[(m, q)] for m in (model.uri, "loud", "zero"))
        assert zero == base and loud[0] != base[0], (q, base, loud, zero)

    prefix = lora_path[len("s3://models/") :]
    served = [r for r in log.requests() if r.key.startswith(prefix) and r.method == "GET"]
    got = {r.key for r in served if r.status == 200}
    for name in ("loud", "zero"):
        assert f"{prefix}{name}/adapter_model.safetensors" in got, sorted(got)
        assert f"{prefix}{name}/adapter_config.json" in got, sorted(got)
    assert {r.identity for r in served} == {"admin"}, served
    wait_regions_released(start)

    def adapter_files() -> list[str]:
        return [p for p in weight_files_written([work, Path("/tmp")], start) if "adapter" in p]

    # the engine's directory is removed by the node's agent once the engine's processes are gone
    wait_until(lambda: not adapter_files(), 60, lambda: f"adapter files left: {adapter_files()}")
