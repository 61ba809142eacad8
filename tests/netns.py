"""Test hosts in network namespaces: a bridge of their own, one veth pair per host.

A `Network` makes namespaces named `o14-<pid>-<name>`: one holds a bridge, each
test host gets a veth pair (its end `eth0` with an address of the test's private
/24, the other end a port of the bridge) and `lo` up. A command runs on a host as
`ip netns exec NAME ...` (the `command()` prefix); a function of this process runs
there in a thread of its own that joined the namespace (`call()`), so the test
reaches a host's loopback services and PostgreSQL without any address outside the
namespaces. `partition(host)` takes the host's bridge port down (the host keeps its
address and routes: its packets are silently dropped, as in a real partition) and
`heal(host)` brings it back.

Everything is removed in `close()`; at start, namespaces left by earlier runs (the
same prefix, a process ID no longer alive) are removed too. `require_netns()` skips
with the reason when this process is not root or the kernel refuses `ip netns add`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pytest

T = TypeVar("T")

PREFIX: Final = "o14"
CLONE_NEWNET: Final = 0x40000000
IP_TIMEOUT_S: Final = 10.0
CALL_TIMEOUT_S: Final = 60.0
BRIDGE: Final = "br0"
HOST_IF: Final = "eth0"
_LEFTOVER: Final = re.compile(rf"^{PREFIX}-(\d+)-\S+")
# Taken at import, before conftest's session fixture wraps it in its loopback guard.
_REAL_GETADDRINFO: Final = socket.getaddrinfo


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no `ip`, or the kernel refuses)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS...`; NetnsUnavailable with its stderr when it fails and `check`."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def probe() -> None:
    """NetnsUnavailable unless a namespace can be made (and removed) here."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("the ip program (iproute2) is not installed")
    name = f"{PREFIX}-{os.getpid()}-probe"
    ip("netns", "del", name, check=False)
    ip("netns", "add", name)
    ip("netns", "del", name)


def require_netns() -> None:
    """Skip the test, with the reason, where namespaces cannot be made."""
    try:
        probe()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")


def remove_leftovers() -> list[str]:
    """Delete namespaces of earlier runs (our prefix, a process that is gone)."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        match = _LEFTOVER.match(line)
        if match is None or _alive(int(match[1])):
            continue
        name = line.split()[0]
        ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_libc = ctypes.CDLL(None, use_errno=True)


def _enter(namespace: str) -> None:
    """Move the calling thread (only it) into the network namespace."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {namespace}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def call_in(namespace: str, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    """`fn()` in a new thread inside `namespace`: sockets it opens (and processes it
    starts) belong to that namespace. Its result, or its exception re-raised."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            _enter(namespace)
            outcome.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"netns {namespace}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"a call inside {namespace} took over {timeout_s:g} s")
    if failure:
        raise failure[0]
    return outcome[0]


@dataclass
class Host:
    """One test host: its namespace, its address, its port on the bridge."""

    name: str
    namespace: str
    address: str
    bridge_port: str
    network: Network

    def command(self, *argv: str) -> list[str]:
        """`argv` run on this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def call(self, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        return call_in(self.namespace, fn, timeout_s)


@dataclass
class Network:
    """Namespaces, a bridge and veth pairs for one test; `close()` removes them all."""

    subnet: str = "10.251.7.0/24"
    prefix: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._addresses = iter(ipaddress.ip_network(self.subnet).hosts())
        self.bridge_ns = f"{self.prefix}-br"
        try:
            self._namespace(self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", self.bridge_ns, "link", "set", BRIDGE, "up")
        except BaseException:
            self.close()
            raise

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def add_host(self, name: str) -> Host:
        """A new host on the bridge, with the next address of the subnet."""
        namespace = f"{self.prefix}-{name}"
        self._namespace(namespace)
        port = f"p{len(self.hosts)}"
        ip("link", "add", HOST_IF, "netns", namespace, "type", "veth",
           "peer", "name", port, "netns", self.bridge_ns)  # fmt: skip
        address = str(next(self._addresses))
        ip("-n", namespace, "addr", "add", f"{address}/{self.prefix_len}", "dev", HOST_IF)
        ip("-n", namespace, "link", "set", HOST_IF, "up")
        ip("-n", self.bridge_ns, "link", "set", port, "master", BRIDGE)
        ip("-n", self.bridge_ns, "link", "set", port, "up")
        host = Host(name, namespace, address, port, self)
        self.hosts[name] = host
        return host

    def partition(self, host: Host) -> None:
        """Cut the host off: its bridge port down, packets to and from it dropped."""
        ip("-n", self.bridge_ns, "link", "set", host.bridge_port, "down")

    def heal(self, host: Host) -> None:
        ip("-n", self.bridge_ns, "link", "set", host.bridge_port, "up")

    def _namespace(self, name: str) -> None:
        ip("netns", "del", name, check=False)
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def close(self) -> None:
        for name in reversed(self._namespaces):
            ip("netns", "del", name, check=False)
        self._namespaces.clear()
        self.hosts.clear()


@contextlib.contextmanager
def network(subnet: str = "10.251.7.0/24") -> Iterator[Network]:
    """A Network, skipped where namespaces are unavailable, removed on the way out."""
    require_netns()
    remove_leftovers()
    try:
        network = Network(subnet)
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    try:
        yield network
    finally:
        network.close()


def guard_allowing(subnet: str) -> str:
    """A sitecustomize for child processes: names resolve only to loopback or `subnet`
    (the conftest guard, widened to the test's own network)."""
    return f'''\
import ipaddress
import socket

_real_getaddrinfo = socket.getaddrinfo
_NETWORK = ipaddress.ip_network("{subnet}")


def _guarded(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name and name.lower() != "localhost":
        try:
            address = ipaddress.ip_address(name.split("%")[0])
            allowed = address.is_loopback or address in _NETWORK
        except ValueError:
            allowed = False
        if not allowed:
            raise socket.gaierror(socket.EAI_NONAME, f"test guard: {{name}} is not allowed")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _guarded
'''


def allow_network_here(monkeypatch: pytest.MonkeyPatch, subnet: str) -> None:
    """Widen this process's name guard (conftest's `loopback_only`) to `subnet`: the
    test reaches the sinks on their namespace addresses (from inside a namespace)."""
    guarded = socket.getaddrinfo
    allowed = ipaddress.ip_network(subnet)

    def widened(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        with contextlib.suppress(ValueError, TypeError):
            if ipaddress.ip_address(str(name).split("%")[0]) in allowed:
                return _REAL_GETADDRINFO(host, *args, **kwargs)
        return guarded(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", widened)
