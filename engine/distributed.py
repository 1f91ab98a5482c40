"""Data parallel across hosts: the address and network interface a node is reached at, and the ranks
agreeing on one answer (which checkpoint to resume) from what each of them sees on its own disk.

paddle's launcher takes a node's address from `--host`, or else from the host name; gloo (and NCCL)
bind the interface of the host name's address unless GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) names
one. On many machines the host name resolves to 127.0.0.1, or to an address of another interface than
the one the nodes share: the ranks are then told to connect to addresses they cannot reach and wait.
"""
import fcntl
import os
import socket
import struct

from engine.errors import ConfigError

_SIOCGIFADDR = 0x8915   # linux: an interface's (primary) IPv4 address


def interfaces():
    """{interface name: IPv4 address} of this host (of its network namespace); interfaces with no
    IPv4 address are left out."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found[name] = socket.inet_ntoa(raw[20:24])
    return found


def describe(ifaces):
    return ", ".join(f"{name} {ip}" for name, ip in ifaces.items()) or "none with an IPv4 address"


def is_loopback(ip):
    return ip.startswith("127.")


def hostname_address():
    """(host name, the address paddle's launcher takes for this node without --host; None when the
    name does not resolve)."""
    name = socket.gethostname()
    try:
        return name, socket.gethostbyname(socket.getfqdn(name))
    except OSError:
        return name, None


def node_address(host, multi_node, ifaces=None, resolved=None):
    """The address the other nodes reach this one at: `host` (the launcher's --host) or the host
    name's address (`resolved`: (name, address), default `hostname_address()`). In a multi-node job
    it must be an address of this host's interfaces, and not loopback: else one line saying what to
    pass."""
    ifaces = interfaces() if ifaces is None else ifaces
    if host:
        if host not in ifaces.values():
            raise ConfigError(f"--host {host} is not an address of this host (its interfaces: "
                              f"{describe(ifaces)}); pass the address the other nodes reach this one at")
        if multi_node and is_loopback(host):
            raise ConfigError(f"--host {host} is loopback, which the other nodes cannot reach; pass the "
                              f"address they reach this one at")
        return host
    name, address = resolved or hostname_address()
    if not multi_node:
        return address or "127.0.0.1"
    outside = [ip for ip in ifaces.values() if not is_loopback(ip)]
    hint = f"pass --host with this node's address ({' or '.join(outside) or 'none found'})"
    if address is None:
        raise ConfigError(f"this host's name '{name}' does not resolve to an address; {hint}")
    if is_loopback(address):
        raise ConfigError(f"this host's name '{name}' resolves to {address} (loopback), which the other "
                          f"nodes cannot reach; {hint}")
    if address not in ifaces.values():
        raise ConfigError(f"this host's name '{name}' resolves to {address}, which is not an address of "
                          f"this host (its interfaces: {describe(ifaces)}); {hint}")
    return address


def endpoint_hosts(env=os.environ):
    """The hosts of the job's trainers (PADDLE_TRAINER_ENDPOINTS, set by the launcher), in rank order."""
    return [ep.rsplit(":", 1)[0] for ep in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if ep]


def this_host(env=os.environ):
    """This rank's address as the launcher gave it (PADDLE_CURRENT_ENDPOINT)."""
    return env.get("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0]


def socket_interface(device, env=os.environ, ifaces=None):
    """Bind the collectives to the interface that holds this rank's address: GLOO_SOCKET_IFNAME (CPU)
    or NCCL_SOCKET_IFNAME (GPU) unless the user set it. Returns (variable, interface, address), or
    None where nothing was set (one host and no interface for the address: gloo's default works)."""
    var = "NCCL_SOCKET_IFNAME" if device == "gpu" else "GLOO_SOCKET_IFNAME"
    ifaces = interfaces() if ifaces is None else ifaces
    address = this_host(env)
    if env.get(var):
        if env[var] not in ifaces:
            raise ConfigError(f"{var}={env[var]}: no such interface with an IPv4 address on this host "
                              f"(its interfaces: {describe(ifaces)})")
        return var, env[var], ifaces[env[var]]
    names = [name for name, ip in ifaces.items() if ip == address]
    if not names:
        if len(set(endpoint_hosts(env))) > 1:
            raise ConfigError(f"this rank's address {address} (the launcher's --host, or this host's name) "
                              f"is not an address of this host (its interfaces: {describe(ifaces)}); "
                              f"pass --host to the launcher, or set {var}")
        return None
    env[var] = names[0]
    return var, names[0], address


def where(rank, hosts=None):
    """'rank 1 (10.77.0.2)'."""
    hosts = endpoint_hosts() if hosts is None else hosts
    return f"rank {rank} ({hosts[rank]})" if rank < len(hosts) else f"rank {rank}"


def gather(obj):
    """`obj` of every rank, in rank order ([obj] outside data parallel)."""
    import paddle  # the launcher's supervisor (engine/launch.py) imports this module and never loads paddle
    if paddle.distributed.get_world_size() < 2:
        return [obj]
    out = []
    paddle.distributed.all_gather_object(out, obj)
    return out


def any_rank(flag):
    """Whether `flag` holds on any rank (one small all-reduce; a collective: every rank must call it)."""
    import paddle  # the launcher's supervisor imports this module and never loads paddle
    if paddle.distributed.get_world_size() < 2:
        return bool(flag)
    t = paddle.to_tensor([1 if flag else 0], dtype="int32")
    paddle.distributed.all_reduce(t)
    return bool(t.item())
