"""Throughput/latency/CPU benchmark of riceguard against wireguard-go, boringtun and the plain
veth ceiling, in the same namespaces as the interop test (run through ci/bench.sh): each
implementation as it starts, each with one core per end, and riceguard as the appliance
(`riceguard up --config`, forwarding to a host behind it) with its firewall on and off; with
--cores-per-end N, riceguard and wireguard-go with N cores per end (riceguard's one-peer
spreading against one worker and against --spread off). Each daemon's CPU is also recorded
thread by thread (riceguard's workers: is one peer's work on all of them?).

Owns: the benchmark setups, the measurements, interleaved rounds, median/spread/ratios
(paired round by round for the firewall on/off pair), and the markdown + JSON + SVG report
(`--plot-only JSON` redraws the SVG of an earlier run). Not a test: it fails only when a
setup cannot be brought up in any round.
"""

import argparse
import base64
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgnet  # noqa: E402
from wgnet import LabError, log  # noqa: E402


# --- setups: how the path between side a and side b is made ---------------------------
# Each setup brings up its path in a fresh Lab and returns a Path: where iperf3's server
# runs and its address, the payload MTU, the daemon PIDs whose CPU is counted, and the cores
# the traffic endpoints are pinned to. Add a setup by adding a function and a SETUPS entry.

# The one-core-per-end layout: end A (side a: its daemon and the iperf3 client) on core 0,
# end B (side b's daemon, the iperf3 server: on b, or behind the appliance) on core 1.
CORE = {"a": 0, "b": 1}


class Path:
    def __init__(self, lab, dst, mtu, pids, server=None, cpus=None, status_side=None,
                 after=None):
        self.client = lab.a
        self.server = server or lab.b      # where the iperf3 server runs (.ns, .sh)
        self.dst, self.mtu, self.pids = dst, mtu, pids
        self.cpus = cpus                   # (client cores, server cores) or None: unpinned;
                                           # each a core or a taskset list ("0,1")
        self.status_side = status_side or lab.a   # whose `riceguard status` is recorded
        self.after = after                 # () -> dict of numbers recorded with each rep


class Netns:
    """A namespace of the lab besides a and b (the host behind the appliance)."""

    def __init__(self, ns):
        self.ns = ns

    def sh(self, argv, **kw):
        return wgnet.run(argv, ns=self.ns, **kw)


def extra_ns(lab, tag):
    """A namespace rgt<pid>-<lab index><tag> that the lab removes with its own (tag is not
    a or b; wgnet.sweep_stale() removes those a dead run left)."""
    n = Netns(f"{wgnet.NS_PREFIX}{os.getpid()}-{lab.index}{tag}")
    wgnet.run(["ip", "netns", "add", n.ns])
    lab.made_ns.append(n.ns)
    n.sh(["ip", "link", "set", "lo", "up"])
    return n


def start_daemon(lab, side, impl, argv, env=None):
    """Lab.start() for an argv of our own (taskset prefix, `up --config`): foreground in
    side's namespace, ready when its UAPI socket answers. `ip netns exec` and taskset both
    exec, so the PID is the daemon's."""
    side.impl = impl
    logpath = os.path.join(lab.logdir, f"{side.ifname}.{impl}.log")
    with open(logpath, "wb") as logf:
        proc = subprocess.Popen(["ip", "netns", "exec", side.ns] + argv, stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env or dict(os.environ), start_new_session=True)
    lab.procs.append(proc)
    side.pid = proc.pid
    lab.wait_ready(side, logpath, proc)


def start_pinned(lab, side, impl, core):
    """`taskset -c CORE` + the implementation's usual argv (wireguard-go, boringtun)."""
    env = dict(os.environ, WG_PROCESS_FOREGROUND="1")
    if impl == "boringtun":
        env["WG_LOG_FILE"] = os.path.join(lab.logdir, f"{side.ifname}.boringtun.log")
    start_daemon(lab, side, impl,
                 ["taskset", "-c", str(core)] + wgnet.impl_argv(impl, side.ifname), env)


def setup_veth(lab):
    return Path(lab, lab.b.outer4, 1500, [])


def setup_tunnel(impl, extra_args=(), attempts=10, side_args=None, pinned=False):
    """Setup for `impl` on both sides; riceguard gets `extra_args` after $RG_ARGS, then
    `side_args[tag]` for side "a" or "b" (all recorded in the JSON as the setup's "args").
    `pinned`: one core per end (CORE) for the traffic endpoints too, and wireguard-go and
    boringtun started under `taskset -c` (riceguard pins itself: pass --cores)."""
    side_args = side_args or {}

    def setup(lab):
        for s in (lab.b, lab.a):
            if pinned and impl != "riceguard":
                start_pinned(lab, s, impl, CORE[s.tag])
            else:
                lab.start(s, impl, list(extra_args) + side_args.get(s.tag, []))
        wgnet.configure_pair(lab, lab.a, lab.b)
        if wgnet.wait_reply(lab.a, lab.b.inner4, attempts=attempts) is None:
            raise LabError(f"{impl}: no reply through the tunnel within {attempts} s")
        return Path(lab, lab.b.inner4, wgnet.TUNNEL_MTU, [lab.a.pid, lab.b.pid],
                    cpus=(CORE["a"], CORE["b"]) if pinned else None)
    if pinned and impl != "riceguard":
        setup.extra_args = [f"(a: taskset -c {CORE['a']}) (b: taskset -c {CORE['b']})"]
    else:
        setup.extra_args = list(extra_args) + [
            f"({tag}: {' '.join(v)})" for tag, v in sorted(side_args.items()) if v]
    return setup


def setup_riceguard_tcp(lab):
    """Hook for the TCP-fallback row: riceguard on both sides with every UDP datagram
    between the outer addresses dropped by nftables, so the tunnel must run over TCP.
    Extra riceguard flags for it come from $RG_TCP_ARGS (after $RG_ARGS)."""
    for side in (lab.a, lab.b):
        side.sh(["nft", "-f", "-"], input_text=(
            "table inet rgbench {\n chain out {\n  type filter hook output priority 0;\n"
            "  ip daddr 10.203.0.0/24 meta l4proto udp drop\n"
            "  ip6 daddr fd03::/64 meta l4proto udp drop\n }\n}\n"))
    extra = os.environ.get("RG_TCP_ARGS", "").split()
    # Two unanswered UDP handshakes (5 s apart) come before the switch to TCP.
    path = setup_tunnel("riceguard", extra, attempts=25)(lab)
    path.mtu = wgnet.TUNNEL_MTU - 54  # DESIGN.md: ~54 bytes less inside TCP
    return path


# The appliance rows: side b runs `riceguard up --config` (the firewall on or off) and
# routes for a host H (namespace rgt<pid>-<n>h) on a second uplink-zone port; side a is
# the client (drop-in riceguard, AllowedIPs covering H's subnet) and iperf3 runs from a
# to H, so every inner packet is forwarded by b: tunnel -> prerouting -> conntrack ->
# forward -> masquerade on the way out, conntrack de-NAT on the way back. H is "the
# internet" of a full-tunnel client: with the firewall on it has no route to the tunnel
# subnet (the replies reach a only through the NAT); with it off (nothing translated) its
# default route is via b. The outer WireGuard datagrams cross the raw prerouting (anti-spoof,
# notrack), input and output chains.
HOST_NET, HOST_GW, HOST_ADDR = "10.205.0.0/24", "10.205.0.1", "10.205.0.2"
HOST_PORT = "vh"  # b's port to H: in the uplink zone (every interface but lo and the tunnel)


