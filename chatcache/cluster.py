"""`chatcache cluster`: N `chatcache serve` replicas on one PostgreSQL behind HAProxy, on one machine.

For trying out the set-up that goes past one machine, with the parts it would run on there:
PostgreSQL holds every session (turn leases keep two replicas off one session, and answers one
replica stores reach the others' answer caches); HAProxy pins each conversation to one replica
by a consistent hash of its session id (the `X-Session-Id` header, else the id in
`/v1/sessions/{id}/...`), so its KV stays in that replica's memory; the replicas share one data
directory, so a session that moves restores its spilled KV instead of recomputing it (each
file is checked against the ids, weights and template it was written for, and its signature
against the one spill key every replica is given: `replica_key_file`).

HAProxy rather than nginx: open-source nginx notices a dead upstream only when a request to it
fails, while HAProxy checks `GET /ready` on every replica each second and takes one out after
three failures, so a dead replica's sessions move to the others within about three seconds
(its port refuses at once), while one that is only busy has 5 s to answer; a request whose
connection to a dead replica fails is sent to another (`redispatch`). It also names the
replica that served each response (`X-Chatcache-Replica`).

`up` starts everything as background processes, writes what it started to
`<data dir>/cluster/state.json`, and returns once every replica is ready; `status` reads it back
with what is alive; `down` stops the replicas (SIGTERM: they drain, spill their KV and close the
database), then the router and the database it started. Only loopback addresses are used.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from chatcache.storage import default_data_dir
from chatcache.storage.engine import DATA_DIR_ENV

from .errors import ConfigError
from .spill_keys import GENERATED_KEY_FILE, KEY_ENV, generate_key_file, read_key_file

HOST = "127.0.0.1"
READY_TIMEOUT_S = 600.0  # replicas load the model and the embedder at once, on shared cores
STOP_TIMEOUT_S = 60.0
Balance = Literal["session", "random"]


@dataclass
class Process:
    """One started process: what it is, its pid, where it listens and logs."""

    name: str
    pid: int
    url: str
    log: str


@dataclass
class ClusterState:
    """What `up` started, as `status` and `down` read it back."""

    router: Process
    replicas: list[Process]
    database_url: str
    database_dir: str | None = None  # the PostgreSQL data directory `up` created; None: given with --db
    database_user: str | None = None  # the user PostgreSQL runs as when it is not the caller
    started_at: float = field(default_factory=time.time)


def state_path() -> Path:
    return default_data_dir() / "cluster" / "state.json"


def read_state() -> ClusterState | None:
    path = state_path()
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return ClusterState(
        router=Process(**raw["router"]),
        replicas=[Process(**replica) for replica in raw["replicas"]],
        **{key: raw[key] for key in ("database_url", "database_dir", "database_user", "started_at")},
    )


def up(
    replicas: int,
    port: int,
    db: str | None = None,
    serve_options: list[str] | None = None,
    balance: Balance = "session",
    own_data_dirs: bool = False,
    kv_key_file: Path | None = None,
) -> ClusterState:
    """Start the database (unless `db` names one), `replicas` replicas and the router on `port`.

    Every replica signs and checks spilled KV with the same keys: those of `kv_key_file`, else
    `CHATCACHE_KV_KEY` (the replicas inherit the environment), else `kv.key` in the cluster's state
    directory, generated on the first `up` and kept by `down`, so that the next `up` still
    restores what the last one spilled. Keys never go through the spill directory.

    `balance` and `own_data_dirs` are for measuring what affinity and a shared spill store
    are worth (`bench/replicas.py`): "random" sends each request to any replica, and with
    `own_data_dirs` each replica keeps its spilled KV in `<data dir>/replica-N`.

    Raises:
        ConfigError: a cluster is already up, `replicas` is below 1, a port is taken, the key
            file is unreadable or holds a bad key, or HAProxy or (without `db`) PostgreSQL's
            server programs are not installed.
        RuntimeError: a process did not start; what was started is stopped again.
    """
    if read_state() is not None:
        raise ConfigError("A cluster is already up (`chatcache cluster status`); stop it first with `chatcache cluster down`.")
    if replicas < 1:
        raise ConfigError(f"--replicas must be at least 1, got {replicas}")
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise ConfigError("HAProxy is not installed: `apt-get install haproxy` (Debian), then try again.")
    ports = [port, *(free_port() for _ in range(replicas))]
    if not _port_free(port):
        raise ConfigError(f"Port {port} is taken: pass another with --port.")
    directory = state_path().parent
    directory.mkdir(parents=True, exist_ok=True)
    kv_key_file = replica_key_file(directory, kv_key_file)
    key_option = ["--kv-key-file", str(kv_key_file)] if kv_key_file is not None else []
    database_dir = database_user = None
    if db is None:
        database_dir, database_user, db = _start_postgres(free_port())
    started: list[Process] = []
    state = None
    try:
        for index, replica_port in enumerate(ports[1:]):
            log = directory / f"replica-{index}.log"
            command = [sys.executable, "-m", "chatcache.cli", "serve", "--host", HOST, "--port", str(replica_port), "--db", db, *key_option, *(serve_options or [])]
            env = {**os.environ, DATA_DIR_ENV: str(directory.parent / f"replica-{index}")} if own_data_dirs else None
            started.append(_spawn(f"replica-{index}", command, f"http://{HOST}:{replica_port}", log, env))
        _wait_ready(started)
        # The router starts once every replica is ready, so its first health checks find them
        # all up: a replica that joined later would take over part of the hash ring, and
        # the sessions already answered elsewhere would move.
        config = directory / "haproxy.cfg"
        config.write_text(haproxy_config(port, [(p.name, p.url) for p in started], balance))
        router = _spawn("router", [haproxy, "-f", str(config), "-db"], f"http://{HOST}:{port}", directory / "router.log")
        state = ClusterState(router, started, db, database_dir, database_user)
        state_path().write_text(json.dumps(asdict(state), indent=2))
        _wait_ready([router])
        return state
    except BaseException:
        if state is None:
            state = ClusterState(Process("router", 0, "", ""), started, db, database_dir, database_user)
        stop(state)
        raise


def replica_key_file(directory: Path, given: Path | None) -> Path | None:
    """The spill key file every replica is given: `given`; else none when `CHATCACHE_KV_KEY` is
    set, since the replicas inherit the environment; else the cluster's own in `directory`,
    generated on first use.

    Raises:
        ConfigError: the file is unreadable or holds a bad key (found here, not in every replica's log).
    """
    if given is None and os.environ.get(KEY_ENV):
        return None
    path = (given or generate_key_file(directory / GENERATED_KEY_FILE)).expanduser().resolve()
    read_key_file(path)
    return path


def status() -> dict[str, Any]:
    """Each process of the cluster with whether it is alive (and each replica whether it is ready)."""
    state = read_state()
    if state is None:
        return {"up": False}
    replicas = [{**asdict(replica), "alive": _alive(replica.pid), "ready": _ready(replica.url)} for replica in state.replicas]
    return {
        "up": True,
        "url": state.router.url,
        "router": {**asdict(state.router), "alive": _alive(state.router.pid)},
        "replicas": replicas,
        "database_url": state.database_url,
        "database_started_here": state.database_dir is not None,
    }


def down() -> bool:
    """Stop what `up` started; False when no cluster was up."""
    state = read_state()
    if state is None:
        return False
    stop(state)
    return True


def stop(state: ClusterState) -> None:
    """Replicas first (SIGTERM: each drains its turns, spills KV and closes the database), then the
    router, then the database if `up` started it; the state file goes last."""
    for process in state.replicas:
        _signal(process.pid, signal.SIGTERM)
    for process in state.replicas:
        _wait_gone(process.pid, STOP_TIMEOUT_S)
    if state.router.pid:
        _signal(state.router.pid, signal.SIGTERM)
        _wait_gone(state.router.pid, 10.0)
    if state.database_dir is not None:
        _run_as(state.database_user, [_postgres_program("pg_ctl"), "-D", state.database_dir, "stop", "-m", "fast"])
        shutil.rmtree(state.database_dir, ignore_errors=True)
    state_path().unlink(missing_ok=True)


def haproxy_config(port: int, replicas: list[tuple[str, str]], balance: Balance = "session") -> str:
    """The router: a consistent hash of the session id (or a random pick) over the replicas that pass `/ready`.

    `avalanche` mixes the hash, so ids that differ in one character ("s1", "s2") spread over
    the replicas instead of clustering on one."""
    servers = "\n".join(f"    server {name} {url.removeprefix('http://')}" for name, url in replicas)
    policy = "balance hash var(txn.session)\n    hash-type consistent sdbm avalanche" if balance == "session" else "balance random"
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    retries 3
    option redispatch

frontend chatcache
    bind {HOST}:{port}
    http-request set-var(txn.session) req.hdr(X-Session-Id)
    http-request set-var(txn.session) path,field(4,/) if {{ path_beg /v1/sessions/ }} !{{ var(txn.session) -m found }}
    default_backend replicas

backend replicas
    {policy}
    option httpchk GET /ready
    timeout check 5s
    default-server check inter 1s fall 3 rise 2
    http-response set-header X-Chatcache-Replica %s
{servers}
"""


# -- processes ---------------------------------------------------------------------------


def _spawn(name: str, command: list[str], url: str, log: Path, env: dict[str, str] | None = None) -> Process:
    """Start `command` in its own session (it outlives `chatcache cluster up`), output to `log`."""
    with open(log, "ab") as out:
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    return Process(name, child.pid, url, str(log))


def _wait_ready(processes: list[Process]) -> None:
    """Until each answers `GET /ready` (the router does once its health checks pass)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = list(processes)
    while waiting:
        for process in waiting:
            if not _alive(process.pid):
                raise RuntimeError(f"{process.name} exited while starting; its log: {process.log}")
        waiting = [process for process in waiting if not _ready(process.url)]
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"{', '.join(p.name for p in waiting)} not ready after {READY_TIMEOUT_S:g} s; see {waiting[0].log}")
        time.sleep(0.2 if waiting else 0)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our own child that exited is reaped, not a zombie
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child (started by an earlier `up`)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited; its parent has not reaped it yet


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            _signal(pid, signal.SIGKILL)
            return
        time.sleep(0.1)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


# -- a throwaway PostgreSQL ----------------------------------------------------------------


def _start_postgres(port: int) -> tuple[str, str | None, str]:
    """initdb and start a PostgreSQL on loopback in a new directory; its directory, user and URL.

    PostgreSQL refuses to run as root: run as root, it runs as the `postgres` user.
    """
    user = "postgres" if os.geteuid() == 0 else None
    directory = tempfile.mkdtemp(prefix="chatcache-cluster-pg-")
    if user is not None:
        shutil.chown(directory, user)
    try:
        _run_as(user, [_postgres_program("initdb"), "-D", directory, "-A", "trust", "-U", "postgres"])
        options = f"-p {port} -k {directory} -c listen_addresses={HOST} -c max_connections=200"
        _run_as(user, [_postgres_program("pg_ctl"), "-D", directory, "-l", f"{directory}/server.log", "-w", "-o", options, "start"])
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory, user, f"postgresql+psycopg://postgres@{HOST}:{port}/postgres"


def _postgres_program(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise ConfigError(f"PostgreSQL's {name} is not installed: `apt-get install postgresql`, or pass --db with a PostgreSQL URL.")
    return found


def _run_as(user: str | None, command: list[str]) -> None:
    full = ["runuser", "-u", user, "--", *command] if user is not None else command
    done = subprocess.run(full, capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
