"""The node agent (ray_stream_llm/integrations/ray/agent.py) on a real local Ray: an actor
standing for an engine (a child process that maps a /dev/shm segment, as vLLM's engine core does) is
SIGKILLed, as Ray's memory monitor kills; within 20 s its child is ended and its segment and
directory removed, under Ray's defaults and under Ray's own clean-up setting
(RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper, which ends the processes a
dead worker left, and would end a library's detached helper too). The child is ended by Ray
where Ray ends a dead worker's processes (the agent sends no signal: issue 55), else by the
agent. Then the agent, with nothing left to watch, ends itself; a killed agent's successor
finishes its work."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers.janitors import SEGMENT_MAPPER as _MAPPER
from helpers.s3log import AccessLog, copy_model, prefix_of
from helpers.waiting import wait_until

from ray_stream_llm.actors import NAMESPACE, agent_name
from ray_stream_llm.integrations.ray import agent as agent_module
from ray_stream_llm.tools.link import Link

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def local_ray(work, monkeypatch):
    """A local Ray of its own in this process."""
    import ray

    monkeypatch.setenv("RAY_TMPDIR", str(work))
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=str(work / "ray"))
    yield ray
    ray.shutdown()


# A driver of its own (Ray's subreaper setting, once in a driver, reaps every child that
# driver starts: subprocess return codes read 0 from then on; not in pytest's process).
# It starts an engine whose child maps the segment, SIGKILLs the actor, as Ray's memory
# monitor does, and reports when the leftovers were gone and when the idle agent ended.
# An engine actor, for the drivers below: a child that maps the segment, watched by the agent.
_ENGINE = textwrap.dedent("""
    import dataclasses, json, os, signal, subprocess, sys, time
    import psutil, ray

    @ray.remote(num_cpus=0)
    class Engine:
        def start(self, name, dirs, base):
            from ray_stream_llm.integrations.ray import node
            from ray_stream_llm.integrations.ray.agent import watch_engine
            from ray_stream_llm.integrations.vllm.shm import janitor_log
            from ray_stream_llm.uri import parse_model_uri
            from ray_stream_llm.weights.region import NodeWeights, Sharing
            since = time.time() - 1.0
            self.kid = subprocess.Popen([sys.executable, "-c", MAPPER.format(name=name)],
                                        stdout=subprocess.PIPE)
            assert self.kid.stdout.readline().strip() == b"mapped"
            log = janitor_log(os.getpid())
            watch_engine(os.getpid(), since, dirs, log).confirm()
            # a region of the node's shared weights (of no object: nothing to pull), held by
            # this actor and handed to the agent, as an engine's is
            self.weights = NodeWeights(parse_model_uri("s3://models/agent"), (),
                                       Sharing("node", base=base),
                                       dataclasses.replace(node.holder(), puller=None))
            return os.getpid(), self.kid.pid, log, self.weights.acquire()

    def agents():
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if "ray::NodeAgent" in " ".join(p.info["cmdline"] or [])]

    def until(check, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    def left(kid, name, rpc_dir, region):
        # which of the engine's child, segment, directory and region are still there
        try:
            running = psutil.Process(kid).status() != "zombie"
        except psutil.NoSuchProcess:
            running = False
        return {"kid": running, "segment": os.path.exists("/dev/shm/" + name),
                "rpc_dir": os.path.exists(rpc_dir), "region": os.path.exists(region)}

    def cleaned_after_kill(actor, kid, name, rpc_dir, region):
        # SIGKILL the engine actor, as Ray's memory monitor does; the seconds until its
        # child, segment, directory and region were gone (None: not within 20 s)
        os.kill(actor, signal.SIGKILL)
        killed = time.monotonic()

        def clean():
            return not any(left(kid, name, rpc_dir, region).values())

        while not clean() and time.monotonic() - killed < 20:
            time.sleep(0.05)
        return time.monotonic() - killed if clean() else None

    def unclean(kid, name, rpc_dir, region, temp):
        # what was left 20 s after the SIGKILL, and what the agents saw (a failure seen only
        # under load): a region's holders' marks, the actor table's word on them, the
        # agents' parents (a mark's actor is counted by a worker of its raylet) and the
        # tail of the agents' logs
        import glob
        from ray_stream_llm.integrations.ray.agent import actor_alive
        refs = os.path.join(region, ".refs")
        marks = {r: open(os.path.join(refs, r)).read()
                 for r in (sorted(os.listdir(refs)) if os.path.isdir(refs) else [])}
        return {"left": left(kid, name, rpc_dir, region),
                "marks": marks,
                "alive": {r: actor_alive(r.removeprefix("actor-")) for r in marks},
                "agents": {p: psutil.Process(p).ppid() for p in agents()},
                "logs": {os.path.basename(f): open(f).read()[-2000:]
                         for p in agents()
                         for f in glob.glob(f"{temp}/session_*/logs/worker-*-{p}.*")}}
""")


def _driver(body: str) -> str:
    """A driver script: the engine above, then ``body``."""
    return f"MAPPER = {_MAPPER!r}\n" + _ENGINE + textwrap.dedent(body)


_KILL = _driver("""
    name, rpc_dir, temp, base = sys.argv[1:5]
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp)
    engine = Engine.remote()  # held: an actor whose handles are gone is ended by Ray
    actor, kid, log, region = ray.get(engine.start.remote(name, [rpc_dir], base))
    before = {"segment": os.path.exists("/dev/shm/" + name), "kid": psutil.pid_exists(kid),
              "agents": len(agents()), "region": os.path.isdir(region)}
    clean_s = cleaned_after_kill(actor, kid, name, rpc_dir, region)
    until(lambda: not agents(), "the idle agent's end")
    print(json.dumps({"actor": actor, "before": before, "clean_s": clean_s,
                      "log": open(log).read()}), flush=True)
    ray.shutdown()
