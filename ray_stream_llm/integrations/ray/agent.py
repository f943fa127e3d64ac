"""The node agent: one Ray actor per node (named per node, pinned to it, detached,
``num_cpus=0``) that cleans up after the node's engine actors, however they end, and keeps
the node's shared weights (``weights/region.py``, ``weights/lifetime.py``) until no one holds them.

An engine actor asks it to watch itself (:func:`watch_engine`) when it starts. The agent
records the actor's processes (vLLM's engine core and workers are its children) and the
``/dev/shm`` segments they map (``psm_*``, ``vllm_dist_*``: ``shm.PREFIXES``); once the
actor has exited (retired, failed, or SIGKILLed by Ray's memory monitor), it waits for the
processes it left to end, and removes those segments and the engine's private directories
(``integrations/vllm/shm``). Who ends those processes is decided once, in the engine actor,
and sent with its request (``compat.ray_ends_workers_processes``): Ray, where its raylet
ends a dead worker's processes (2.60's per-worker process groups, or the clean-up settings
turned on), and the agent sends no signal; else the agent (SIGTERM, then SIGKILL). It does
this as a Ray worker: Ray's own clean-up ends an engine's leftovers, and never the agent,
which is no worker's child.

Each actor that holds a region of the node's shared weights has the agent pull what is
missing of it (:func:`pull_region`: the actor's store settings passed by value, kept by no
record of the agent) and hands it to the agent (:func:`keep_region`), which runs the
region's :func:`~ray_stream_llm.weights.lifetime.reap` in a thread: the region is removed
once no live process has held it for 2 s, or, kept warm (``keep_warm_s``), once its time is
up. An agent keeping a region does not end. It is also the region's server for the nodes
that copy it (``integrations/ray/peers.py``: :meth:`NodeAgent.read`), until it removes it.

What it watches is also kept in a file per engine on the node (:func:`state_dir`, written
whole), for when the agent ends with its Ray. A local Ray (``ray.init()`` in the driver)
stops its raylet when it shuts down, and the engines and the agent end with it (their
processes too where that Ray ends a worker's processes); the driver then finishes the
agent's work itself, at its exit, after Ray's shutdown (:func:`finish_at_exit`, registered
by the processor's build): where that Ray's shutdown left them running it ends the recorded
processes still running (pid and start time both match), and it removes the recorded
segments no process maps, and retires the recorded regions (removed, or kept warm: the
node's next agent, or next region, removes one once its time is up). A driver that was
killed leaves the records to the node's next agent, which does the same before anything
else. An agent killed on its own (Ray's memory monitor, an operator) is restarted by Ray
(``MAX_RESTARTS``) and takes its records up again: it watches the engines that still run,
finishes those that ended meanwhile, and keeps the recorded regions. With nothing to watch
or keep for ``IDLE_S`` seconds the agent ends itself (and is not restarted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ray_stream_llm.actors import actor_logging, agent_name, library_actor
from ray_stream_llm.files import write_whole

logger = logging.getLogger(__name__)

IDLE_S = 10.0  # an agent with nothing to watch this long ends itself
MAX_RESTARTS = 3  # an agent killed on its own is restarted; one that ends itself is not


Raylet = tuple[int, float]  # a raylet's pid and start time: its Ray, while it runs


def _this_raylet() -> Raylet:
    """This worker's raylet (its parent): it ends with its Ray."""
    import psutil

    raylet = psutil.Process(os.getppid())
    return raylet.pid, raylet.create_time()