def appliance_conf(lab, firewall, metrics=False, peers=0, access=False):
    """`peers`: that many extra peers; `access`: each with an `Access` of its own
    (ACL_ACCESS), and the measured client restricted too (MEASURED_ACCESS)."""
    a, b = lab.a, lab.b
    path = os.path.join(lab.workdir, f"{b.ifname}.conf")
    wgnet.write_secret(path, (
        f"[Interface]\nPrivateKey = {b.private_key}\nListenPort = {b.port}\n"
        f"Address = {b.inner4}/24, {b.inner6}/64\nMTU = {wgnet.TUNNEL_MTU}\n\n"
        f"[Peer]\nPublicKey = {a.public_key}\nAllowedIPs = {a.inner4}/32, {a.inner6}/128\n"
        + (f"Access = {MEASURED_ACCESS}\n" if access else "") + "\n"
        + "".join(extra_peer(i, access) for i in range(peers))
        + f"[Gateway]\nInterfaceName = {b.ifname}\nCores = {CORE['b']}\nUplink = {b.veth}\n"
        f"Firewall = {'on' if firewall else 'off'}\n"
        + (f"Metrics = on\nMetricsPort = {METRICS_PORT}\n" if metrics else "")))
    return path


# appliance-acl500-1core: appliance-1core with 500 more peers (never connected), each
# with an Access of its own, and the measured client restricted too (its flows to H go
# through its own chain, found by the source map); its ratio against appliance-1core (no
# Access anywhere: no maps, no chains) is what 500 restricted clients cost, and against
# appliance-peers500-1core (the same 500 peers without Access) what their firewall rules
# cost apart from the peers themselves (device table, timers, routes).
ACL_PEERS = 500
ACL_ACCESS = "lan, 192.168.1.10/32 tcp 8096"
MEASURED_ACCESS = f"lan, {HOST_NET}"


def extra_peer(i, access):
    """Extra peer i: a public key of 32 random bytes (nobody holds its private key; the
    peer only has to be configured) and a /32 of its own in 10.211.0.0/16."""
    key = base64.b64encode(os.urandom(32)).decode()
    return (f"[Peer]\nPublicKey = {key}\nAllowedIPs = 10.211.{i // 250}.{i % 250 + 1}/32\n"
            + (f"Access = {ACL_ACCESS}\n" if access else "") + "\n")


def conntrack_entries(side):
    cp = side.sh(["sysctl", "-n", "net.netfilter.nf_conntrack_count"], check=False)
    return int(cp.stdout) if cp.returncode == 0 and cp.stdout.strip().isdigit() else None


# appliance-scraped-1core: appliance-1core with `Metrics = on` and Prometheus' scrape
# every second from H (one-armed: H's subnet is the uplink's own, so the endpoint serves
# it) during every run; its ratio against appliance-1core is what scraping costs.
METRICS_PORT = 9586
SCRAPER = r"""
import socket, sys, time
url_host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = bad = 0
while True:
    t = time.monotonic()
    try:
        s = socket.create_connection((url_host, port), timeout=2)
        s.settimeout(2)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        s.close()
        if got.startswith(b"HTTP/1.1 200"):
            n += 1
        else:
            bad += 1
    except OSError:
        bad += 1
    with open(out, "w") as f:
        f.write(f"{n} {bad}\n")
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
"""


def scrapes(path):
    try:
        with open(path) as f:
            n, bad = f.read().split()
        return {"scrapes": int(n), "scrapes_failed": int(bad)}
    except (OSError, ValueError):
        return {"scrapes": None, "scrapes_failed": None}