""")

SUBREAPER = {"RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true"}


def _drive(work: Path, script: str, name: str, ray_env: dict[str, str]) -> dict:
    """Run the driver ``script`` (of :func:`_driver`) with the segment ``name``, the engine's
    directory and the regions' base under ``work``, in its own Ray; what it printed."""
    import subprocess

    (work / "rsl-rpc-engine").mkdir()
    (work / "driver.py").write_text(script)
    args = [name, str(work / "rsl-rpc-engine"), str(work / "ray"), str(work / "regions")]
    done = subprocess.run(
        [sys.executable, str(work / "driver.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_TMPDIR": str(work), **ray_env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the line the driver prints (the raylet's own, on the killed workers, may follow)
    [line] = [x for x in done.stdout.splitlines() if x.startswith('{"actor"')]
    return json.loads(line)


def _ray_ends(ray_env: dict[str, str]) -> bool:
    """Whether the driver's Ray (this Ray, this environment with ``ray_env``) ends a dead
    worker's processes itself, as the library decides it."""
    from ray_stream_llm.integrations.ray.compat import ray_ends_workers_processes

    env = {**os.environ, **ray_env}
    return ray_ends_workers_processes(
        settings={k.removeprefix("RAY_"): v for k, v in env.items() if k.startswith("RAY_")}
    )


@pytest.mark.parametrize("ray_env", [{}, SUBREAPER], ids=["defaults", "subreaper"])
def test_a_killed_engines_leftovers_are_gone_within_20_s_and_the_agent_then_ends(work, ray_env):
    name = f"psm_rsl{uuid.uuid4().hex[:8]}agent"
    base = work / "regions"
    try:
        out = _drive(work, _KILL, name, ray_env)
        # who ended the engine's child: its Ray, where Ray ends a dead worker's processes
        # (the agent only waited: no signal sent), else the agent (issue 55)
        signalled = [x for x in out["log"].splitlines() if "sending SIG" in x]
        if _ray_ends(ray_env):
            assert not signalled, out["log"]
        else:
            assert "sending SIGTERM" in out["log"], out["log"]
        assert out["before"] == {"segment": True, "kid": True, "agents": 1, "region": True}
        # within 20 s of the SIGKILL: its processes, segment, directory and region
        assert out["clean_s"] is not None, (out["log"], list(base.rglob("*")))
        print(f"\nclean {out['clean_s']:.1f} s after the SIGKILL")
        actor = out["actor"]
        assert f"actor {actor} exited" in out["log"] and name in out["log"], out["log"]
        assert "done" in out["log"], out["log"]
        assert not list(agent_module.state_dir().glob(f"{actor}-*.json"))  # its record
        assert not Path(f"/dev/shm/{name}").exists()
        assert not list(base.rglob("*")), list(base.rglob("*"))  # nor an empty directory
    finally:
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


_AGENT_KILLED = _driver("""
    name, rpc_dir, temp, base = sys.argv[1:5]
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp)
    from ray_stream_llm.actors import NAMESPACE
    from ray_stream_llm.integrations.ray.agent import agent_name

    engine = Engine.remote()  # held: an actor whose handles are gone is ended by Ray
    actor, kid, log, region = ray.get(engine.start.remote(name, [rpc_dir], base))
    node = ray.get_runtime_context().get_node_id()
    agent = ray.get_actor(agent_name(node), namespace=NAMESPACE)
    until(lambda: ray.get(agent.keeping.remote()) == [region], "the agent keeps the region")
    [first] = agents()
    os.kill(first, signal.SIGKILL)  # the agent alone, as a memory monitor or an operator may
    killed = time.monotonic()
    until(lambda: agents() not in ([], [first]), "a restarted agent")
    answers = {}

    def asked():  # a call sent before this driver heard of the restart is refused: again
        try:
            answers.update(keeping=ray.get(agent.keeping.remote()),
                           watching=ray.get(agent.watching.remote()))
        except ray.exceptions.ActorUnavailableError:
            return False
        return True

    until(asked, "the restarted agent's answer")
    again = answers
    restarted_s = time.monotonic() - killed
    # then the engine: what it left is the restarted agent's
    clean_s = cleaned_after_kill(actor, kid, name, rpc_dir, region)
    print(json.dumps({"actor": actor, "region": region, "again": again, "clean_s": clean_s,
                      "restarted_s": restarted_s,
                      "unclean": None if clean_s is not None
                      else unclean(kid, name, rpc_dir, region, temp)}),
          flush=True)
    ray.shutdown()
""")


def test_a_killed_agent_is_restarted_and_keeps_what_it_kept(work):
    """The agent alone is SIGKILLed while an engine it watches holds a region: Ray restarts
    it, the restarted agent takes its records up again (it keeps the region and watches the
    engine), and when the engine is then SIGKILLed its processes, segment, directory and
    region are gone within 20 s, as with the agent that was never killed."""
    name = f"psm_rsl{uuid.uuid4().hex[:8]}again"
    base = work / "regions"
    try:
        out = _drive(work, _AGENT_KILLED, name, {})
        assert out["again"] == {"keeping": [out["region"]], "watching": [out["actor"]]}
        # (a string: pytest prints it whole, where it shortens a tuple's repr)
        assert out["clean_s"] is not None, json.dumps(
            {"unclean": out["unclean"], "base": [str(p) for p in base.rglob("*")]}, indent=1
        )
        print(
            f"\nrestarted {out['restarted_s']:.1f} s after the SIGKILL of the agent; "
            f"clean {out['clean_s']:.1f} s after the engine's"
        )
        assert not list(base.rglob("*")), list(base.rglob("*"))
    finally:
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_a_new_agent_finishes_what_a_killed_one_left(local_ray, tmp_path):
    """An agent that ended with its Ray left a record of an engine whose child still runs and
    maps its segment: the node's next agent ends the child and removes the segment."""
    import subprocess

    ray = local_ray
    name = f"psm_rsl{uuid.uuid4().hex[:8]}left"
    kid = subprocess.Popen(
        [sys.executable, "-c", _MAPPER.format(name=name)], stdout=subprocess.PIPE
    )
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # the engine actor, gone
    dead.wait()
    try:
        assert kid.stdout.readline().strip() == b"mapped"
        records = agent_module.state_dir()
        records.mkdir(parents=True, exist_ok=True)
        record = records / f"{dead.pid}-1.0.json"
        state = {
            "pid": dead.pid,
            "started": 1.0,
            "since": time.time() - 60,
            "dirs": [],
            "log": None,
            "members": {str(kid.pid): psutil.Process(kid.pid).create_time()},
            "seen": [name],
        }
        record.write_text(json.dumps(state))
        node = ray.get_runtime_context().get_node_id()
        agent = agent_module._agent(node, records)
        wait_until(lambda: kid.poll() is not None, 60, "the recorded process's end")
        wait_until(lambda: not Path(f"/dev/shm/{name}").exists(), 30, "the segment's removal")
        assert not record.exists()
        assert ray.get(agent.watching.remote()) == []
    finally:
        kid.kill()
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


_SCRIPT = _driver("""
    from ray_stream_llm.integrations.ray.agent import finish_at_exit_of_this_process

    name, ending, temp, base = sys.argv[1:5]
    finish_at_exit_of_this_process()  # what the processor's build does, before Ray runs
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp)
    from ray_stream_llm.integrations.ray.agent import state_dir

    actor, kid, _, region = ray.get(Engine.remote().start.remote(name, [], base))
    record, = state_dir().glob(f"{actor}-*.json")  # as the engine's start returned
    print(json.dumps([actor, kid, json.loads(record.read_text())["seen"], region]), flush=True)
    if ending != "implicit":
        ray.shutdown()  # the user's own, before the script ends
    if ending == "goes-on":  # a notebook: the driver runs on; what is left 5 s later
        ended = time.monotonic()
        while time.monotonic() - ended < 5.0 and (
            os.path.exists("/dev/shm/" + name) or os.path.exists(region)
        ):
            time.sleep(0.05)
        left = [p for p in ("/dev/shm/" + name, region) if os.path.exists(p)]
        print("LEFT " + json.dumps([left, round(time.monotonic() - ended, 2)]), flush=True)
""")


@pytest.mark.parametrize("ending", ["explicit", "implicit", "goes-on"])
def test_a_local_rays_end_leaves_no_segment_of_its_engines(work, ending):
    """A driver that started its own Ray: Ray's shutdown SIGKILLs the engines, their
    processes and the node's agent at once (measured: no SIGTERM reaches any of them). What
    the engines' processes mapped, and their region, are removed once that Ray's raylet has
    exited, whether the script called ``ray.shutdown()`` itself or left it to Ray's exit
    hook, at once after the engine's start (what its processes map is in the agent's record
    by then); a driver that goes on running after ``ray.shutdown()`` (a notebook) has
    nothing of them left 5 s later, before its exit."""
    import subprocess

    name = f"psm_rsl{uuid.uuid4().hex[:8]}exit"
    script = work / "driver.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "RAY_TMPDIR": str(work)}
    try:
        done = subprocess.run(
            [sys.executable, str(script), name, ending, str(work / "ray"), str(work / "base")],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # the line the driver printed (vLLM's log and Ray's workers' lines, "(pid=...)",
        # may come before and after it)
        [line] = [x for x in done.stdout.splitlines() if x.startswith("[")]
        actor, kid, recorded, region = json.loads(line)
        if ending == "goes-on":
            [left] = [x for x in done.stdout.splitlines() if x.startswith("LEFT ")]
            assert json.loads(left.removeprefix("LEFT "))[0] == [], left
        assert recorded == [name]  # in the record before the engine's start returned
        assert not Path(f"/dev/shm/{name}").exists()
        # the engine's region, which the agent kept: retired at the driver's exit
        assert Path(region).parent.parent == work / "base" and not Path(region).exists()
        assert not psutil.pid_exists(kid) or psutil.Process(kid).status() == "zombie"
        assert not list(agent_module.state_dir().glob(f"{actor}-*.json"))
    finally:
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def _restarted_pid(agent: Any, killed: int) -> int | None:
    """The agent's pid once Ray has restarted it after ``killed`` died, else None."""
    import ray

    try:
        pid = ray.get(agent.pid.remote(), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
    return pid if pid != killed else None


def _asker() -> Any:
    """An actor that holds a model's region as the library's stage actors and engines do
    (its node agent keeps and pulls it), its store settings in its own environment only."""
    import ray

    @ray.remote(num_cpus=0)
    class Asker:
        def __init__(self, env: dict[str, str]) -> None:
            os.environ.update(env)  # as the stage actors apply the config's secrets

        def ask(self, uri: str, base: str) -> str | None:
            from ray_stream_llm.fetch import fetch_metadata_report
            from ray_stream_llm.integrations.ray import node
            from ray_stream_llm.uri import parse_model_uri
            from ray_stream_llm.weights.region import NodeWeights, Sharing

            report = fetch_metadata_report(uri)
            self.weights = NodeWeights(
                parse_model_uri(uri),
                report.weight_objects,
                Sharing("node", base=base),
                node.holder(),  # as the engines hold it: the node's agent keeps and pulls
            )
            return self.weights.acquire()

    return Asker


@pytest.mark.s3
def test_the_agents_pull_outlives_its_own_kill_and_the_asker_with_the_askers_settings(
    s3_server, tiny_models, no_aws_env, local_ray
):
    """A region's pull is the node agent's (``agent.pull_region``). An actor whose store
    settings are in its own environment only (as the library's stage actors put the
    config's secrets there), on a Ray whose processes have none, asks for the model's
    region through a slow link. Once the pull has begun the agent is SIGKILLed: Ray restarts
    it, the holder's next request (``NodeWeights.tend``, each second) has it take the pull
    up again with the holder's settings, passed again by value. Once that pull has gone on,
    the holder is killed: the agent pulls on. Every file ends whole with the store's bytes;
    only the file in flight at the agent's kill was read again; the pull's record is the
    restarted agent's; no file the agent keeps names the store's secret; the region is
    removed once its only holder is dead."""
    import ray

    from ray_stream_llm.weights import marks
    from ray_stream_llm.weights.pull import CHUNK, finished_pull

    model = copy_model(s3_server, tiny_models["sharded"], "agent-pull")
    base = Path("/dev/shm") / f"rsl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log = AccessLog(s3_server)
    node = ray.get_runtime_context().get_node_id()

    def pulled() -> int:  # bytes in the region: whole files and partial prefixes
        return sum(
            o.size if marks.done(region, o.path) else marks.progress(region, o.path)
            for o in objects
        )

    try:
        with Link(s3_server.port, rate=128 << 10, burst=64 << 10) as link:
            asker = _asker().remote(link.store_env(s3_server.env()))
            region = Path(ray.get(asker.ask.remote(model.uri, str(base))))
            objects = marks.objects_of(region)
            wait_until(lambda: pulled() > 0, 60, "no pull began", poll=0.05)
            agent = ray.get_actor(agent_name(node), namespace=NAMESPACE)
            first = ray.get(agent.pid.remote())
            os.kill(first, 9)
            at_agent_kill = pulled()
            again = wait_until(lambda: _restarted_pid(agent, first), 60, "not restarted")
            wait_until(lambda: pulled() > at_agent_kill, 60, "the pull was not taken up again")
            ray.kill(asker)
            at_asker_kill = pulled()
            wait_until(
                lambda: all(marks.done(region, o.path) for o in objects),
                120,
                lambda: f"the region's pull stopped: {sorted(os.listdir(region))}",
                poll=0.2,
            )
        assert at_asker_kill < sum(o.size for o in objects)  # both killed mid-pull
        for o in objects:
            assert (region / o.path).read_bytes() == (model.local / o.path).read_bytes()
        assert again != first and finished_pull(region).pid == again
        ranges = {prefix_of(model.uri) + o.path: math.ceil(o.size / CHUNK) for o in objects}
        gets = log.gets(prefix_of(model.uri))
        gets = {k: v for k, v in gets.items() if k.endswith(".safetensors")}
        read_again = {k: gets[k] - n for k, n in ranges.items() if gets.get(k, 0) != n}
        assert set(gets) == set(ranges) and all(0 < n <= 32 for n in read_again.values())
        assert len(read_again) <= 1, read_again  # only the file in flight at the kill
        for path in [*agent_module.state_dir().rglob("*"), *region.rglob("*")]:
            if path.is_file():
                assert s3_server.secret_access_key.encode() not in path.read_bytes(), path
        wait_until(lambda: not region.exists(), 30, f"{region} is still there", poll=0.2)
    finally:
        shutil.rmtree(base, ignore_errors=True)
