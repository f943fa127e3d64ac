"""The examples, run the way a user runs them, against the real local S3 server.

* ``examples/job_submission/``: a Ray head started here (127.0.0.1 only, dashboard on),
  the shipped ``runtime_env.yaml`` filled in with this server's endpoint and keys, the job
  submitted with ``ray job submit``. It must end SUCCEEDED, print ``ROWS <n>`` and leave
  Parquet with an answer for every question.
* ``examples/notebook.ipynb``: executed top to bottom by nbclient in a fresh kernel whose
  environment points at the server; its outputs must show every answer row.

Each runs with HOME, TMPDIR, caches and Ray's session directory in one short /tmp
directory (Ray's socket paths must stay under 107 bytes), which is walked for weight
files afterwards. Every process a test starts is stopped by PID: ``ray stop`` would stop
every Ray process on the machine, other users' included.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers.examples import JOB_DIR, load_entrypoint
from helpers.janitors import segments_left
from helpers.jobs import wait_regions_released, weight_files_written
from helpers.paths import REPO
from helpers.waiting import wait_until

from ray_stream_llm.tools.isolated import isolated_env
from ray_stream_llm.tools.localstore import LocalS3Server, free_ports

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

NOTEBOOK = REPO / "examples" / "notebook.ipynb"
BIN = Path(sys.executable).parent  # the venv's python, ray
# the example's cluster: Ray 2.60 and vLLM without this library (make setup-compat), and the
# wheel the job ships to it (make wheel)
CLUSTER_BIN = REPO / ".venvs" / "cluster-ray-2.60.0" / "bin"
DIST = REPO / "dist"
PLACEHOLDER = re.compile(r"<[^<>]+>")
MAX_TOKENS = 4  # the tiny model answers with random tokens: keep it short


# --- helpers -------------------------------------------------------------------------------
def _isolated_env(work: Path, bin_dir: Path = BIN) -> dict[str, str]:
    """A process environment with no AWS variable and every user-level path inside ``work``;
    `python` and `ray` on PATH are ``bin_dir``'s (by default the venv's)."""
    return isolated_env(work, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def _processes(markers: list[str]) -> list[psutil.Process]:
    """Live processes whose command line names one of ``markers``, with all their descendants."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
        except psutil.Error:
            continue
        if any(m in cmdline for m in markers):
            roots.append(proc)
    found = {p.pid: p for p in roots}
    for proc in roots:
        try:
            found.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            pass
    alive = []
    for p in found.values():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def _comm(proc: psutil.Process) -> str:
    """The process's name (``ray stop`` finds Ray's own processes by it), "" once it is gone."""
    try:
        return proc.name()
    except psutil.Error:
        return ""


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out


