"""Network-namespace lab for WireGuard interop tests and benchmarks (used by ci/interop.sh
and ci/bench.sh).

Owns: creating two namespaces joined by a veth pair, starting userspace WireGuard daemons
inside them, configuring them with stock `wg`/`ip` exactly as a user would, measuring with
ping/iperf3/`wg show`, and removing everything it created. Nothing here touches the host's
own namespace except the UAPI sockets the daemons make in /var/run/wireguard, which is
shared by all namespaces: every interface name carries this process's PID so runs and
pairs never collide.

Only the Python standard library is used.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UAPI_DIR = "/var/run/wireguard"
NS_PREFIX = "rgt"  # namespaces are rgt<pid>-<n><a|b>; see sweep_stale()

# Outer (veth) and inner (tunnel) addressing, used only inside our namespaces.
OUTER4 = {"a": "10.203.0.1", "b": "10.203.0.2"}
OUTER6 = {"a": "fd03::1", "b": "fd03::2"}
ROAM4 = "10.203.0.11"  # side a's second outer address for the roaming check
INNER4 = {"a": "10.204.0.1", "b": "10.204.0.2"}
INNER6 = {"a": "fd04::1", "b": "fd04::2"}
PORT = {"a": 51820, "b": 51821}
TUNNEL_MTU = 1420


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class LabError(Exception):
    """A step of the lab failed; the message says which and why."""


def run(argv, ns=None, timeout=20, check=True, env=None, input_text=None):
    """Run a command (inside namespace `ns` if given); return CompletedProcess with text."""
    full = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    try:
        cp = subprocess.run(full, capture_output=True, text=True, timeout=timeout,
                            env=env, input=input_text)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"timed out after {timeout}s: {' '.join(full)}") from e
    except FileNotFoundError as e:
        raise LabError(f"not installed: {full[0]}") from e
    if check and cp.returncode != 0:
        raise LabError(f"`{' '.join(full)}` exited {cp.returncode}: "
                       f"{(cp.stderr or cp.stdout).strip()[-400:]}")
    return cp


# ---------------------------------------------------------------------------------------
# Implementations: how to start each userspace WireGuard as a foreground daemon.

def _cargo_bin(name):
    found = shutil.which(name)
    if found:
        return found
    cand = os.path.join(os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo")), "bin", name)
    return cand if os.access(cand, os.X_OK) else None


def riceguard_bin():
    path = os.environ.get("RG_BIN") or os.path.join(REPO, "target", "release", "riceguard")
    return os.path.abspath(path)


def impl_path(name):
    """Executable of implementation `name`, or None when it is not installed/built."""
    if name == "riceguard":
        p = riceguard_bin()
        return p if os.access(p, os.X_OK) else None
    if name == "wireguard-go":
        return shutil.which("wireguard-go")
    if name == "boringtun":
        return _cargo_bin("boringtun-cli")
    raise LabError(f"unknown implementation {name!r} (riceguard, wireguard-go, boringtun)")


IMPLS = ("riceguard", "wireguard-go", "boringtun")


def impl_argv(name, ifname, extra_args=()):
    """argv that runs implementation `name` in the foreground for interface `ifname`;
    riceguard also gets $RG_ARGS and `extra_args`."""
    path = impl_path(name)
    if path is None:
        raise LabError(f"{name} is not available (see ci/deps.sh; riceguard: $RG_BIN)")
    if name == "riceguard":
        return [path, "-f", ifname] + os.environ.get("RG_ARGS", "").split() + list(extra_args)
    if name == "wireguard-go":
        return [path, "-f", ifname]
    # boringtun-cli drops to the invoking sudo user unless told not to; its log goes to a
    # file of ours rather than the shared /tmp/boringtun.out.
    return [path, "-f", "--disable-drop-privileges", ifname]


def impl_version(name):
    path = impl_path(name)
    if path is None:
        return None
    for flag in (["--version"], ["-V"]):
        try:
            cp = subprocess.run([path] + flag, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        out = (cp.stdout or cp.stderr).strip().splitlines()
        if cp.returncode == 0 and out:
            return out[0]
    return "unknown"


# ---------------------------------------------------------------------------------------
# The lab: two namespaces, one veth pair, daemons we started.

def sweep_stale():
    """Remove namespaces left by an earlier run of ours that died without cleaning up:
    names rgt<pid>-<n><tag> whose <pid> no longer runs, whatever the tag (a and b are a
    lab's two sides; the attacker's x and bench's extra hosts use other letters; the Bash
    lab ci/pmtu.sh names its namespaces rgt<pid>-29<g|r|s|f> so that they are swept too).
    Processes inside such a namespace were started by that run and are ended by PID."""
    cp = run(["ip", "netns", "list"], check=False)
    for line in cp.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(NS_PREFIX + r"(\d+)-\d+[a-z]", name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        log(f"removing stale namespace {name} from dead run {m.group(1)}")
        _kill_ns_pids(name)
        run(["ip", "netns", "del", name], check=False)


def _kill_ns_pids(ns):
    cp = run(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in cp.stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
            time.sleep(0.05)
        if not pids:
            return


class Side:
    """One end of the lab: a namespace and the WireGuard interface in it."""

    def __init__(self, lab, tag):
        self.lab = lab
        self.tag = tag  # "a" or "b"
        self.ns = f"{NS_PREFIX}{os.getpid()}-{lab.index}{tag}"
        self.ifname = f"rg{os.getpid()}x{lab.index}{tag}"[:15]
        self.veth = f"v{tag}"
        self.port = PORT[tag]
        self.outer4, self.outer6 = OUTER4[tag], OUTER6[tag]
        self.inner4, self.inner6 = INNER4[tag], INNER6[tag]
        self.impl = None
        self.pid = None
        key = run(["wg", "genkey"]).stdout.strip()
        self.private_key = key
        self.public_key = run(["wg", "pubkey"], input_text=key + "\n").stdout.strip()
        self.keyfile = os.path.join(lab.workdir, f"{tag}.key")
        write_secret(self.keyfile, key + "\n")

    def sh(self, argv, **kw):
        return run(argv, ns=self.ns, **kw)


class Lab:
    """Context manager: `with Lab(index, workdir) as lab:` gives lab.a and lab.b, joined
    by veth va<->vb with 10.203.0.0/24 and fd03::/64; everything is removed on exit."""

    def __init__(self, index, logdir):
        self.index = index
        self.logdir = logdir
        self.workdir = tempfile.mkdtemp(prefix=f"rgt{os.getpid()}-{index}-")
        self.procs = []
        self.made_ns = []
        self.a = self.b = None

    def __enter__(self):
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _setup(self):
        self.a, self.b = Side(self, "a"), Side(self, "b")
        for s in (self.a, self.b):
            run(["ip", "netns", "add", s.ns])
            self.made_ns.append(s.ns)
            s.sh(["ip", "link", "set", "lo", "up"])
            # No DAD: addresses are usable at once; keep secondaries when the primary goes
            # (the roaming check replaces side a's address).
            for key, val in (("net.ipv6.conf.all.accept_dad", 0),
                             ("net.ipv6.conf.default.accept_dad", 0),
                             ("net.ipv4.conf.all.promote_secondaries", 1)):
                s.sh(["sysctl", "-qw", f"{key}={val}"])
        run(["ip", "link", "add", "va", "netns", self.a.ns, "type", "veth",
             "peer", "name", "vb", "netns", self.b.ns])
        for s in (self.a, self.b):
            s.sh(["ip", "addr", "add", f"{s.outer4}/24", "dev", s.veth])
            s.sh(["ip", "addr", "add", f"{s.outer6}/64", "dev", s.veth, "nodad"])
            s.sh(["ip", "link", "set", s.veth, "up"])

    def close(self):
        for p in self.procs:
            stop_process(p)
        for ns in self.made_ns:
            _kill_ns_pids(ns)  # daemons that forked away (wg-quick) live only in our ns
            run(["ip", "netns", "del", ns], check=False)
        for s in (self.a, self.b):
            if s is not None:
                for suffix in (".sock", ".name"):
                    path = os.path.join(UAPI_DIR, s.ifname + suffix)
                    if os.path.exists(path):
                        os.unlink(path)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.made_ns = []
        self.procs = []

    # -- daemons ---------------------------------------------------------------------
    def start(self, side, impl, extra_args=()):
        """Start `impl` for `side` in the foreground and wait (bounded) until its UAPI socket
        answers and the TUN interface exists."""
        side.impl = impl
        try:
            self.start_once(side, impl, extra_args)
        except LabError as e:
            # Debian's wireguard-go (v0.0.20220316) once exited at start in a CI run with
            # "Failed to listen on uapi socket: no such file or directory" (its socket file
            # gone before its UAPI listener watched it; the cause was not found, the same
            # lab passed in every other run): a stock implementation gets one more try.
            # riceguard gets none: its start failing is what the labs are for.
            if impl == "riceguard" or "at start" not in str(e):
                raise
            log(f"  ({impl} failed at start, once more: {e})")
            self.start_once(side, impl, extra_args)

    def start_once(self, side, impl, extra_args=()):
        argv = impl_argv(impl, side.ifname, extra_args)
        env = dict(os.environ)
        env.setdefault("WG_PROCESS_FOREGROUND", "1")
        if impl == "boringtun":
            env["WG_LOG_FILE"] = os.path.join(self.logdir, f"{side.ifname}.boringtun.log")
        logpath = os.path.join(self.logdir, f"{side.ifname}.{impl}.log")
        logf = open(logpath, "wb")
        proc = subprocess.Popen(["ip", "netns", "exec", side.ns] + argv, stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        logf.close()
        self.procs.append(proc)
        side.pid = proc.pid  # `ip netns exec` execs the daemon: same PID
        self.wait_ready(side, logpath, proc)

    def wait_ready(self, side, logpath, proc=None, timeout=10):
        sock = os.path.join(UAPI_DIR, side.ifname + ".sock")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise LabError(f"{side.impl} exited {proc.returncode} at start: "
                               f"{tail(logpath)}")
            if os.path.exists(sock) and side.sh(["wg", "show", side.ifname], check=False,
                                                 timeout=5).returncode == 0:
                return
            time.sleep(0.1)
        raise LabError(f"{side.impl}: no UAPI socket {sock} after {timeout}s: {tail(logpath)}")


def stop_process(proc, grace=3):
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def write_secret(path, text):
    """Write a key or a config holding one, readable by root only (as wg-quick wants)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)