def setup_appliance(firewall, scraped=False, peers=0, access=False):
    def setup(lab):
        a, b = lab.a, lab.b
        h = extra_ns(lab, "h")
        wgnet.run(["ip", "link", "add", HOST_PORT, "netns", b.ns, "type", "veth",
                   "peer", "name", "eth0", "netns", h.ns])
        b.sh(["ip", "addr", "add", f"{HOST_GW}/24", "dev", HOST_PORT])
        b.sh(["ip", "link", "set", HOST_PORT, "up"])
        h.sh(["ip", "addr", "add", f"{HOST_ADDR}/24", "dev", "eth0"])
        h.sh(["ip", "link", "set", "eth0", "up"])
        if not firewall:
            h.sh(["ip", "route", "add", "default", "via", HOST_GW])
        argv = [wgnet.riceguard_bin(), "up", "--config",
                appliance_conf(lab, firewall, metrics=scraped, peers=peers,
                                       access=access)]
        start_daemon(lab, b, "riceguard", argv + os.environ.get("RG_ARGS", "").split())
        lab.start(a, "riceguard", ["--workers", "1", "--cores", str(CORE["a"])])
        a.sh(["wg", "set", a.ifname, "private-key", a.keyfile, "listen-port", str(a.port),
              "peer", b.public_key, "endpoint", f"{b.outer4}:{b.port}",
              "allowed-ips", f"{b.inner4}/32,{b.inner6}/128,{HOST_NET}"])
        wgnet.address_tunnel(a)
        a.sh(["ip", "route", "add", HOST_NET, "dev", a.ifname])
        if wgnet.wait_reply(a, HOST_ADDR) is None:
            raise LabError(f"appliance: no reply from {HOST_ADDR} behind it within 10 s")
        # What is measured is what the row says: the table and its NAT there (or not),
        # forwarding on.
        table = b.sh(["nft", "list", "table", "inet", "riceguard"], check=False)
        if firewall and (table.returncode or "masquerade" not in table.stdout
                         or "notrack" not in table.stdout):
            raise LabError(f"appliance: table inet riceguard with notrack and masquerade "
                           f"missing: {(table.stdout + table.stderr)[-300:]}")
        if not firewall and table.returncode == 0:
            raise LabError("appliance: Firewall = off but table inet riceguard is there")
        if access:
            # Every restricted peer's source in the forward map, the measured client's too.
            fmap = b.sh(["nft", "list", "map", "inet", "riceguard", "client-fwd4"], check=False)
            jumps = fmap.stdout.count("jump")
            if fmap.returncode or jumps < peers + 1 or a.inner4 not in fmap.stdout:
                raise LabError(f"appliance: map client-fwd4 with {peers + 1} peers' sources "
                               f"missing ({jumps} jumps): {(fmap.stdout + fmap.stderr)[-300:]}")
        elif firewall and "client-fwd4" in table.stdout:
            raise LabError("appliance: no Access anywhere, but map client-fwd4 is there")
        if b.sh(["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip() != "1":
            raise LabError("appliance: net.ipv4.ip_forward is not on")
        count = os.path.join(lab.workdir, "scrapes")
        if scraped:
            lab.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", h.ns, "python3", "-c", SCRAPER, HOST_GW,
                 str(METRICS_PORT), count], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

        def after():
            out = {"conntrack_entries": conntrack_entries(b)}
            if scraped:
                out.update(scrapes(count))
            return out
        return Path(lab, HOST_ADDR, wgnet.TUNNEL_MTU, [a.pid, b.pid], server=h,
                    cpus=(CORE["a"], CORE["b"]), status_side=b, after=after)
    setup.extra_args = [f"(a: --workers 1 --cores {CORE['a']}) (b: up --config, Cores = "
                        f"{CORE['b']}, Firewall = {'on' if firewall else 'off'}, iperf3 "
                        f"server on a host behind b"
                        + (", /metrics scraped every second from it" if scraped else "")
                        + (f", {peers} more peers" if peers else "")
                        + (f" with Access = {ACL_ACCESS}, the client with Access = "
                           f"{MEASURED_ACCESS}" if access else "")
                        + ")"]
    return setup


def with_binary(env_var, fn):
    """`fn` with riceguard started from the binary in $env_var instead of $RG_BIN: a
    before/after comparison (an older build against this one) in the same interleaved
    rounds, so the host's changing load falls on both alike."""
    def setup(lab):
        base = os.environ.get(env_var)
        if not base or not os.access(base, os.X_OK):
            raise LabError(f"${env_var} does not name an executable riceguard")
        old = os.environ.get("RG_BIN")
        os.environ["RG_BIN"] = base
        try:
            return fn(lab)
        finally:
            if old is None:
                os.environ.pop("RG_BIN", None)
            else:
                os.environ["RG_BIN"] = old
    setup.extra_args = list(fn.extra_args) + [f"(riceguard from ${env_var})"]
    return setup


# --- N cores per end (--cores-per-end N) -------------------------------------------------
# End A (side a's daemon, the iperf3 client) on cores 0..N-1, end B (side b's daemon, the
# iperf3 server) on cores N..2N-1, counted modulo the cores this process may run on: when
# 2N is more than those, the two sets overlap (the ends share cores) and the report and the
# JSON ("cores" of each setup, "core_groups") say so. One peer each side; riceguard's
# one-peer spreading is the daemon's default (nothing passed), its -nospread row passes
# `--spread off`, its -w1 row runs one worker on the end's first core (the iperf3 end keeps
# all N).

def end_layout(n):
    """{"a": [cores], "b": [cores], ...}: the two ends' core sets for N cores per end."""
    cpus = sorted(os.sched_getaffinity(0))

    def uniq(xs):
        return [x for i, x in enumerate(xs) if x not in xs[:i]]
    a = uniq([cpus[i % len(cpus)] for i in range(n)])
    b = uniq([cpus[(n + i) % len(cpus)] for i in range(n)])
    shared = sorted(set(a) & set(b))
    info = {"cores_per_end": n, "cpus": len(cpus), "a": a, "b": b,
            "ends_share_cores": bool(shared), "shared_cores": shared}
    if shared:
        info["note"] = (f"the ends SHARE cores {cpulist(shared)}: {n} cores per end needs "
                        f"{2 * n}, this machine has {len(cpus)} (sets taken modulo "
                        f"{len(cpus)}); the two ends compete for them")
    else:
        info["note"] = "each end on cores of its own (no core shared)"
    return info


def cpulist(cores):
    return ",".join(str(c) for c in cores)


CORES_VARIANTS = {  # setup-name suffix -> riceguard's arguments for (n, the end's cores)
    "": lambda n, cores: ["--workers", str(n), "--cores", cpulist(cores)],
    "-w1": lambda n, cores: ["--workers", "1", "--cores", str(cores[0])],
    "-nospread": lambda n, cores: ["--workers", str(n), "--cores", cpulist(cores),
                                   "--spread", "off"],
}


def setup_cores(impl, n, variant=""):
    """`impl` on both sides, each end on its own N cores (end_layout); wireguard-go under
    `taskset -c` (GOMAXPROCS unset), riceguard with CORES_VARIANTS[variant]."""
    info = end_layout(n)

    def setup(lab):
        for s in (lab.b, lab.a):
            cores = info[s.tag]
            if impl == "riceguard":
                try:
                    lab.start(s, impl, CORES_VARIANTS[variant](n, cores))
                except LabError as e:
                    # The daemon's own complaint (e.g. a flag this build does not know),
                    # without the usage text that follows it.
                    msg = str(e)
                    err = [ln for ln in msg.splitlines() if ln.startswith("error:")]
                    raise LabError(f"{msg.splitlines()[0]}" + (f" ({'; '.join(err[1:])})"
                                   if len(err) > 1 else "")) from e
            else:
                env = dict(os.environ, WG_PROCESS_FOREGROUND="1")
                env.pop("GOMAXPROCS", None)
                start_daemon(lab, s, impl, ["taskset", "-c", cpulist(cores)]
                             + wgnet.impl_argv(impl, s.ifname), env)
        wgnet.configure_pair(lab, lab.a, lab.b)
        if wgnet.wait_reply(lab.a, lab.b.inner4) is None:
            raise LabError(f"{impl}: no reply through the tunnel within 10 s")
        return Path(lab, lab.b.inner4, wgnet.TUNNEL_MTU, [lab.a.pid, lab.b.pid],
                    cpus=(cpulist(info["a"]), cpulist(info["b"])))
    if impl == "riceguard":
        args = {t: " ".join(CORES_VARIANTS[variant](n, info[t])) for t in ("a", "b")}
    else:
        args = {t: f"taskset -c {cpulist(info[t])}, GOMAXPROCS unset" for t in ("a", "b")}
    setup.extra_args = [f"(a: {args['a']}) (b: {args['b']}) iperf3 client on "
                        f"{cpulist(info['a'])}, server on {cpulist(info['b'])}"
                        + ("; ENDS SHARE CORES" if info["ends_share_cores"] else "")]
    setup.info = info
    return setup


CORES_NAME = re.compile(r"(riceguard|wireguard-go)-([1-9][0-9]*)c(-w1|-nospread)?")


def cores_group(n):
    """Register the setups of N cores per end (riceguard-Nc, riceguard-Nc-w1,
    riceguard-Nc-nospread, wireguard-go-Nc) and return their names."""
    g = f"{n}c"
    names = [f"riceguard-{g}", f"riceguard-{g}-w1", f"riceguard-{g}-nospread",
             f"wireguard-go-{g}"]
    if names[0] in SETUPS:
        return names
    SETUPS[names[0]] = Setup(setup_cores("riceguard", n), "riceguard", g,
                             compare=names[1:])
    SETUPS[names[1]] = Setup(setup_cores("riceguard", n, "-w1"), "riceguard", g)
    SETUPS[names[2]] = Setup(setup_cores("riceguard", n, "-nospread"), "riceguard", g)
    SETUPS[names[3]] = Setup(setup_cores("wireguard-go", n), "wireguard-go", g)
    info = end_layout(n)
    GROUP_TITLES[g] = (f"{n} core{'s' if n > 1 else ''} per end: end A (side a's daemon, "
                       f"the iperf3 client) on cores {cpulist(info['a'])}, end B (side b's "
                       f"daemon, the iperf3 server) on cores {cpulist(info['b'])}; "
                       f"{info['note']}")
    SHORT[names[1]], SHORT[names[2]] = "w1", "nospread"
    return names


def known_setup(name):
    """True for a SETUPS name, registering the N-cores-per-end group a name such as
    riceguard-2c-w1 belongs to."""
    m = CORES_NAME.fullmatch(name)
    if name not in SETUPS and m and not (m.group(1) == "wireguard-go" and m.group(3)):
        cores_group(int(m.group(2)))
    return name in SETUPS


class Setup:
    """fn(lab) -> Path; impl: what must be installed; group: the core layout ("default":
    as each implementation starts, "1core": one core per end, "Nc": N cores per end),
    whose wireguard-go and boringtun rows are the ratio baselines; compare: further
    baselines for every metric."""

    def __init__(self, fn, impl, group="default", compare=()):
        self.fn, self.impl, self.group, self.compare = fn, impl, group, list(compare)
        self.info = getattr(fn, "info", None)  # the core layout (N cores per end)


RG_1CORE = {"a": ["--cores", str(CORE["a"])], "b": ["--cores", str(CORE["b"])]}
SETUPS = {
    "veth": Setup(setup_veth, None),
    "wireguard-go": Setup(setup_tunnel("wireguard-go"), "wireguard-go"),
    "boringtun": Setup(setup_tunnel("boringtun"), "boringtun"),
    "riceguard": Setup(setup_tunnel("riceguard"), "riceguard"),
    # Busy-polling workers (the latency target) need cores of their own: one worker per
    # side, side a's on core 0 and side b's on core 1. Pinned to the same core, the two
    # spinning workers took turns by scheduler time slice (idle ping 9 ms).
    "riceguard-busy": Setup(setup_tunnel("riceguard", ["--poll", "busy", "--workers", "1"],
                                         side_args=RG_1CORE), "riceguard"),
    "riceguard-tcp": Setup(setup_riceguard_tcp, "riceguard"),
    # One core per end (CORE), every implementation: with the default layout a single
    # flow's hash can put both ends' busy worker on the same core of this 2-core host
    # (3.4 instead of 4.9 Gbit/s), so those rows measure hash luck.
    "wireguard-go-1core": Setup(setup_tunnel("wireguard-go", pinned=True), "wireguard-go",
                                "1core"),
    "boringtun-1core": Setup(setup_tunnel("boringtun", pinned=True), "boringtun", "1core"),
    "riceguard-1core": Setup(setup_tunnel("riceguard", ["--workers", "1"], side_args=RG_1CORE,
                                          pinned=True), "riceguard", "1core"),
    # The same as riceguard-1core from $RG_BASE_BIN (an older build): ratios against
    # riceguard-1core are before/after.
    "riceguard-base-1core": Setup(with_binary("RG_BASE_BIN", setup_tunnel(
        "riceguard", ["--workers", "1"], side_args=RG_1CORE, pinned=True)), "riceguard",
        "1core", compare=["riceguard-1core"]),
    "appliance-1core": Setup(setup_appliance(True), "riceguard", "1core",
                             compare=["appliance-nofw-1core"]),
    "appliance-nofw-1core": Setup(setup_appliance(False), "riceguard", "1core"),
    # Not in the default list: `--setups appliance-1core,appliance-scraped-1core`.
    "appliance-scraped-1core": Setup(setup_appliance(True, scraped=True), "riceguard",
                                     "1core", compare=["appliance-1core"]),
    # Not in the default list: `--setups
    # appliance-1core,appliance-peers500-1core,appliance-acl500-1core`.
    "appliance-acl500-1core": Setup(setup_appliance(True, peers=ACL_PEERS, access=True),
                                    "riceguard", "1core",
                                    compare=["appliance-1core", "appliance-peers500-1core"]),
    "appliance-peers500-1core": Setup(setup_appliance(True, peers=ACL_PEERS), "riceguard",
                                      "1core", compare=["appliance-1core"]),
}
DEFAULT_SETUPS = ["veth", "wireguard-go", "boringtun", "riceguard", "riceguard-busy",
                  "wireguard-go-1core", "boringtun-1core", "riceguard-1core",
                  "appliance-1core", "appliance-nofw-1core"]
GROUP_TITLES = {"default": "Each implementation as it starts (its own threads and workers, "
                           "unpinned traffic endpoints)",
                "1core": f"One core per end: end A (daemon, iperf3 client) on core "
                         f"{CORE['a']}, end B (daemon, iperf3 server) on core {CORE['b']}"}
# How ratio baselines are named in table cells.
SHORT = {"wireguard-go": "wg-go", "boringtun": "boringtun", "veth": "veth",
         "appliance-nofw-1core": "fw off", "appliance-1core": "appliance",
         "appliance-peers500-1core": "500 peers"}

# --- metrics ----------------------------------------------------------------------------
# name -> (label, unit shown, factor from the JSON's unit to the one shown). Throughputs are
# kept in Mbit/s in the JSON (as before) and shown in Gbit/s.
METRICS = {
    "tcp1_mbps": ("TCP 1 stream", "Gbit/s", 1e-3),
    "tcp4_mbps": ("TCP 4 streams", "Gbit/s", 1e-3),
    "udp_goodput_mbps": ("UDP @1G goodput", "Gbit/s", 1e-3),
    "udp_loss_pct": ("UDP @1G loss", "%", 1),
    "pps64_kpps": ("UDP 64 B", "kpps", 1),
    "rtt_idle_ms": ("ping idle", "ms", 1),
    "rtt_load_ms": ("ping under load", "ms", 1),
    "cpu_s_per_gbit_tcp1": ("CPU TCP 1", "s/Gbit", 1),
    "cpu_s_per_gbit_udp": ("CPU UDP", "s/Gbit", 1),
}
THROUGHPUT = ("tcp1_mbps", "tcp4_mbps", "udp_goodput_mbps", "pps64_kpps")


def group_of(name):
    s = SETUPS.get(name)
    return s.group if s else "default"


def group_base(impl, group):
    """The baseline row of implementation `impl` in core layout `group`."""
    return impl if group == "default" else f"{impl}-{group}"


def baselines(name, metric):
    """The rows `name`'s median of `metric` is divided by for its ratio columns: throughputs
    by the same layout's wireguard-go and boringtun (and, default layout, the veth ceiling),
    idle RTT by the bare veth (the issue-11 targets), and a setup's `compare` rows for every
    metric but the loss; never a row by itself."""
    g = group_of(name)
    out = []
    if metric in THROUGHPUT:
        out += [group_base("wireguard-go", g), group_base("boringtun", g)]
        if g == "default":
            out.append("veth")
    if metric == "rtt_idle_ms":
        out.append("veth")
    if metric != "udp_loss_pct" and name in SETUPS:
        out += SETUPS[name].compare
    return [b for b in out if b != name and name != "veth"]


def short(base):
    for k in (base, base.rsplit("-", 1)[0]):
        if k in SHORT:
            return SHORT[k]
    return base


# Without a bigger socket buffer the receiving iperf3 drops ~half of 1 Gbit/s even on a bare
# veth on this 2-core host; 4 MiB is net.core.rmem_max here (recorded in the JSON).
UDP_BUF = ["-w", "4M"]


def daemon_cpu(pids):
    vals = [wgnet.cpu_seconds(p) for p in pids]
    return None if any(v is None for v in vals) else sum(vals)


def pin(cores):
    """taskset prefix for a core or a core list ("0,1"); none for None."""
    return [] if cores is None else ["taskset", "-c", str(cores)]


def thread_cpu(pid):
    """{tid: (thread name, utime+stime in s)} of every thread of `pid` now, from
    /proc/PID/task/TID/{stat,comm}; None when the process is gone."""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
    return out


def threads_snapshot(path):
    """{"a": thread_cpu(side a's daemon), "b": ...} (path.pids is [a, b] for a tunnel)."""
    if len(path.pids) != 2:
        return None
    return dict(zip("ab", (thread_cpu(p) for p in path.pids)))


def threads_used(before, after):
    """CPU s each thread used between two threads_snapshot()s: {side: {name: s}}. A name
    that several threads share (wireguard-go's) is keyed name#index, index in TID order;
    a thread born in between counts from 0; one that ended in between is not there."""
    if not before or not after:
        return None
    out = {}
    for side in after:
        b, a = before.get(side), after.get(side)
        if b is None or a is None:
            continue
        names = [c for c, _ in a.values()]
        seen, per = {}, {}
        for tid in sorted(a):
            comm, t = a[tid]
            if names.count(comm) > 1:
                key = f"{comm}#{seen.get(comm, 0)}"
                seen[comm] = seen.get(comm, 0) + 1
            else:
                key = comm
            per[key] = round(max(0.0, t - b.get(tid, (comm, 0.0))[1]), 3)
        out[side] = per
    return out or None


def iperf3(lab, path, seconds, args=(), port=5201):
    """wgnet.iperf3() from path.client to path.dst on path.server, each iperf3 under
    `taskset` when the path pins its ends (path.cpus)."""
    c_core, s_core = path.cpus or (None, None)
    return wgnet.iperf3(lab, path.client, path.server, path.dst, seconds, args, port,
                        client_prefix=pin(c_core), server_prefix=pin(s_core))


def measure(lab, path, secs):
    a, dst, pids = path.client, path.dst, path.pids
    out = {}
    out["rtt_idle_ms"] = wgnet.ping(a, dst, count=20, interval=0.05)["rtt_avg_ms"]

    # Single TCP stream with a ping alongside for the loaded RTT.
    pinger = wgnet.ping_start(lab, a, dst, max(1, int(secs / 0.2) - 5), 0.2)
    c0, t0 = daemon_cpu(pids), threads_snapshot(path)
    res = iperf3(lab, path, secs)
    c1, t1 = daemon_cpu(pids), threads_snapshot(path)
    out["threads_cpu_s"] = threads_used(t0, t1)
    loaded = wgnet.ping_finish(pinger, secs + 10)
    out["rtt_load_ms"] = loaded["rtt_avg_ms"] if loaded else None
    out["tcp1_mbps"] = wgnet.tcp_mbps(res)
    gbits = res["end"]["sum_received"]["bytes"] * 8 / 1e9
    out["cpu_s_per_gbit_tcp1"] = (c1 - c0) / gbits if pids and c0 is not None \
        and c1 is not None and gbits > 0 else None

    res = iperf3(lab, path, secs, args=["-P", "4"])
    out["tcp4_mbps"] = wgnet.tcp_mbps(res)

    # UDP at 1 Gbit/s offered, datagrams sized to the path (no IP fragmentation).
    payload = path.mtu - 28
    c0, t0 = daemon_cpu(pids), threads_snapshot(path)
    res = iperf3(lab, path, secs, args=["-u", "-b", "1G", "-l", str(payload)] + UDP_BUF)
    c1, t1 = daemon_cpu(pids), threads_snapshot(path)
    out["threads_cpu_s_udp"] = threads_used(t0, t1)
    sent, recv = res["end"]["sum_sent"]["bytes"], res["end"]["sum_received"]["bytes"]
    out["udp_goodput_mbps"] = res["end"]["sum_received"]["bits_per_second"] / 1e6
    out["udp_loss_pct"] = 100.0 * (1 - recv / sent) if sent else None
    gbits = recv * 8 / 1e9
    out["cpu_s_per_gbit_udp"] = (c1 - c0) / gbits if pids and c0 is not None \
        and c1 is not None and gbits > 0 else None

    # Small packets, unlimited rate: packets per second delivered.
    res = iperf3(lab, path, secs, args=["-u", "-b", "0", "-l", "64"] + UDP_BUF)
    r = res["end"]["sum_received"]
    out["pps64_kpps"] = r["bytes"] / 64 / r["seconds"] / 1e3 if r["seconds"] else None
    if path.after:
        out.update(path.after())
    return out


def riceguard_status(lab, side):
    """What riceguard says about itself (offload decisions; the appliance's firewall and
    NAT lines): `riceguard status IFNAME`, else the lines of its log that mention
    offload/GSO/GRO/io_uring."""
    info = {}
    path = wgnet.impl_path("riceguard")
    if path:
        try:
            cp = side.sh([path, "status", side.ifname], check=False, timeout=10)
            info["status_cmd"] = {"rc": cp.returncode, "out": (cp.stdout + cp.stderr)[-4000:]}
        except LabError as e:
            info["status_cmd"] = {"error": str(e)}
    logpath = os.path.join(lab.logdir, f"{side.ifname}.riceguard.log")
    try:
        with open(logpath, errors="replace") as f:
            info["log_offload_lines"] = [ln.rstrip() for ln in f
                                         if any(k in ln.lower() for k in
                                                ("offload", "gso", "gro", "uso", "tso",
                                                 "io_uring", "hugepage", "vnet"))][:40]
    except OSError:
        pass
    return info


class BenchLab(wgnet.Lab):
    """wgnet.Lab that also removes what a riceguard daemon leaves in the host's /run when
    it cannot exit cleanly (status file; the appliance's pid file, only if it is ours)."""

    def close(self):
        mine = [s for s in (self.a, self.b) if s is not None and s.impl == "riceguard"]
        pids = {s.pid for s in mine}
        super().close()
        for s in mine:
            try:
                os.unlink(f"/run/riceguard/{s.ifname}.status")
            except OSError:
                pass
        try:
            with open("/run/riceguard.pid") as f:
                stale = int(f.read().strip() or 0) in pids
        except (OSError, ValueError):
            stale = False
        if stale:
            os.unlink("/run/riceguard.pid")


def run_rep(name, rep, opts, index, logdir, res):
    """One repetition of setup `name` (round `rep`), added to res["reps"]; a failure is
    recorded in res["failed"] and does not stop the setup's later rounds."""
    setup = SETUPS[name].fn
    log(f"== {name} round {rep + 1}/{opts.reps}")
    load = os.getloadavg()[0]
    try:
        with BenchLab(index * 100 + rep, logdir) as lab:
            path = setup(lab)
            if SETUPS[name].impl == "riceguard" and "riceguard" not in res:
                res["riceguard"] = riceguard_status(lab, path.status_side)
            r = measure(lab, path, opts.seconds)
    except (LabError, KeyError, ValueError) as e:
        log(f"  failed: {e}")
        res.setdefault("failed", []).append({"round": rep, "error": str(e)})
        return
    r["round"], r["load1"] = rep, load
    log("  " + ", ".join(f"{k}={v:.3g}" for k, v in r.items()
                         if isinstance(v, (int, float))))
    res["reps"].append(r)


def run_all(setups, opts, logdir):
    """Every setup once per round, opts.reps rounds; odd rounds run the setups in reverse
    order, so slow drift of the host's load (other builds) falls on all rows alike."""
    results = {}
    for name in setups:
        s = SETUPS[name]
        results[name] = {"reps": []}
        if s.impl and wgnet.impl_path(s.impl) is None:
            results[name] = {"skipped": f"{s.impl} not available"}
        elif getattr(s.fn, "extra_args", None):
            results[name]["args"] = s.fn.extra_args
        if s.info and "skipped" not in results[name]:
            results[name]["cores"] = s.info
    for rep in range(opts.reps):
        order = list(enumerate(setups))
        for index, name in (order if rep % 2 == 0 else order[::-1]):
            if "skipped" not in results[name]:
                run_rep(name, rep, opts, index, logdir, results[name])
    for name, res in results.items():
        if "skipped" in res:
            continue
        if not res["reps"]:
            res["error"] = "; ".join(f["error"] for f in res.get("failed", [])) or "no run"
            continue
        res["summary"] = summarize(res["reps"])
        for k in THREAD_KEYS:
            t = threads_median(res["reps"], k)
            if t:
                res[k] = t
    return results


# Per-thread CPU of each daemon, in each rep and (median of the rounds, thread by thread)
# in each setup's result: the single-stream TCP run and the UDP run.
THREAD_KEYS = {"threads_cpu_s": "TCP 1 stream", "threads_cpu_s_udp": "UDP @1G"}


def threads_median(reps, key):
    per = {}
    for r in reps:
        for side, threads in (r.get(key) or {}).items():
            for name, v in threads.items():
                per.setdefault(side, {}).setdefault(name, []).append(v)
    return {side: {name: round(statistics.median(v), 3) for name, v in threads.items()}
            for side, threads in per.items()}


def worker_shares(threads):
    """"rg-worker-0 62%, rg-worker-1 38% (of 1.23 s)" for one side's threads, or None
    when it has fewer than two riceguard workers."""
    w = sorted(((int(k.rsplit("-", 1)[1]), v) for k, v in threads.items()
                if re.fullmatch(r"rg-worker-\d+", k)))
    if len(w) < 2:
        return None
    total = sum(v for _, v in w)
    if not total:
        return ", ".join(f"rg-worker-{i} -" for i, _ in w) + " (no CPU used)"
    return (", ".join(f"rg-worker-{i} {100 * v / total:.0f}%" for i, v in w)
            + f" (of {total:.2f} s)")


def summarize(reps):
    out = {}
    for k in METRICS:
        vals = [r[k] for r in reps if r.get(k) is not None]
        if vals:
            med = statistics.median(vals)
            out[k] = {"median": med, "min": min(vals), "max": max(vals), "n": len(vals),
                      "spread_pct": 100 * (max(vals) - min(vals)) / med if med else None}
    return out


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def add_ratios(results):
    """results[setup]["ratios"][metric] = {baseline: median / baseline's median} for each
    of the metric's baselines(); results[setup]["paired"][baseline][metric]: the same
    ratio taken round by round (both rows ran in the same round, next to each other),
    median and min-max, for a setup's `compare` rows."""
    for n, r in results.items():
        if "summary" not in r:
            continue
        r["ratios"] = {}
        for k in METRICS:
            mine = r["summary"].get(k)
            for base in baselines(n, k):
                b = results.get(base, {}).get("summary", {}).get(k)
                if mine and b and b["median"]:
                    r["ratios"].setdefault(k, {})[base] = mine["median"] / b["median"]
        for base in (SETUPS[n].compare if n in SETUPS else []):
            other = {x.get("round"): x for x in results.get(base, {}).get("reps", [])}
            for k in METRICS:
                if k == "udp_loss_pct":
                    continue
                vals = [x[k] / other[x["round"]][k] for x in r["reps"]
                        if x.get(k) is not None and x.get("round") in other
                        and other[x["round"]].get(k)]
                if vals:
                    r.setdefault("paired", {}).setdefault(base, {})[k] = {
                        "median": statistics.median(vals), "min": min(vals),
                        "max": max(vals), "n": len(vals)}


def cell(results, n, k, reps):
    s = results[n]["summary"].get(k)
    if s is None:
        return "-"
    f = METRICS[k][2]
    c = fmt(s["median"] * f)
    if reps > 1:
        c += f" [{fmt(s['min'] * f)}–{fmt(s['max'] * f)}]"
    parts = [f"{v:.2f}× {short(base)}" for base, v in results[n].get("ratios", {}).get(k, {}).items()]
    return c + (" (" + ", ".join(parts) + ")" if parts else "")


def report(results, opts):
    lines = []
    names = [n for n in results if "summary" in results[n]]
    groups = []
    for n in names:
        if group_of(n) not in groups:
            groups.append(group_of(n))
    for g in groups:
        cols = [n for n in names if group_of(n) == g]
        rows = [[f"{label} ({unit})"] + [cell(results, n, k, opts.reps) for n in cols]
                for k, (label, unit, _) in METRICS.items()]
        lines.append(f"\n{GROUP_TITLES.get(g, g)}:\n")
        lines.append(wgnet.md_table(["metric"] + cols, rows))
    if opts.reps > 1:
        lines.append(f"\nmedian of {opts.reps} rounds of {opts.seconds} s runs, [min–max]; "
                     "ratios of medians (throughputs against wireguard-go and boringtun of "
                     "the same core layout).")
    for n in names:
        for base, per in results[n].get("paired", {}).items():
            lines.append(f"\n{n} ÷ {base}, round by round (median [min–max] of "
                         f"{max(p['n'] for p in per.values())} paired rounds):")
            for k, p in per.items():
                lines.append(f"- {METRICS[k][0]}: {p['median']:.3f}× "
                             f"[{p['min']:.3f}–{p['max']:.3f}]")
    rows = []
    for n in names:
        for k, label in THREAD_KEYS.items():
            cells = [worker_shares(results[n].get(k, {}).get(side, {})) for side in "ab"]
            if any(cells):
                rows.append([n, label] + [c or "-" for c in cells])
    if rows:
        lines.append("\nriceguard's workers, share of the workers' CPU s (from "
                     "/proc/PID/task; median of the rounds; all threads in the JSON, "
                     "threads_cpu_s and threads_cpu_s_udp):\n")
        lines.append(wgnet.md_table(["setup", "run", "side a workers", "side b workers"],
                                    rows))
    lines.append("")
    for n, r in results.items():
        if r.get("args"):
            lines.append(f"- {n}: {' '.join(r['args'])}")
    for n, r in results.items():
        if "summary" not in r:
            lines.append(f"- {n}: {r.get('skipped') or 'error: ' + r.get('error', '?')}")
        for f in r.get("failed", []):
            lines.append(f"- {n}: round {f['round'] + 1} failed: {f['error']}")
    lines.append(noise_line(results))
    return "\n".join(lines)


def noise_line(results):
    loads = [x["load1"] for r in results.values() for x in r.get("reps", []) if "load1" in x]
    spreads = sorted((s["spread_pct"], n) for n, r in results.items()
                     for k, s in r.get("summary", {}).items()
                     if k == "tcp1_mbps" and s.get("spread_pct") is not None and s["n"] > 1)
    out = "noise:"
    if loads:
        out += (f" 1-minute load average at the start of each run {min(loads):.1f}–"
                f"{max(loads):.1f} (median {statistics.median(loads):.1f}) on "
                f"{os.cpu_count()} cpus;")
    if spreads:
        out += (f" TCP 1 stream (max−min)/median per row {spreads[0][0]:.0f} % "
                f"({spreads[0][1]}) to {spreads[-1][0]:.0f} % ({spreads[-1][1]}), median "
                f"{statistics.median(s for s, _ in spreads):.0f} %")
    return out


# --- the plot: three panels of bars, one bar per setup, SVG by hand -----------------------
# metric, panel title, y-axis label, what the small "N×" under each value is relative to
PANELS = [
    ("tcp1_mbps", "single-stream TCP", "Gbit/s (higher is better)", "wireguard-go"),
    ("cpu_s_per_gbit_tcp1", "daemon CPU per Gbit/s", "CPU s per Gbit (lower is better)", None),
    ("rtt_idle_ms", "idle ping RTT", "ms (lower is better)", "veth"),
]
COLORS = {"veth": "#9e9e9e", "wireguard-go": "#4e79a7", "boringtun": "#f28e2b",
          "riceguard": "#59a14f", "riceguard-busy": "#2e6b2a", "riceguard-tcp": "#76b7b2",
          "wireguard-go-1core": "#7fa6cf", "boringtun-1core": "#f7b877",
          "riceguard-1core": "#8cc77f", "appliance-1core": "#b07aa1",
          "appliance-nofw-1core": "#d4b3cb"}
PALETTE = ["#e15759", "#b07aa1", "#edc948", "#ff9da7", "#9c755f"]


def nice_axis(top, ticks=5):
    """(axis maximum, tick step) with the step 1, 2, 2.5 or 5 × 10^k and max >= top."""
    if not top or top <= 0:
        return 1.0, 0.2
    raw = top / ticks
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    return math.ceil(top / step - 1e-9) * step, step


def plot_svg(doc):
    """The SVG text for a bench JSON document (as written by main())."""
    results = doc["results"]
    names = [n for n in results if "summary" in results[n]]
    colors, spare = {}, iter(PALETTE * 4)
    for n in names:
        colors[n] = COLORS.get(n) or next(spare)
    n_bars = max(4, len(names))  # a panel is never narrower than its title
    slot, left_pad, right_pad, gap = 46, 58, 8, 26
    pw = left_pad + slot * n_bars + right_pad           # one panel
    top, ph = 78, 210                                   # plot area top and height
    label_h = 16 + 4.5 * max((len(n) for n in names), default=4)  # names at -40°
    width = 16 + len(PANELS) * pw + (len(PANELS) - 1) * gap + 16
    foot_y = top + ph + label_h + 20
    reps = doc.get("reps", 1)
    notes = [("bars: median of %d rounds, whiskers min–max" % reps) if reps > 1
             else "bars: a single run (no spread)"]
    if any(group_of(n) == "1core" for n in names):
        notes.append("right of the dashed line: one core per end")
    for g in sorted({group_of(n) for n in names if CORES_NAME.fullmatch(n)}):
        info = next(results[n]["cores"] for n in names
                    if group_of(n) == g and results[n].get("cores"))
        notes.append(f"{g}: end A cores {cpulist(info['a'])}, end B cores "
                     f"{cpulist(info['b'])}"
                     + (" (THE ENDS SHARE CORES)" if info["ends_share_cores"] else ""))
    notes += [f"{n}: {' '.join(r['args'])}" for n, r in results.items() if r.get("args")]
    notes += [f"{n}: {r.get('skipped') or 'error: ' + str(r.get('error', '?'))[:80]}"
              for n, r in results.items() if "summary" not in r]
    foot, budget = [""], int((width - 32) / 5.6)   # notes packed into lines that fit
    for note in notes:
        if foot[-1] and len(foot[-1]) + 3 + len(note) > budget:
            foot.append("")
        foot[-1] += (" · " if foot[-1] else "") + note
    height = foot_y + 16 * len(foot) + 14
    env = doc.get("environment", {})
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>']

    def text(x, y, s, size=11, anchor="middle", extra=""):
        out.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
                   f'{extra}>{escape(str(s))}</text>')

    def line(x1, y1, x2, y2, stroke="#333", w=1):
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                   f'stroke="{stroke}" stroke-width="{w}"/>')

    text(16, 24, f"RiceGuard make bench {doc.get('date', '')}", 15, "start", ' font-weight="bold"')
    text(16, 42, f"{reps} × {doc.get('seconds', '?')} s runs; kernel {env.get('kernel', '?')}, "
         f"{env.get('nproc', '?')} cpus, load at start "
         f"{(env.get('loadavg_at_start') or [0])[0]:.1f}; TCP CPU of both daemons", 11, "start", ' fill="#555"')

    for i, (key, title, ylabel, base) in enumerate(PANELS):
        x0 = 16 + i * (pw + gap)
        left, right, bottom = x0 + left_pad, x0 + pw - right_pad, top + ph
        f = METRICS[key][2]
        sums = {n: {k: v * f for k, v in s.items() if k in ("median", "min", "max")}
                if s else None
                for n, s in ((n, results[n]["summary"].get(key)) for n in names)}
        hi = max((max(s["max"], s["median"]) for s in sums.values() if s), default=0)
        ymax, step = nice_axis(hi * 1.2)   # head room for the value and ratio labels

        def y(v):
            return bottom - ph * v / ymax
        text((left + right) / 2, top - 16, title, 13, extra=' font-weight="bold"')
        k, ratios = 0, 0
        while k * step <= ymax * (1 + 1e-9):
            v = k * step
            line(left, y(v), right, y(v), "#e4e4e4" if k else "#333")
            text(left - 5, y(v) + 4, f"{round(v, 10):g}", 10, "end")
            k += 1
        line(left, top, left, bottom)
        out.append(f'<text x="{x0 + 13:.1f}" y="{top + ph / 2:.1f}" font-size="11" '
                   f'text-anchor="middle" transform="rotate(-90 {x0 + 13:.1f} {top + ph / 2:.1f})"'
                   f'>{escape(ylabel)}</text>')
        for j, n in enumerate(names):
            cx, s = left + slot * (j + 0.5 + (n_bars - len(names)) / 2), sums[n]
            if j and group_of(n) != group_of(names[j - 1]):  # a core layout starts
                out.append(f'<line x1="{cx - slot / 2:.1f}" y1="{top:.1f}" x2="{cx - slot / 2:.1f}" '
                           f'y2="{bottom:.1f}" stroke="#999" stroke-dasharray="3,3"/>')
            lx, ly = cx + 3, bottom + 12
            out.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="10" text-anchor="end" '
                       f'transform="rotate(-40 {lx:.1f} {ly:.1f})">{escape(n)}</text>')
            if not s:
                text(cx, bottom - 4, "n/a", 9, extra=' fill="#888"')
                continue
            bw = slot * 0.62
            out.append(f'<rect x="{cx - bw / 2:.1f}" y="{y(s["median"]):.1f}" width="{bw:.1f}" '
                       f'height="{bottom - y(s["median"]):.1f}" fill="{colors[n]}"/>')
            label_top = y(s["median"])
            if s["max"] > s["min"]:
                line(cx, y(s["min"]), cx, y(s["max"]), "#111", 1.2)
                for v in (s["min"], s["max"]):
                    line(cx - bw / 5, y(v), cx + bw / 5, y(v), "#111", 1.2)
                label_top = min(label_top, y(s["max"]))
            b = group_base(base, group_of(n)) if base == "wireguard-go" else base
            ratio = results[n].get("ratios", {}).get(key, {}).get(b) if base else None
            if ratio is not None:
                r = f"{ratio:.2f}" if ratio < 1 else f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}"
                text(cx, label_top - 4, f"{r}×", 9, extra=' fill="#666"')
                label_top -= 11
                ratios += 1
            text(cx, label_top - 4, fmt(s["median"]), 10, extra=' font-weight="bold"')
        if ratios:
            same = " (same core layout)" if base == "wireguard-go" else ""
            text((left + right) / 2, top - 3, f"grey: ratio to {base}{same}", 9,
                 extra=' fill="#666"')

    for j, ln in enumerate(foot):
        text(16, foot_y + 16 * j, ln, 10, "start", ' fill="#555"')
    out.append("</svg>")
    svg = "\n".join(out) + "\n"
    ET.fromstring(svg)  # well-formed, or this raises
    return svg


