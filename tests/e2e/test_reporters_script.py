"""ray-project/ray#55574, reproduced with the reporter's own script on the Ray it was
reported on (2.48.0; ``make test-compat`` runs this file in ``.venvs/ray-2.48.0``).

The script is the issue's, with one line changed: the config is imported from
ray-stream-llm. The model is a tiny random Llama laid out as a hub mirror (safetensors
beside ``.bin``, ``.pth`` and ``.gguf`` copies), its ``max_position_embeddings`` raised to
the script's ``max_model_len``, its tokenizer class one that transformers 4 and 5 both
load. The control, in the same run, is the same script with
Ray's own import, given 8 logical CPUs and one logical GPU so that Ray's engine actor is
scheduled on this CPU-only machine, and the transformers of Ray 2.48's day on its
PYTHONPATH (Ray 2.48's downloader imports ``TRANSFORMERS_CACHE``, which transformers 5
removed), and pyarrow's S3 filesystem pointed at the local server
(``helpers/control_site``: Ray 2.48 has no endpoint setting); what it writes to disk is
measured. Its engine then cannot start (vLLM 0.29
needs transformers 5): the download it made first is the bug.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import ray
from helpers.jobs import reads_under, weights_on_local_disk
from helpers.models import build_layout, is_weight, weight_files
from helpers.paths import HELPERS

from ray_stream_llm.tools.isolated import run_isolated

pytestmark = [pytest.mark.s3, pytest.mark.e2e, pytest.mark.engine, pytest.mark.compat]

SEED = """\
import ray
{import_line}
import numpy as np
{init}config = vLLMEngineProcessorConfig(
model_source="{uri}",
engine_kwargs={{
"enable_chunked_prefill": True,
"max_num_batched_tokens": 4096,
"max_model_len": 16384,
"load_format": "runai_streamer"
}},
concurrency=1,
batch_size=64,
)
processor = build_llm_processor(
config,
preprocess=lambda row: dict(
messages=[
{{"role": "system", "content": "You are a bot that responds with haikus."}},
{{"role": "user", "content": row["item"]}}
],
sampling_params=dict(
temperature=0.3,
max_tokens=250,
)
),
postprocess=lambda row: dict(
answer=row["generated_text"],
**row # This will return all the original columns in the dataset.
),
)
ds = ray.data.from_items(["Start of the haiku is: Complete this for me..."])
ds = processor(ds)
ds.show(limit=1)
"""
RAYS_IMPORT = "from ray.data.llm import vLLMEngineProcessorConfig, build_llm_processor"
OUR_IMPORT = (
    "from ray_stream_llm import StreamingvLLMEngineProcessorConfig as "
    "vLLMEngineProcessorConfig, build_llm_processor"
)


@pytest.fixture(scope="module")
def repro_model(s3_server, tmp_path_factory):
    local = build_layout("hub-mirror", tmp_path_factory.mktemp("repro") / "model")
    config = json.loads((local / "config.json").read_text())
    config["max_position_embeddings"] = 16384  # the script's max_model_len
    (local / "config.json").write_text(json.dumps(config, indent=2))
    # a class name both transformers 4 (the control's) and 5 (vLLM 0.29's) load
    tokenizer = json.loads((local / "tokenizer_config.json").read_text())
    tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
    (local / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    uri = "s3://models/issue-55574/"
    s3_server.upload_dir(local, uri)
    return uri, local


# Ray 2.48's own downloader needs the transformers of its day (make setup-compat installs it)
# and, to reach the local server, pyarrow's S3 pointed at it (helpers/control_site).
CONTROL_PATH = Path(sys.prefix) / "control"
CONTROL_SITE = HELPERS / "control_site"


def _run(
    s3_server, work: Path, script: str, extra: dict[str, str] | None = None
) -> tuple[int, str, dict[str, int]]:
    path = work / "repro.py"
    path.write_text(script)
    start = path.stat().st_mtime
    env = {**s3_server.env(), **(extra or {})}
    proc = run_isolated([sys.executable, str(path)], work, env, timeout=600)
    # the node's region (memory, not disk) goes within about 2 s of the job's last process,
    # which can be after the script has returned (c27: found still there on Ray 2.48.0);
    # one still there after that is counted
    written = weights_on_local_disk(work, start)
    return proc.returncode, proc.stdout + proc.stderr, written


def test_the_reporters_script_streams_and_rays_own_class_downloads(s3_server, repro_model, work):
    uri, local = repro_model
    before = s3_server.served()
    ours = SEED.format(import_line=OUR_IMPORT, init="", uri=uri)
    code, log, written = _run(s3_server, work, ours)
    print(f"ray {ray.__version__}: ray-stream-llm, exit {code}\n{log[-3000:]}")
    assert code == 0, log[-4000:]
    # ds.show(limit=1) printed the one row, answered
    [shown] = [line for line in log.splitlines() if line.startswith("{'answer':")]
    assert "'generated_text':" in shown and "'item': 'Start of the haiku" in shown
    print(f"ds.show(limit=1) printed: {shown[:400]}")
    assert written == {}, written  # no weight file of any format on local disk
    weight_reads = {
        u.removeprefix(uri)
        for u in reads_under(s3_server, uri, before)
        if is_weight(u.rsplit("/", 1)[1])
    }
    assert weight_reads == {"model.safetensors"}, weight_reads  # streamed, nothing else

    control = work / "control"  # a short path: Ray's socket paths must stay under 107 bytes
    control.mkdir()
    init = "ray.init(num_cpus=8, num_gpus=1)  # logical: Ray's engine asks a GPU\n"
    assert (CONTROL_PATH / "transformers").is_dir(), f"{CONTROL_PATH}: run make setup-compat"
    code, log, written = _run(
        s3_server,
        control,
        SEED.format(import_line=RAYS_IMPORT, init=init, uri=uri),
        {"PYTHONPATH": f"{CONTROL_PATH}:{CONTROL_SITE}"},
    )
    total = sum(written.values())
    print(f"the control's last line: {log.strip().splitlines()[-1][:300]}")
    print(
        f"ray {ray.__version__}: Ray's own class, exit {code}: wrote {total} bytes of weight "
        f"files: {json.dumps({Path(p).name: n for p, n in sorted(written.items())})}"
    )
    expected = {Path(p).name for p in weight_files(local)}
    assert {Path(p).name for p in written} == expected, (written, log[-6000:])
    assert total == sum((local / p).stat().st_size for p in weight_files(local))