def tail(path, n=600):
    try:
        with open(path, "rb") as f:
            data = f.read()[-n:]
        return data.decode(errors="replace").strip() or "(no output)"
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------
# Configuration, as a user would do it.

def configure_pair(lab, client, server):
    """`client` gets an endpoint for `server` (via `wg set`); `server` learns the client's
    endpoint from its handshake (configured with `wg setconf` from a file)."""
    configure_server(server, client)
    client.sh(["wg", "set", client.ifname, "private-key", client.keyfile,
               "listen-port", str(client.port), "peer", server.public_key,
               "endpoint", f"{server.outer4}:{server.port}",
               "allowed-ips", f"{server.inner4}/32,{server.inner6}/128"])
    address_tunnel(client)


def configure_server(server, client):
    """`wg setconf` for `server` with `client` as its one peer (no endpoint), then its
    tunnel addresses."""
    conf = os.path.join(server.lab.workdir, f"{server.ifname}.conf")
    write_secret(conf, f"[Interface]\nPrivateKey = {server.private_key}\n"
                       f"ListenPort = {server.port}\n\n"
                       f"[Peer]\nPublicKey = {client.public_key}\n"
                       f"AllowedIPs = {client.inner4}/32, {client.inner6}/128\n")
    server.sh(["wg", "setconf", server.ifname, conf])
    address_tunnel(server)