def _stop_by_pid(procs: list[psutil.Process], grace: float = 10.0) -> list[str]:
    """SIGTERM each process, SIGKILL whatever is left after ``grace``; returns the killed."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    killed = _describe(alive)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return killed


def _reads(server: LocalS3Server, prefix: str, since: int) -> set[str]:
    """Objects under ``prefix`` the server sent since request number ``since``."""
    return {
        r.uri.removeprefix(prefix)
        for r in server.served()[since:]
        if r.method == "GET" and r.status in (200, 206) and r.uri.startswith(prefix)
    }


def _check_clean_disk(work: Path, start: float) -> None:
    # the node's shared region (the default, in memory) is removed by its keeper about 2 s
    # after the job's last engine: what is still there after the wait is reported below
    wait_regions_released(start)
    written = weight_files_written([work, Path("/dev/shm")], start)
    assert written == {}, f"weight files written to local disk: {written}"
    leaked = segments_left(start)
    assert leaked == [], f"shared-memory segments left behind: {leaked}"


# --- a Ray head of our own ------------------------------------------------------------------
class RayHead:
    """``ray start --head`` on 127.0.0.1 with every port chosen free and its own temp dir;
    stopped by PID (its processes name the temp dir or the GCS address on their command
    lines; workers, agents and engines are their descendants)."""

    def __init__(self, work: Path, env: dict[str, str], bin_dir: Path = BIN) -> None:
        self.env = env
        self.bin = bin_dir
        self.temp_dir = work / "ray"
        (
            self.gcs_port,
            self.dashboard_port,
            client,
            agent_http,
            agent_grpc,
            runtime_env_agent,
            metrics,
            node_manager,
            object_manager,
        ) = free_ports(9)
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.cmd = [
            str(bin_dir / "ray"),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs_port}",
            "--num-cpus=2",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--temp-dir={self.temp_dir}",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent_http}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env_agent}",
            f"--metrics-export-port={metrics}",
            f"--node-manager-port={node_manager}",
            f"--object-manager-port={object_manager}",
            f"--object-store-memory={512 * 1024 * 1024}",
            "--disable-usage-stats",
        ]
        self.start_output = ""

    def _log_tail(self, name: str, lines: int = 30) -> str:
        path = self.temp_dir / "session_latest" / "logs" / name
        try:
            return f"--- {name}\n" + "\n".join(
                path.read_text(errors="replace").splitlines()[-lines:]
            )
        except OSError:
            return f"--- {name}: none"

    def start(self) -> None:
        proc = subprocess.run(
            self.cmd,
            env=self.env,
            cwd=self.temp_dir.parent,  # not the checkout, which holds the library
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        self.start_output = proc.stdout + proc.stderr
        assert proc.returncode == 0, (
            f"ray start failed ({proc.returncode}):\n{self.start_output[-4000:]}"
        )
        last: list[BaseException] = []

        def answers() -> bool:  # the Jobs API is served by the dashboard
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=5) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError) as exc:
                last[:] = [exc]
                return False

        wait_until(
            answers,
            90,
            lambda: (
                f"the Ray dashboard (needed by `ray job submit`) did not answer on "
                f"{self.dashboard_url}: {(last or [None])[-1]!r}\n"
                + "\n".join(
                    self._log_tail(n)
                    for n in ("dashboard.log", "dashboard.err", "dashboard_JobHead.err")
                )
            ),
            poll=1,
        )

    def processes(self) -> list[psutil.Process]:
        return _processes([str(self.temp_dir), self.address])

    def stop(self) -> list[str]:
        """Stop every process of this head in ``ray stop``'s order (the raylet, then the
        rest, the GCS last: stopped together, the GCS outlived SIGTERM's 10 s grace, c59);
        returns those that needed SIGKILL."""
        procs = self.processes()
        raylet, gcs = ([p for p in procs if _comm(p) == name] for name in ("raylet", "gcs_server"))
        killed: list[str] = []
        for group in (raylet, [p for p in procs if p not in raylet + gcs], gcs):
            killed += _stop_by_pid(group)
        left = self.processes()  # a descendant re-parented while the tree went down
        if left:
            killed += _stop_by_pid(left, grace=5)
        survivors = self.processes()
        assert survivors == [], f"processes of our Ray head survived: {_describe(survivors)}"
        return killed

    def job(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "ray"), "job", *args, "--address", self.dashboard_url],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture
def ray_head(work: Path) -> Iterator[RayHead]:
    """A head of the example's cluster: an environment without this library."""
    if not (CLUSTER_BIN / "ray").exists():
        pytest.fail(f"{CLUSTER_BIN.parent} is missing: make setup-compat builds it")
    head = RayHead(work, _isolated_env(work, CLUSTER_BIN), CLUSTER_BIN)
    try:
        head.start()
        yield head
    finally:
        t0 = time.monotonic()
        killed = head.stop()
        print(f"\nray head stopped in {time.monotonic() - t0:.1f}s; SIGKILLed: {killed}")


# --- examples/job_submission ----------------------------------------------------------------
def _filled_runtime_env(server: LocalS3Server, into: Path) -> Path:
    """The shipped runtime_env.yaml with this server's endpoint and keys in the placeholders."""
    import yaml

    shipped = yaml.safe_load((JOB_DIR / "runtime_env.yaml").read_text())
    # as shipped, working_dir is relative to the repository root, where the README runs it
    assert (REPO / shipped["working_dir"] / "entrypoint.py").is_file(), shipped["working_dir"]
    env_vars = dict(shipped["env_vars"])
    fill = {
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_REGION": server.region,
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
    }
    assert set(fill) <= set(env_vars), sorted(env_vars)
    env_vars.update(fill)
    left = {k: v for k, v in env_vars.items() if PLACEHOLDER.search(str(v))}
    assert left == {}, f"placeholders with no value from the test: {left}"
    assert all(isinstance(v, str) for v in env_vars.values()), env_vars  # Ray wants strings
    path = into / "runtime_env.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({**shipped, "env_vars": env_vars}, f)
    return path


