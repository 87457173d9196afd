"""etcd side by side: a 3-member etcd cluster on loopback and a raw grpc.aio ``etcdserverpb.KV/Put`` client.

No etcd proto is vendored: a PutRequest is two length-delimited fields (key = 1, value = 2), encoded by
hand below, and the response is only checked for arriving (gRPC status OK).  The leader is found with
``etcdctl endpoint status`` so the load goes where etcd's own benchmark sends it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from kraft.netutil import free_port, wait_for_port
from kraft.procutil import reap, spawn_child

PUT_METHOD = "/etcdserverpb.KV/Put"


def etcd_available() -> bool:
    return shutil.which("etcd") is not None and shutil.which("etcdctl") is not None


def ensure_etcd_installed(timeout_s: float = 300.0) -> bool:
    """Install Debian's ``etcd-server``/``etcd-client`` when missing (needs root); False if impossible.
    ``KRAFT_BENCH_ETCD_INSTALL=0``: never try (a machine without network, where apt-get could only wait
    for its timeout; bench.device_suite sets it)."""
    if etcd_available():
        return True
    if shutil.which("apt-get") is None or os.environ.get("KRAFT_BENCH_ETCD_INSTALL") == "0":
        return False
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        subprocess.run(
            ["apt-get", "update", "-qq"], check=True, timeout=timeout_s, env=env, capture_output=True
        )
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "etcd-server", "etcd-client"],
            check=True,
            timeout=timeout_s,
            env=env,
            capture_output=True,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return etcd_available()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def encode_put_request(key: bytes, value: bytes) -> bytes:
    """``etcdserverpb.PutRequest{key: 1, value: 2}`` in protobuf wire format."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class EtcdCluster:
    """Three (or ``size``) etcd members under ``base_dir``; use as a context manager: always stopped."""

    base_dir: Path
    size: int = 3
    heartbeat_ms: int = 100
    election_ms: int = 1000
    members: list[EtcdMember] = field(default_factory=list)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 30.0) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [
            EtcdMember(
                f"etcd{i}",
                free_port(),
                free_port(),
                self.base_dir / f"etcd{i}",
                self.base_dir / f"etcd{i}.log",
            )
            for i in range(1, self.size + 1)
        ]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        try:
            for member in self.members:
                self._spawn(member, initial)
            for member in self.members:
                if not wait_for_port("127.0.0.1", member.client_port, timeout_s):
                    raise RuntimeError(f"etcd member {member.name} did not listen; see {member.log_path}")
            self.wait_for_leader(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, member: EtcdMember, initial_cluster: str) -> None:
        args = [
            "etcd",
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.client_url,
            "--advertise-client-urls",
            member.client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"bench-{self.members[0].client_port}",
            "--heartbeat-interval",
            str(self.heartbeat_ms),
            "--election-timeout",
            str(self.election_ms),
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        with member.log_path.open("ab") as log:
            member.process = spawn_child(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def leader(self) -> EtcdMember | None:
        """The member etcd reports as leader (``etcdctl endpoint status``), or None."""
        endpoints = ",".join(m.client_url for m in self.members if m.process and m.process.poll() is None)
        try:
            out = subprocess.run(
                [
                    "etcdctl",
                    "--endpoints",
                    endpoints,
                    "--command-timeout=2s",
                    "endpoint",
                    "status",
                    "-w",
                    "json",
                ],
                capture_output=True,
                timeout=10,
                check=False,
                env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
            )
        except subprocess.TimeoutExpired:
            return None
        try:
            statuses = json.loads(out.stdout or b"[]")
        except json.JSONDecodeError:
            return None
        for status in statuses:
            header = status.get("Status", {}).get("header", {})
            if header.get("member_id") and header.get("member_id") == status["Status"].get("leader"):
                url = status.get("Endpoint", "")
                return next((m for m in self.members if m.client_url == url), None)
        return None

    def wait_for_leader(self, timeout_s: float) -> EtcdMember:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None:
                return found
            time.sleep(0.1)
        raise RuntimeError(f"etcd elected no leader within {timeout_s} s; logs in {self.base_dir}")

    def stop(self) -> None:
        for member in self.members:
            process = member.process
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
        for member in self.members:
            process = member.process
            if process is None:
                continue
            reap(process)


class EtcdPutClient:
    """A grpc.aio channel to one member with a raw Put; ``await put(key, value)``."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._put = self._channel.unary_unary(PUT_METHOD, request_serializer=None, response_deserializer=None)

    async def put(self, key: bytes, value: bytes, timeout_s: float = 5.0) -> None:
        await self._put(encode_put_request(key, value), timeout=timeout_s)

    async def close(self) -> None:
        await self._channel.close(grace=None)