def address_tunnel(side):
    side.sh(["ip", "addr", "add", f"{side.inner4}/24", "dev", side.ifname])
    side.sh(["ip", "addr", "add", f"{side.inner6}/64", "dev", side.ifname, "nodad"])
    side.sh(["ip", "link", "set", side.ifname, "mtu", str(TUNNEL_MTU), "up"])


def wg_quick_conf(lab, client, server):
    """A wg-quick file for `client` (named after its interface, as wg-quick wants)."""
    path = os.path.join(lab.workdir, f"{client.ifname}.conf")
    write_secret(path, f"[Interface]\nPrivateKey = {client.private_key}\n"
                       f"ListenPort = {client.port}\n"
                       f"Address = {client.inner4}/24, {client.inner6}/64\nMTU = {TUNNEL_MTU}\n\n"
                       f"[Peer]\nPublicKey = {server.public_key}\n"
                       f"Endpoint = {server.outer4}:{server.port}\n"
                       f"AllowedIPs = {server.inner4}/32, {server.inner6}/128\n")
    return path


def wg_quick_up(lab, side, impl, conf):
    """`wg-quick up CONF` inside side's namespace with the userspace implementation `impl`
    (wg-quick falls back to it because this kernel has no WireGuard module). Its output goes
    to a file, not a pipe, so a daemon that keeps wg-quick's stdout cannot hang us; returns
    the problems with how the daemon detached (empty when none)."""
    path = impl_path(impl)
    if path is None:
        raise LabError(f"{impl} is not available")
    side.impl = impl
    env = dict(os.environ, WG_QUICK_USERSPACE_IMPLEMENTATION=path)
    env.pop("WG_PROCESS_FOREGROUND", None)
    logpath = os.path.join(lab.logdir, f"{side.ifname}.wg-quick.log")
    with open(logpath, "wb") as logf:
        try:
            rc = subprocess.run(["ip", "netns", "exec", side.ns, "wg-quick", "up", conf],
                                stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, timeout=30).returncode
        except subprocess.TimeoutExpired as e:
            raise LabError(f"wg-quick up did not return within 30 s: {tail(logpath)}") from e
    if rc != 0:
        raise LabError(f"wg-quick up exited {rc}: {tail(logpath)}")
    pids = [int(p) for p in run(["ip", "netns", "pids", side.ns]).stdout.split()]
    side.pid = pids[0] if len(pids) == 1 else None
    lab.wait_ready(side, logpath)
    problems = []
    if side.pid is None:
        problems.append(f"expected one daemon in the namespace, found pids {pids}")
    else:
        for fd in (0, 1, 2):
            try:
                target = os.readlink(f"/proc/{side.pid}/fd/{fd}")
            except OSError:
                continue
            if target == logpath:
                problems.append(f"daemon {side.pid} kept wg-quick's fd {fd} open (a caller "
                                f"reading wg-quick's output through a pipe never sees EOF): "
                                f"point stdin/stdout/stderr at /dev/null when daemonizing")
    return problems