def _job_dir_with_wheel(into: Path) -> tuple[Path, str]:
    """The example's folder as a user prepares it: a copy holding the wheel its runtime_env
    names (working_dir carries it to every node); returns the copy and the wheel's name."""
    import yaml

    shipped = yaml.safe_load((JOB_DIR / "runtime_env.yaml").read_text())
    (requirement,) = shipped["pip"]
    name = requirement.removeprefix("${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/")
    wheel = DIST / name
    if not wheel.is_file():
        built = sorted(p.name for p in DIST.glob("*.whl"))
        pytest.fail(f"runtime_env.yaml ships {name}, the build has {built}: make wheel")
    job_dir = into / "job"
    shutil.copytree(JOB_DIR, job_dir, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(wheel, job_dir / name)
    return job_dir, name


def _submit(head: RayHead, runtime_env: Path, job_dir: Path, args: list[str]) -> tuple[str, str]:
    """``ray job submit`` from the cluster's environment; waits for the job (tailing its
    logs), returns its final status (the Jobs API's, e.g. ``JobStatus.SUCCEEDED``) and its
    logs."""
    submission_id = f"rsl-example-{uuid.uuid4().hex[:8]}"
    cmd = [
        str(head.bin / "ray"), "job", "submit", "--address", head.dashboard_url,
        "--submission-id", submission_id, "--runtime-env", str(runtime_env),
        "--working-dir", str(job_dir), "--", "python", "entrypoint.py", *args,
    ]  # fmt: skip
    try:
        subprocess.run(cmd, env=head.env, capture_output=True, timeout=480, check=False)
    except subprocess.TimeoutExpired:
        logs = head.job("logs", submission_id).stdout
        pytest.fail(f"the job did not finish in 480 s; its logs:\n{logs[-6000:]}")
    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(head.dashboard_url).get_job_info(submission_id)
    return str(info.status), head.job("logs", submission_id).stdout


@pytest.mark.e2e
@pytest.mark.engine
def test_job_submission_example_ships_the_wheel_to_a_cluster_without_it(
    s3_server, tiny_models, work, ray_head, tmp_path
):
    """Issue 31: the library goes with the job. The cluster's environment has Ray and vLLM
    and not this library; the job's runtime_env installs the wheel (a virtualenv over the
    node's Python: the cluster's Ray, vLLM and torch stay), the engine streams, and the
    plugin runs in vLLM's processes (the streamer's figures come from it). Shipped as
    ``py_modules`` instead (no entry points), the job is refused on the driver, in one line,
    before any actor starts."""
    import pyarrow.parquet as pq
    import yaml

    questions = load_entrypoint().QUESTIONS
    model = tiny_models["single"]
    runtime_env = _filled_runtime_env(s3_server, work)
    job_dir, wheel = _job_dir_with_wheel(work)

    # py_modules: the package's directory, without its metadata
    filled = yaml.safe_load(runtime_env.read_text())
    as_modules = work / "runtime_env_py_modules.yaml"
    as_modules.write_text(
        yaml.safe_dump(
            {
                "env_vars": filled["env_vars"],
                "py_modules": [str(REPO / "ray_stream_llm")],
            }
        )
    )
    status, logs = _submit(ray_head, as_modules, job_dir, [model.uri, str(work / "none")])
    assert "FAILED" in status, (status, logs[-4000:])
    refused = [line for line in logs.splitlines() if "PluginNotActiveError" in line]
    assert len(refused) == 1, logs[-4000:]
    assert "runtime_env={'pip': ['ray-stream-llm']}" in refused[0], refused
    assert "Traceback" not in logs, logs[-4000:]  # one line, not a stack
    assert "ROWS" not in logs

    # pip: the wheel, from the job's working_dir
    out = work / "results"
    before, start = len(s3_server.served()), time.time()
    status, logs = _submit(
        ray_head, runtime_env, job_dir, [model.uri, str(out), "--max-tokens", str(MAX_TOKENS)]
    )
    (tmp_path / "job.log").write_text(logs)  # kept by pytest, for a look afterwards
    assert "SUCCEEDED" in status, (status, logs[-4000:])
    assert re.search(rf"^ROWS {len(questions)}$", logs, re.MULTILINE), logs[-4000:]
    # the job's driver imported the wheel from the job's own environment
    (imported,) = re.findall(r"^ray_stream_llm .* from (.+)$", logs, re.MULTILINE)
    assert "runtime_resources" in imported and "site-packages" in imported, imported
    # the plugin ran in vLLM's processes: the streamer's own figures, none without it
    (load,) = re.findall(r"^LOAD (.+)$", logs, re.MULTILINE)
    figures = dict(item.split("=") for item in load.split())
    weights = (model.local / "model.safetensors").stat().st_size
    assert figures["weight_bytes"] == str(weights), load
    assert 0 < int(figures["streamed_tensor_bytes"]) < weights, load

    # the Parquet output: every question once, each with generated text
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["question"] for r in rows) == sorted(questions)
    for row in rows:
        assert isinstance(row["answer"], str) and row["answer"], row
        assert row["num_generated_tokens"] == MAX_TOKENS, row
    # streamed: the engine read the safetensors from the store (its access log), and no
    # weight file of any format reached local disk (HOME, TMPDIR and Ray's session are in work)
    assert "model.safetensors" in _reads(s3_server, model.uri, before)
    _check_clean_disk(work, start)
    # the cluster's environment is as it was: the wheel went into the job's own
    bare = subprocess.run(
        [str(CLUSTER_BIN / "python"), "-c", "import ray_stream_llm"],
        capture_output=True,
        cwd=work,  # not the checkout: python -c puts its working directory on the path
    )
    assert bare.returncode != 0, "the cluster's environment has ray_stream_llm now"
    print(f"\njob: {len(rows)} rows, {time.time() - start:.1f}s from submission ({wheel})")