def write_plot(doc, json_path):
    """Write the SVG next to `json_path` (same basename, .svg) and return its path."""
    path = os.path.splitext(json_path)[0] + ".svg"
    with open(path, "w") as f:
        f.write(plot_svg(doc))
    return path


def environment():
    def first_line(argv):
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=5)
            return ((cp.stdout or cp.stderr).strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired):
            return None
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {
        "kernel": platform.release(),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "iperf3": first_line(["iperf3", "--version"]),
        "wg": first_line(["wg", "--version"]),
        "impls": {n: {"path": wgnet.impl_path(n), "version": wgnet.impl_version(n)}
                  for n in wgnet.IMPLS},
        "RG_ARGS": os.environ.get("RG_ARGS", ""),
        "rmem_max": first_line(["sysctl", "-n", "net.core.rmem_max"]),
        "wmem_max": first_line(["sysctl", "-n", "net.core.wmem_max"]),
        "tunnel_mtu": wgnet.TUNNEL_MTU,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ci/bench.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups",
                    help=f"comma-separated, from: {', '.join(SETUPS)}, and the "
                    "N-cores-per-end names riceguard-Nc, riceguard-Nc-w1, "
                    "riceguard-Nc-nospread, wireguard-go-Nc (default: "
                    f"{','.join(DEFAULT_SETUPS)})")
    ap.add_argument("--cores-per-end", type=int, metavar="N",
                    help="the N-cores-per-end group (riceguard-Nc, riceguard-Nc-w1, "
                    "riceguard-Nc-nospread, wireguard-go-Nc) instead of the default setups "
                    "(after them with --setups)")
    ap.add_argument("--with-tcp-fallback", action="store_true",
                    help="add the riceguard-over-TCP row (UDP dropped by nftables)")
    ap.add_argument("--reps", type=int, default=3,
                    help="rounds: each round runs every setup once (interleaved)")
    ap.add_argument("--seconds", type=int, default=4, help="length of each iperf3 run")
    ap.add_argument("--quick", action="store_true", help="1 round of 3 s runs")
    ap.add_argument("--out", help="JSON path (default out/bench/bench-<UTC time>.json); "
                    "the SVG plot goes next to it (same name, .svg)")
    ap.add_argument("--plot-only", metavar="JSON",
                    help="only (re)draw the SVG of an earlier run's JSON, next to it; no root")
    opts = ap.parse_args(argv)
    if opts.plot_only:
        with open(opts.plot_only) as f:
            doc = json.load(f)
        for n in doc["results"]:
            known_setup(n)  # an N-cores-per-end group: its group and ratio baselines
        add_ratios(doc["results"])  # JSON from before a METRICS change gets today's ratios
        print(f"SVG: {write_plot(doc, opts.plot_only)}")
        return 0
    if opts.quick:
        opts.reps, opts.seconds = 1, 3
    if opts.cores_per_end is not None and opts.cores_per_end < 1:
        raise SystemExit("--cores-per-end takes a number of cores, 1 or more")
    setups = opts.setups.split(",") if opts.setups else (
        [] if opts.cores_per_end else list(DEFAULT_SETUPS))
    if opts.cores_per_end:
        setups += [n for n in cores_group(opts.cores_per_end) if n not in setups]
    if opts.with_tcp_fallback and "riceguard-tcp" not in setups:
        setups.append("riceguard-tcp")
    bad = [s for s in setups if not known_setup(s)]
    if bad or opts.reps < 1 or opts.seconds < 1:
        raise SystemExit(f"bad --setups {bad} or --reps/--seconds")

    wgnet.require_root()
    wgnet.install_signal_handlers()
    wgnet.sweep_stale()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    outdir = os.path.join(wgnet.REPO, "out", "bench")
    logdir = os.path.join(outdir, f"logs-{stamp}")
    os.makedirs(logdir, exist_ok=True)
    env = environment()
    log(f"bench: {', '.join(setups)}; {opts.reps} rounds of {opts.seconds} s runs; kernel "
        f"{env['kernel']}, load {env['loadavg_at_start']}")

    t0 = time.monotonic()
    results = run_all(setups, opts, logdir)
    add_ratios(results)
    text = report(results, opts)
    print(text)
    path = opts.out or os.path.join(outdir, f"bench-{stamp}.json")
    env["loadavg_at_end"] = os.getloadavg()
    doc = {"date": stamp, "reps": opts.reps, "seconds": opts.seconds,
           "environment": env, "results": results,
           "core_groups": {group_of(n): SETUPS[n].info for n in setups if SETUPS[n].info},
           "elapsed_s": round(time.monotonic() - t0, 1)}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    svg = write_plot(doc, path)
    print(f"\nJSON: {os.path.relpath(path, wgnet.REPO)}; kernel {env['kernel']}, "
          f"{env['nproc']} cpus, load at start {env['loadavg_at_start'][0]:.1f}")
    print(f"SVG: {os.path.relpath(svg, wgnet.REPO)}; {doc['elapsed_s']:.0f} s")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