def wg_quick_down(side, conf):
    return side.sh(["wg-quick", "down", conf], timeout=30, check=False)


# ---------------------------------------------------------------------------------------
# Measurements.

def wg_dump(side):
    """Parse `wg show IF dump`: list of peers as dicts (endpoint, handshake, rx, tx)."""
    cp = side.sh(["wg", "show", side.ifname, "dump"], timeout=5)
    peers = []
    for line in cp.stdout.splitlines()[1:]:
        f = line.split("\t")
        if len(f) < 8:
            continue
        peers.append({"public_key": f[0], "endpoint": f[2], "allowed_ips": f[3],
                      "latest_handshake": int(f[4]), "rx": int(f[5]), "tx": int(f[6])})
    return peers


PING_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")
RTT_RE = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")


def ping(side, dst, count=10, interval=0.2, wait=1):
    """Ping `dst` from `side`; returns dict(sent, received, loss_pct, rtt_avg_ms). A reply
    counts as received if it comes within the deadline (-w: the sending time plus `wait`
    plus 3 s), not only within ping's default linger after the last request (two round
    trips): on a loaded host a daemon descheduled for a few hundred milliseconds answered
    the last requests of a run after ping had left, and they counted as lost."""
    deadline = math.ceil(count * interval + wait + 3)
    timeout = deadline + 10
    cp = side.sh(["ping", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", str(wait),
                  "-w", str(deadline), dst], timeout=timeout, check=False)
    res = parse_ping(cp.stdout)
    if res is None:
        raise LabError(f"ping {dst}: no summary: {(cp.stderr or cp.stdout).strip()[-200:]}")
    return res


def parse_ping(text):
    m = PING_RE.search(text or "")
    if not m:
        return None
    sent, recv = int(m.group(1)), int(m.group(2))
    r = RTT_RE.search(text)
    return {"sent": sent, "received": recv,
            "loss_pct": 100.0 * (sent - recv) / sent if sent else 100.0,
            "rtt_avg_ms": float(r.group(2)) if r else None}