# --- examples/notebook.ipynb ----------------------------------------------------------------
def _notebook_questions(nb) -> list[str]:
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "QUESTIONS" for t in node.targets
            ):
                return ast.literal_eval(node.value)
    raise AssertionError("the notebook defines no QUESTIONS list")


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                parts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                parts.append(output.data.get("text/plain", ""))
            elif output.output_type == "error":
                parts.append("\n".join(output.traceback))
    return "\n".join(parts)


@pytest.mark.e2e
@pytest.mark.engine
def test_notebook_example(s3_server, tiny_models, work, monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    model = tiny_models["single"]
    jupyter = {
        "JUPYTER_RUNTIME_DIR": work / "jupyter" / "runtime",
        "JUPYTER_DATA_DIR": work / "jupyter" / "data",
        "JUPYTER_CONFIG_DIR": work / "jupyter" / "config",
        "IPYTHONDIR": work / "ipython",
    }
    for name, path in jupyter.items():
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))  # the kernel's connection file: here, not in ~
    env = {
        **_isolated_env(work),
        **{name: str(path) for name, path in jupyter.items()},
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        # the notebook's parameters
        "RSL_MODEL_URI": model.uri,
        "RSL_MAX_TOKENS": str(MAX_TOKENS),
        "RSL_NUM_CPUS": "2",
        # the store, the standard AWS way: the notebook turns these into an ObjectStoreConfig
        # (no RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING: the config derives path style)
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_REGION": s3_server.region,
        "AWS_ACCESS_KEY_ID": s3_server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_access_key,
    }
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        "examples/notebook.ipynb is committed with outputs; clear them"
    )
    questions = _notebook_questions(nb)
    before, start = len(s3_server.served()), time.time()
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    try:
        client.execute(env=env, cwd=str(work))  # raises CellExecutionError on any failing cell
    finally:
        # what ran, outputs and all, for a look afterwards (pytest keeps tmp_path)
        nbformat.write(nb, tmp_path / "notebook.executed.ipynb")
        # the kernel is shut down by now, and the notebook's last cell stopped Ray
        try:
            wait_until(lambda: not _processes([str(work)]), 30, "processes left", poll=1)
        except AssertionError:
            pass  # stopped and named just below
        left = _processes([str(work)])
        killed = _stop_by_pid(left) if left else []
    assert killed == [], f"processes left running after the notebook: {killed}"

    text = _outputs_text(nb)
    for q in questions:  # every answer row, in whatever order Ray returned them
        m = re.search(rf"^{re.escape(repr(q))} -> (.+) \((\d+) tokens\)$", text, re.MULTILINE)
        assert m, f"no answer row for {q!r} in the notebook's outputs:\n{text[-4000:]}"
        answer = ast.literal_eval(m.group(1))
        assert isinstance(answer, str) and answer, (q, answer)
        assert int(m.group(2)) == MAX_TOKENS, m.group(0)
    assert re.search(rf"^{len(questions)} rows$", text, re.MULTILINE), text[-4000:]
    assert re.search(r"^\s*[\d,]+\s+config\.json$", text, re.MULTILINE), text[
        -4000:
    ]  # metadata listing
    assert re.search(r"^weight files written to local disk: 0$", text, re.MULTILINE), text[-4000:]
    assert s3_server.secret_access_key not in text  # the config shows its secret masked
    assert "model.safetensors" in _reads(s3_server, model.uri, before)
    _check_clean_disk(work, start)
    print(f"\nnotebook: {len(questions)} rows, {time.time() - start:.1f}s")