@dataclasses.dataclass
class EngineRecord:
    """What the agent watches of one engine actor (a file per engine, written whole, read
    by the node's next agent or the driver's exit): the actor (pid, start time), its Ray,
    the segments' earliest time (``since``), its directories and log, whether its Ray ends
    the processes it leaves, and its processes and the segments they mapped so far."""

    pid: int
    started: float
    raylet: Raylet
    since: float
    dirs: list[str]
    log: str | None = None
    ray_ends: bool = False
    members: dict[int, float] = dataclasses.field(default_factory=dict)
    seen: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        fields["members"] = {str(p): t for p, t in self.members.items()}  # JSON's keys
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> EngineRecord:
        """Raises ``ValueError`` where ``text`` is not such a record."""
        try:
            data = json.loads(text)
            pid, started = data.get("raylet") or (0, 0.0)
            return cls(
                pid=int(data["pid"]),
                started=float(data["started"]),
                raylet=(int(pid), float(started)),
                since=float(data["since"]),
                dirs=[str(d) for d in data["dirs"]],
                log=data.get("log"),
                ray_ends=bool(data.get("ray_ends", False)),
                members={int(p): float(t) for p, t in data.get("members", {}).items()},
                seen=sorted(str(n) for n in data.get("seen", [])),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an engine record: {text[:200]!r}") from exc

    def set_tree(self, members: dict[int, float], seen: set[str]) -> None:
        self.members, self.seen = dict(members), sorted(seen)


@dataclasses.dataclass(frozen=True)
class RegionRecord:
    """A region kept by a Ray's agent (a file per region), for when that Ray has ended."""

    region: str
    raylet: Raylet

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RegionRecord:
        """Raises ``ValueError`` where ``text`` is not such a record."""
        try:
            data = json.loads(text)
            pid, started = data.get("raylet") or (0, 0.0)
            return cls(str(data["region"]), (int(pid), float(started)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a region record: {text[:200]!r}") from exc


def _record_region(records: Path, region: str) -> Path:
    """Record the region ``region`` as kept by this Ray's agent (this worker's parent is its
    raylet): ``regions/<hash of its path>.json``, written whole; its path."""
    record = records / "regions" / f"{hashlib.sha256(region.encode()).hexdigest()[:16]}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    write_whole(record, RegionRecord(region, _this_raylet()).to_json())
    return record


def state_dir() -> Path:
    """This node's records of the engines its agent watches (one small JSON file each), where
    every agent of the node finds them whatever its environment (``TMPDIR`` differs between
    jobs): ``/dev/shm``, else the system's temporary directory; per user, since either may
    be shared."""
    root = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return root / f"ray_stream_llm-agent-{os.getuid()}"


def actor_alive(actor_id: str) -> bool:
    """Whether the actor ``actor_id`` (hex) is alive, or being made or restarted, as this
    Ray's actor table says; the node agent counts a region's holders by it. The table's own
    reader (``ray._private.state.actors``, in Ray 2.48.0-2.60.0): the public state API
    (``ray.util.state``) needs the dashboard, which many jobs turn off. Where the table
    cannot be read, alive: the region is kept, never removed under a holder. Here, not in
    ``compat``: that imports Ray's LLM stages, and with them torch, which the agent never
    needs."""
    from ray._private import state

    try:
        found = state.actors(actor_id)
    except Exception:
        return True
    return bool(found) and found.get("State") != "DEAD"


def _engine_log(path: str | None, pid: int) -> logging.Logger:
    """The logger of one engine's watch: its own file (``shm.janitor_log``) when it has one
    and its directory is still there (a recorded engine's Ray session may be gone), else
    the agent's log."""
    log = logging.getLogger(f"{__name__}.engine.{pid}")
    log.setLevel(logging.INFO)
    if path and not log.handlers and os.path.isdir(os.path.dirname(path)):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


class NodeAgent:
    """The node's agent (see the module's docstring). Its methods are called by the node's
    engine actors."""

    def __init__(self, records: str) -> None:
        actor_logging()  # its pulls' figures in its log
        self._records = Path(records)
        self._records.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._watching: dict[int, threading.Thread] = {}
        self._keeping: dict[str, threading.Thread] = {}  # region -> its reap thread
        self._pulling: dict[str, threading.Thread] = {}  # region -> its pull thread
        self._retiring = False
        from ray_stream_llm.integrations.vllm import shm

        # what an earlier agent left: the engines to watch or finish, then the regions to keep
        def another_rays(raylet: Raylet) -> bool:  # its own agent watches or keeps it
            return raylet[0] != os.getppid() and shm.is_running(*raylet)

        for path in sorted(self._records.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                engine = EngineRecord.from_json(path.read_text())
                if not another_rays(engine.raylet):
                    with self._lock:
                        thread = self._thread(path, engine, left=True)
                    thread.start()
        for path in sorted(self._records.glob("regions/*.json")):
            with contextlib.suppress(OSError, ValueError):
                kept = RegionRecord.from_json(path.read_text())
                if not another_rays(kept.raylet):
                    self.keep(kept.region)
        threading.Thread(
            target=self._retire_when_idle, args=(IDLE_S,), name="retire", daemon=True
        ).start()

    def watch(
        self, pid: int, since: float, dirs: list[str], log: str | None, ray_ends: bool = False
    ) -> bool:
        """Watch the engine actor ``pid`` of this node until it has exited, then clean up
        after it; ``ray_ends``: its Ray ends the processes it leaves (the agent sends them no
        signal). False when this agent is ending (ask the node's next one)."""
        import psutil

        from ray_stream_llm.integrations.vllm import shm

        # What the engine's tree maps as it asks is in the record before the answer: a Ray
        # shut down at once after the engine's start must not find the record empty.
        engine = EngineRecord(
            pid, psutil.Process(pid).create_time(), _this_raylet(), since, dirs, log, ray_ends
        )
        engine.set_tree(*shm.snapshot(pid))
        record = self._records / f"{pid}-{engine.started}.json"
        with self._lock:  # taken, or refused, before retire_when_idle can decide
            if self._retiring:
                return False
            write_whole(record, engine.to_json())
            thread = self._thread(record, engine, left=False)
        thread.start()
        return True

    def keep(self, region: str) -> bool:
        """Keep the node's region ``region`` until it is gone (``weights.lifetime.reap``, in a
        thread; asked by every actor that holds it: taken once). False when this agent is
        ending (ask the node's next one)."""
        with self._lock:
            if self._retiring:
                return False
            if region in self._keeping:
                return True  # kept until it is gone (made again meanwhile: kept on)
            record = _record_region(self._records, region)
            thread = threading.Thread(
                target=self._keep, args=(record, region), name="region", daemon=True
            )
            self._keeping[region] = thread
        thread.start()
        return True

    def pull(self, region: str, env: dict[str, str]) -> bool:
        """Pull what is missing of the node's region ``region`` (``weights.pull.pull_with``:
        claimed before this returns, run in a thread), unless this agent pulls it now.
        ``env``: the store variables of the actor that asked, its settings by value (the
        pull's thread holds them while the store's client is made; no record or log of
        this agent has them). A pull already going on in another process (its lock) is left
        to it. False when this agent is ending (ask the node's next one)."""
        from ray_stream_llm.integrations.ray import peers
        from ray_stream_llm.weights.pull import pull_with

        with self._lock:
            if self._retiring:
                return False
            running = self._pulling.get(region)
            if running is not None and running.is_alive():
                return True
        # outside the lock (a whole region joins its peers' directory: a Ray call); two
        # requests at once claim it once (the pull lock)
        if (thread := pull_with(Path(region), env, peers)) is not None:
            with self._lock:
                self._pulling[region] = thread
        return True

    def _keep(self, record: Path, region: str) -> None:
        import ray

        from ray_stream_llm.integrations.ray import peers
        from ray_stream_llm.weights.lifetime import reap

        try:
            while True:
                reap(Path(region), actor_alive=actor_alive)
                with self._lock:  # made again as this thread ended: kept on
                    if not os.path.exists(region):
                        del self._keeping[region]
                        record.unlink(missing_ok=True)
                        break
            peers.leave(Path(region), ray.get_runtime_context().get_node_id())
        except Exception:  # its record is left to the driver's exit or the next agent
            with self._lock:
                self._keeping.pop(region, None)
            logger.exception("keeping the shared region %s failed", region)
            raise

    def read(self, region: str, name: str, start: int, end: int) -> bytes:
        """Bytes ``start``..``end`` of the weight file ``name`` of ``region``, a region this
        agent keeps, for a node that copies it (``peers.read_range``)."""
        from ray_stream_llm.integrations.ray import peers

        return peers.read_range(self._kept(region), name, start, end)

    def digest(self, region: str, name: str) -> str:
        """The sha256 this node's pull recorded for ``name`` of ``region``, a region this
        agent keeps, once the file is whole (``peers.file_digest``)."""
        from ray_stream_llm.integrations.ray import peers

        return peers.file_digest(self._kept(region), name)

    def _kept(self, region: str) -> Path:
        with self._lock:
            if region not in self._keeping:
                raise FileNotFoundError(f"the node agent does not keep {region}")
        return Path(region)

    def pid(self) -> int:
        return os.getpid()

    def keeping(self) -> list[str]:
        """The regions kept now."""
        with self._lock:
            return sorted(r for r, t in self._keeping.items() if t.is_alive())

    def watching(self) -> list[int]:
        """The engine actors being watched (or cleaned up after) now."""
        with self._lock:
            return sorted(pid for pid, t in self._watching.items() if t.is_alive())

    def _retire_when_idle(self, idle_s: float, poll: float = 0.5) -> None:
        """End this agent once it has watched nothing for ``idle_s`` seconds. A thread of
        its own, not a task: a worker that submitted a task waits for its end before it
        exits, and an engine actor must never wait for its agent."""
        import ray

        idle_since = time.monotonic()
        while True:
            time.sleep(poll)
            with self._lock:
                threads = [
                    *self._watching.values(),
                    *self._keeping.values(),
                    *self._pulling.values(),
                ]
                if any(t.is_alive() or t.ident is None for t in threads):
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= idle_s:
                    self._retiring = True
                    break
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def _thread(self, record: Path, engine: EngineRecord, *, left: bool) -> threading.Thread:
        """The thread that watches (or finishes) ``engine``, registered, not yet started (the
        caller holds the lock); ``left``: the record is an earlier agent's."""
        thread = threading.Thread(
            target=self._run,
            args=(record, engine, left),
            name=f"engine-{engine.pid}",
            daemon=True,
        )
        self._watching[engine.pid] = thread
        return thread

    def _run(self, record: Path, engine: EngineRecord, left: bool) -> None:
        from ray_stream_llm.integrations.vllm import shm

        pid = engine.pid
        log = _engine_log(engine.log, pid)

        def keep(members: dict[int, float], seen: set[str]) -> None:
            engine.set_tree(members, seen)
            write_whole(record, engine.to_json())

        try:
            # this agent's own engine is watched even if it has just died (killed as its start
            # returned, before this thread ran), as is an earlier agent's that runs
            if not left or shm.is_running(pid, engine.started):
                shm.watch(
                    pid,
                    engine.since,
                    engine.dirs,
                    log=log,
                    record=keep,
                    members=dict(engine.members),
                    seen=set(engine.seen),
                    end_leftovers=not engine.ray_ends,
                )
            else:  # it ended while no agent ran: what still runs of it is left over
                log.info("actor %d ended while no agent ran; its processes %s", pid, engine.members)
                _finish(engine, ray_ends=engine.ray_ends, log=log)
        except Exception:
            log.exception("cleaning up after actor %d failed", pid)
            raise
        finally:
            record.unlink(missing_ok=True)  # done, or failed and logged: not tried again
            for handler in list(log.handlers):
                log.removeHandler(handler)
                handler.close()


def _agent(node_id: str, records: Path) -> Any:
    return library_actor(
        NodeAgent,
        agent_name(node_id),
        node_id,
        max_concurrency=64,  # each read of a peer's copy waits for its bytes
        max_restarts=MAX_RESTARTS,  # the restarted agent takes its records up again
    ).remote(str(records))


class Asked:
    """A request to this node's agent (:func:`watch_engine`, :func:`keep_region`): sent at
    once, confirmed by :meth:`confirm` (the agent is made meanwhile, if it must be)."""

    def __init__(self, method: str, *args: Any) -> None:
        import ray

        self._node = ray.get_runtime_context().get_node_id()
        self._method, self._args = method, args
        self._reply = self._ask()

    def _ask(self) -> Any:
        return getattr(_agent(self._node, state_dir()), self._method).remote(*self._args)

    def confirm(self, attempts: int = 5) -> None:
        """Wait until the agent has taken the request; an agent that was ending as it was
        asked is followed by the node's next one."""
        import ray

        for attempt in range(attempts):
            if attempt:
                time.sleep(1.0)  # the ended agent's name is free again within 0.5 s
                self._reply = self._ask()
            try:
                if ray.get(self._reply):
                    return
            except ray.exceptions.RayActorError:
                continue
        raise RuntimeError(
            f"the node agent of node {self._node} did not take {self._method}{self._args[:1]}"
        )


def watch_engine(pid: int, since: float, dirs: list[str], log: str | None) -> Asked:
    """Have this node's agent (made if there is none) watch the engine actor ``pid`` (the
    caller) and clean up after it: the processes it leaves running (ended by the agent
    where this Ray does not end them: ``compat.ray_ends_workers_processes``, decided here,
    where Ray's LLM stages are imported already, not in the agent), the segments they
    mapped since ``since``, the directories ``dirs``. ``log``: the file for what the agent
    saw and did about this engine. Returns at once: :meth:`Asked.confirm` waits."""
    from ray_stream_llm.integrations.ray.compat import ray_ends_workers_processes

    return Asked("watch", pid, since, dirs, log, ray_ends_workers_processes())


def keep_region(region: Path) -> None:
    """The keeper of the node's shared regions in a Ray worker
    (``weights.region.NodeWeights``' ``keeper``): this node's agent keeps ``region`` until
    it is gone. Returns at once; the agent's answer is awaited in a thread (an agent being
    made must not hold up the pull), and one never given is logged: the region is then
    retired by the driver's exit or the node's next region. Recorded here first: a Ray shut
    down before its agent answered still has its region retired at the driver's exit."""
    _record_region(state_dir(), str(region))
    asked = Asked("keep", str(region))

    def confirm() -> None:
        try:
            asked.confirm()
        except Exception:
            logger.warning("no node agent keeps %s", region, exc_info=True)

    threading.Thread(target=confirm, name="rsl-keep", daemon=True).start()


def pull_region(region: Path) -> None:
    """The puller of the node's shared regions in a Ray worker
    (``weights.region.NodeWeights``' ``puller``, asked again each second while the region
    fills): this node's agent pulls what is missing of ``region``, the store reached with
    this actor's settings (``stores.settings.store_env``, passed by value), so that the pull
    outlives the actor that asked (a stage actor Ray Data retires, an engine that fails),
    and an agent restarted after a kill takes it up again. Waits until the agent has taken
    the request (an agent being made: seconds); raises where none takes it."""
    from ray_stream_llm.stores.settings import store_env

    Asked("pull", str(region), store_env()).confirm()


def _finish(
    engine: EngineRecord, *, ray_ends: bool, log: logging.Logger = logger, **end: float
) -> None:
    """Clean up after the recorded ``engine``, which has exited: end what still runs of its
    processes at once (unless ``ray_ends``: its Ray ends them; they are waited for), remove
    the segments they mapped and its directories (``shm.clean_after``, given ``end``: its
    ``term_wait`` and ``poll``)."""
    from ray_stream_llm.integrations.vllm import shm

    shm.clean_after(
        dict(engine.members),
        set(engine.seen),
        engine.since,
        engine.dirs,
        grace=0.0,
        log=log,
        end_leftovers=not ray_ends,
        **end,
    )


def finish_orphaned(
    ending: Collection[Raylet] = (), wait: float = 10.0, *, ray_ends: bool = False
) -> list[int]:
    """In a process of the node: finish what the node's agents left when their Ray ended.
    For each recorded engine whose agent's raylet is gone, end what still runs of its
    processes, the engine actor's own included (their Ray is gone: they serve nothing, and a
    notebook's kernel gets 2.5 s to exit: SIGKILL at once), and remove the segments they
    mapped, as the agent would. ``ending``: the raylets (pid and start time) of a Ray shut
    down just now, given up to ``wait`` s in all to end (``ray.shutdown()`` does not wait
    for them); ``ray_ends``: that Ray's shutdown ends its workers' processes itself (they
    are waited for, up to 5 s, and sent no signal; a Ray that ended otherwise, its raylet
    killed, ended none). A record of a Ray that still runs is its agent's. The engines
    cleaned up after."""
    finished = []
    for record, engine in _left_by_ended_rays("*.json", EngineRecord, ending, wait):
        try:
            if ray_ends and engine.raylet in ending:
                _finish(engine, ray_ends=True, term_wait=5.0, poll=0.1)
            else:
                _finish(engine, ray_ends=False, term_wait=0.0, poll=0.1)
            finished.append(engine.pid)
        except OSError:
            logger.warning("cannot finish the node agent's record %s", record, exc_info=True)
        record.unlink(missing_ok=True)
    return finished


_Record = TypeVar("_Record", EngineRecord, RegionRecord)


def _left_by_ended_rays(
    pattern: str, kind: type[_Record], ending: Collection[Raylet], wait: float
) -> Iterator[tuple[Path, _Record]]:
    """The node's records (``pattern``, of ``kind``) of agents whose Ray is gone; the raylets
    in ``ending`` are given up to ``wait`` s in all to end. A record of a Ray that still runs
    is its agent's, and one that cannot be read is removed."""
    from ray_stream_llm.integrations.vllm import shm

    deadline = time.monotonic() + wait
    for path in sorted(state_dir().glob(pattern)):
        try:
            record = kind.from_json(path.read_text())
        except FileNotFoundError:
            continue  # finished meanwhile (the local Ray's watch, or the exit hook)
        except (OSError, ValueError):
            logger.warning("cannot read the node agent's record %s", path, exc_info=True)
            path.unlink(missing_ok=True)
            continue
        raylet = record.raylet
        while raylet in ending and shm.is_running(*raylet) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not shm.is_running(*raylet):
            yield path, record


def retire_orphaned_regions(ending: Collection[Raylet] = (), wait: float = 10.0) -> list[str]:
    """In a process of the node: retire the regions the node's agents kept when their Ray
    ended (``weights.lifetime.retire``: removed, or kept warm), waiting up to ``wait`` s in
    all for the raylets in ``ending`` and for the regions' other holders to end; the actors
    of that Ray hold nothing once it has ended (they serve no one, and may take seconds to
    notice: a notebook's kernel gets 2.5 s to exit). A region kept warm stays recorded: the
    node's next agent keeps it until its time is up. A record of a Ray that still runs is
    its agent's. The regions removed."""
    from ray_stream_llm.weights.lifetime import retire

    removed = []
    deadline = time.monotonic() + wait
    for record, kept in _left_by_ended_rays("regions/*.json", RegionRecord, ending, wait):
        try:
            wait_s = max(0.0, deadline - time.monotonic())
            if retire(Path(kept.region), wait_s):
                record.unlink(missing_ok=True)
                removed.append(kept.region)
        except (OSError, ValueError):
            logger.warning("cannot retire the node agent's region %s", record, exc_info=True)
            record.unlink(missing_ok=True)
    return removed


_watched: set[Raylet] = set()  # the local raylets a thread waits on


def _local_raylet() -> Raylet | None:
    """The raylet (pid and start time) of the Ray this process started itself (``ray.init()``
    with no address: a child of this process); None where Ray is not running here or this
    process joined a running cluster (its agents outlive it)."""
    import psutil
    import ray

    if not ray.is_initialized():
        return None
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not node.is_head():
        return None
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.name() == "raylet":
                return child.pid, child.create_time()
    return None


def _finish_after(raylets: set[Raylet], ray_ends: bool) -> None:
    """What the engines of the Rays whose ``raylets`` just ended left: their regions (their
    holders were that Ray's actors), then their processes (ended here only where that Ray
    does not end them) and segments. Each record is finished by whoever reads it first
    (the local Ray's watch, the exit hook: :func:`finish_at_exit` never waits for the
    watch, which may wait for Ray to end the engines' processes)."""
    retire_orphaned_regions(ending=raylets)
    finish_orphaned(ending=raylets, ray_ends=ray_ends)


def _wait_for_exit(pid: int) -> None:
    """Return once the process ``pid`` has exited (a pidfd: no polling; else psutil's wait)."""
    import select

    import psutil

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait()
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def watch_local_ray() -> None:
    """Where this process started its own Ray (a driver's ``ray.init()``, explicit or Ray
    Data's own): a thread of this process waits for that Ray's raylet to exit, then finishes
    what its engines left (:func:`_finish_after`) at once, so that a driver that calls
    ``ray.shutdown()`` and goes on running (a notebook) keeps no segment or region of the
    job. Run by Ray after each ``ray.init()`` of the driver (Ray's own post-init hooks, which
    its libraries use for the same purpose) and at the processor's build."""
    raylet = _local_raylet()
    if raylet is None or raylet in _watched:
        return
    from ray_stream_llm.integrations.ray.compat import ray_ends_workers_processes

    _watched.add(raylet)
    ray_ends = ray_ends_workers_processes(at_shutdown=True)  # read while it runs

    def watch() -> None:
        _wait_for_exit(raylet[0])
        try:
            _finish_after({raylet}, ray_ends)
        except Exception:
            logger.warning("cleaning up after the local Ray failed", exc_info=True)

    threading.Thread(target=watch, name="rsl-local-ray", daemon=True).start()


def finish_at_exit() -> None:
    """The driver's exit (``atexit``, registered by the processor's build): where this process
    started the local Ray its jobs ran on, Ray's shutdown kills the node's agent with the
    engines (SIGKILL, all at once), so what the engines' processes left is finished here,
    after it (their processes are ended here only where that Ray leaves them running:
    ``compat.ray_ends_workers_processes``): Ray is shut down first (what its own exit hook
    does next, and a second call does nothing), then :func:`_finish_after`. A driver that
    joined a running cluster leaves the work to its agents, which outlive it."""
    import ray

    from ray_stream_llm.integrations.ray.compat import ray_ends_workers_processes, settle_ray_data

    ending = set()
    ray_ends = False
    if ray.is_initialized():
        settle_ray_data()  # before Ray's shutdown, here or in its own exit hook
        raylet = _local_raylet()
        if raylet is None:
            return  # not a Ray of this process: its agents go on
        ending.add(raylet)
        ray_ends = ray_ends_workers_processes(at_shutdown=True)  # read while it runs
        ray.shutdown()
    _finish_after(ending, ray_ends)


@functools.cache
def finish_at_exit_of_this_process() -> None:
    """Register, once per process (the driver's): :func:`finish_at_exit` at its exit, and
    :func:`watch_local_ray` after each ``ray.init()`` of it (and now, where Ray runs)."""
    import atexit

    from ray._private import worker

    atexit.register(finish_at_exit)
    if watch_local_ray not in worker._post_init_hooks:
        worker._post_init_hooks.append(watch_local_ray)
    watch_local_ray()