def ping_start(lab, side, dst, count, interval):
    """Start a ping in the background (stopped by the lab at the latest)."""
    proc = subprocess.Popen(["ip", "netns", "exec", side.ns, "ping", "-n", "-q", "-c",
                             str(count), "-i", str(interval), "-W", "1", dst],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    lab.procs.append(proc)
    return proc


def ping_finish(proc, timeout):
    """Wait (bounded) for a ping_start() ping; its parsed summary or None."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        return None
    return parse_ping(out)


def wait_reply(side, dst, attempts=10):
    """Ping once per second until the first reply (bounded): the first packet through a
    fresh tunnel waits for the handshake. Returns seconds taken or None."""
    t0 = time.monotonic()
    for _ in range(attempts):
        if ping(side, dst, count=1, wait=1)["received"]:
            return time.monotonic() - t0
    return None


def iperf3_server(lab, side, bind, port=5201, prefix=()):
    """Start a one-shot iperf3 server in `side` (its command after `prefix`, e.g. a
    taskset); returns its Popen once it listens."""
    proc = subprocess.Popen(["ip", "netns", "exec", side.ns] + list(prefix) +
                            ["iperf3", "-s", "-1", "-B", bind,
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    lab.procs.append(proc)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        cp = side.sh(["ss", "-Hltn", f"sport = :{port}"], check=False, timeout=5)
        if cp.stdout.strip():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise LabError("iperf3 server did not start listening")


def iperf3(lab, client, server, dst, seconds=5, args=(), port=5201,
           client_prefix=(), server_prefix=()):
    """Run iperf3 from `client` to `dst` (in `server`), each end's command after its
    prefix (e.g. a taskset); returns the parsed --json result."""
    srv = iperf3_server(lab, server, dst, port, server_prefix)
    try:
        cp = client.sh(list(client_prefix) + ["iperf3", "-c", dst, "-p", str(port), "-t", str(seconds), "--json",
                        "--connect-timeout", "3000"] + list(args),
                       timeout=seconds + 20, check=False)
    finally:
        stop_process(srv, grace=2)
    try:
        res = json.loads(cp.stdout)
    except ValueError as e:
        raise LabError(f"iperf3: no JSON result: {cp.stderr.strip()[-300:]}") from e
    if "error" in res:
        raise LabError(f"iperf3: {res['error']}")
    return res


def tcp_mbps(res):
    return res["end"]["sum_received"]["bits_per_second"] / 1e6


def cpu_seconds(pid):
    """utime+stime of process `pid` (all its threads), in seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14,15 of stat(5)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def install_signal_handlers():
    """Turn SIGTERM/SIGHUP into SystemExit so `with Lab(...)` cleanup always runs."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def start_capture(lab, side, pcap, bpf, count=5000, name="tcpdump"):
    """tcpdump on `side`'s veth into `pcap` (at most `count` packets), owned by the lab;
    returns once it listens (5 s at most) or raises LabError."""
    err = os.path.join(lab.workdir, f"{name}.err")
    with open(err, "wb") as ef:
        cap = subprocess.Popen(
            ["ip", "netns", "exec", side.ns, "tcpdump", "-i", side.veth, "-n", "-U",
             "-c", str(count), "-w", pcap, bpf],
            stdout=subprocess.DEVNULL, stderr=ef, stdin=subprocess.DEVNULL,
            start_new_session=True)
    lab.procs.append(cap)
    deadline = time.monotonic() + 5
    while b"listening on" not in open(err, "rb").read():
        if cap.poll() is not None or time.monotonic() > deadline:
            raise LabError(f"tcpdump did not start: {tail(err)}")
        time.sleep(0.05)
    return cap


class CheckLab:
    """A lab script's frame: root, signal handlers, riceguard and wireguard-go present,
    a log directory out/NAME/STAMP, stale namespaces swept; `check(name, ok, detail)`
    prints PASS/FAIL as it goes and `finish()` prints the "N passed, N failed" line and
    exits 1 on a failure."""

    def __init__(self, name):
        require_root()
        install_signal_handlers()
        if impl_path("riceguard") is None or impl_path("wireguard-go") is None:
            log("needs target/release/riceguard ($RG_BIN) and wireguard-go")
            sys.exit(2)
        self.name = name
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.logdir = os.path.join(REPO, "out", name, stamp)
        os.makedirs(self.logdir, exist_ok=True)
        sweep_stale()
        self.results = []
        self.t_start = time.monotonic()

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok), detail))
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""),
              flush=True)

    def finish(self, what="logs"):
        passed = sum(1 for c in self.results if c[1])
        failed = len(self.results) - passed
        print(f"\n{self.name}: {time.monotonic() - self.t_start:.0f} s; {what} in {self.logdir}")
        print(f"{passed} passed, {failed} failed")
        sys.exit(1 if failed else 0)


def require_root():
    if os.geteuid() != 0:
        log("needs root (network namespaces, TUN devices)")
        sys.exit(2)
