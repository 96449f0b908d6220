"""Adversarial UDP tests against riceguard (ci/adversarial.sh): an attacker who knows only
the gateway's public key must not move, break or slow down a legitimate peer.

Three namespaces (all created and removed here):

    peer (wireguard-go) --veth va/vb 10.203.0.0/24-- gateway (riceguard -f)
                                                        | veth vx/vy 10.206.0.0/16
                                                     attacker (200 addresses 10.206.1.x)

The gateway is configured with stock `wg setconf` and learns the peer's endpoint from its
handshake (like ci/lib/wgnet.py's configure_pair); the peer pings the gateway's tunnel
address all the time (ping -i 0.2, bounded). The attacker runs ci/lib/forge.py in its own
namespace, sending to the gateway's address 10.203.0.1 through the gateway namespace.

Attacks, each bounded in count and time:
  1 forged handshake responses (valid mac1) over guessed receiver indexes
  2 forged cookie replies over the same guessed indexes
  3 handshake-initiation flood (valid mac1) from 200 addresses, during which the peer is
    made to handshake again (the gateway must answer with cookies, wireguard-go retries
    with mac2 and must succeed)
  4 the peer's captured packets (its first handshake initiation and data) replayed from
    the attacker's addresses

After each: the peer's endpoint (`wg show IF endpoints` and a 20 Hz UAPI sampler during
the attack) unchanged, nothing but cookie replies reached the attacker, the session intact
(latest handshake unchanged; for 3: a new one completed), legitimate ping loss <= 5 %,
daemon RSS growth bounded; the daemon's drop counters (SIGUSR1 -> its log) reported.

Ends with "N passed, N failed"; exit status 1 when anything failed. Environment:
RG_BIN (riceguard binary), ADV_RATE (forged messages per second, default 4000),
ADV_LOSS_PCT (default 5), ADV_RSS_MIB (allowed RSS growth, default 16),
ADV_TIMEOUT (whole run, default 230 s). Logs: out/adversarial/<UTC time>/.
"""

import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forge  # noqa: E402
import wgnet  # noqa: E402
from wgnet import LabError, log, run  # noqa: E402

FORGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forge.py")
LAB_INDEX = 6
ATTACK_NET = "10.206"
GW_ATTACK_ADDR = f"{ATTACK_NET}.0.1"
N_SOURCES = 200

RATE = float(os.environ.get("ADV_RATE", "4000"))
LOSS_PCT = float(os.environ.get("ADV_LOSS_PCT", "5"))
RSS_MIB = float(os.environ.get("ADV_RSS_MIB", "16"))
TIMEOUT = int(os.environ.get("ADV_TIMEOUT", "230"))
PING_INTERVAL = 0.2
FLOOD_PING_SECS = 5.0  # attack 3: the steady ping covers the flood before the re-handshake


# ---------------------------------------------------------------------------------------
# Results.

class Results:
    def __init__(self):
        self.checks = []  # (attack, name, ok, detail)

    def check(self, attack, name, ok, detail=""):
        self.checks.append((attack, name, bool(ok), detail))
        log(f"  [{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))
        return ok

    @property
    def passed(self):
        return sum(1 for c in self.checks if c[2])

    @property
    def failed(self):
        return sum(1 for c in self.checks if not c[2])


# ---------------------------------------------------------------------------------------
# Observing the gateway.

def uapi_get(ifname, timeout=2.0):
    """The UAPI `get` of interface `ifname` as a list of peer dicts (hex public key,
    endpoint, last handshake seconds, rx/tx bytes). The socket lives in the shared
    /var/run/wireguard, so this works from any namespace."""
    path = os.path.join(wgnet.UAPI_DIR, ifname + ".sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(b"get=1\n\n")
        buf = b""
        while not buf.endswith(b"\n\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    peers, cur = [], None
    for line in buf.decode(errors="replace").splitlines():
        k, _, v = line.partition("=")
        if k == "public_key":
            cur = {"public_key": v, "endpoint": None, "hs": 0, "rx": 0, "tx": 0}
            peers.append(cur)
        elif cur is not None and k == "endpoint":
            cur["endpoint"] = v
        elif cur is not None and k == "last_handshake_time_sec":
            cur["hs"] = int(v)
        elif cur is not None and k == "rx_bytes":
            cur["rx"] = int(v)
        elif cur is not None and k == "tx_bytes":
            cur["tx"] = int(v)
    return peers


def key_hex(b64):
    import base64
    return base64.b64decode(b64).hex()


class EndpointSampler(threading.Thread):
    """Samples the legitimate peer's endpoint and handshake on the gateway ~20 times a
    second until stopped (bounded by `max_s`)."""

    def __init__(self, ifname, peer_hex, max_s):
        super().__init__(daemon=True)
        self.ifname, self.peer_hex, self.max_s = ifname, peer_hex, max_s
        self.samples = 0
        self.errors = 0
        self.endpoints = {}
        self.handshakes = set()
        self._halt = threading.Event()

    def run(self):
        end = time.monotonic() + self.max_s
        while not self._halt.is_set() and time.monotonic() < end:
            try:
                for p in uapi_get(self.ifname):
                    if p["public_key"] == self.peer_hex:
                        ep = p["endpoint"] or "(none)"
                        self.endpoints[ep] = self.endpoints.get(ep, 0) + 1
                        self.handshakes.add(p["hs"])
                self.samples += 1
            except OSError:
                self.errors += 1
            self._halt.wait(0.05)

    def stop(self):
        self._halt.set()
        self.join(timeout=5)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


DROP_RE = re.compile(r"drops (\w+): (\d+)")


def read_drops(pid, logpath, timeout=3.0):
    """SIGUSR1 makes the daemon log its drop counters; returns {cause: count} from the
    lines it appended to its log, or {} if none came."""
    start = os.path.getsize(logpath)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    last, stable = None, 0
    while time.monotonic() < deadline:
        time.sleep(0.1)
        with open(logpath, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        found = dict((k, int(v)) for k, v in DROP_RE.findall(text))
        if found and found == last:
            stable += 1
            if stable >= 2:
                return found
        else:
            stable = 0
        last = found
    return last or {}


def log_since(logpath, offset):
    with open(logpath, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


# ---------------------------------------------------------------------------------------
# The lab.

class Adversarial:
    def __init__(self, lab, logdir, res):
        self.lab, self.logdir, self.res = lab, logdir, res
        self.gw, self.peer = lab.a, lab.b
        self.att_ns = f"{wgnet.NS_PREFIX}{os.getpid()}-{LAB_INDEX}x"
        self.sources = [f"{ATTACK_NET}.{1 + i // 250}.{1 + i % 250}" for i in range(N_SOURCES)]
        self.gw_log = os.path.join(logdir, f"{self.gw.ifname}.riceguard.log")
        self.pcap = os.path.join(lab.workdir, "peer.pcap")
        self.summary = []

    # -- setup -------------------------------------------------------------------------
    def setup(self):
        lab, gw, peer = self.lab, self.gw, self.peer
        run(["ip", "netns", "add", self.att_ns])
        lab.made_ns.append(self.att_ns)
        run(["ip", "-n", self.att_ns, "link", "set", "lo", "up"])
        run(["ip", "link", "add", "vx", "netns", gw.ns, "type", "veth",
             "peer", "name", "vy", "netns", self.att_ns])
        gw.sh(["ip", "addr", "add", f"{GW_ATTACK_ADDR}/16", "dev", "vx"])
        gw.sh(["ip", "link", "set", "vx", "up"])
        batch = os.path.join(lab.workdir, "attacker.ip")
        with open(batch, "w") as f:
            for a in self.sources:
                f.write(f"addr add {a}/16 dev vy\n")
            f.write("link set vy up\n")
            f.write(f"route add default via {GW_ATTACK_ADDR}\n")
        run(["ip", "-n", self.att_ns, "-batch", batch])

        os.environ["RG_LOG_FILE"] = self.gw_log  # only used when daemonized; -f logs to stderr
        lab.start(gw, "riceguard")
        self.gw_proc = lab.procs[-1]
        lab.start(peer, "wireguard-go")
        self.gw_pid = gw.pid
        self.peer_hex = key_hex(peer.public_key)

        # Capture the peer's packets to the gateway from the very first handshake (the
        # replay attack sends them again).
        tcpdump_err = os.path.join(lab.workdir, "tcpdump.err")
        with open(tcpdump_err, "wb") as errf:
            cap = subprocess.Popen(
                ["ip", "netns", "exec", gw.ns, "tcpdump", "-i", "va", "-n", "-U", "-c", "400",
                 "-w", self.pcap, f"udp and src host {peer.outer4} and dst port {gw.port}"],
                stdout=subprocess.DEVNULL, stderr=errf, stdin=subprocess.DEVNULL,
                start_new_session=True)
        lab.procs.append(cap)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b"listening on" not in open(tcpdump_err, "rb").read():
            if cap.poll() is not None:
                raise LabError(f"tcpdump exited: {wgnet.tail(tcpdump_err)}")
            time.sleep(0.05)

        wgnet.configure_pair(lab, peer, gw)  # peer has the endpoint; gateway learns it
        if wgnet.wait_reply(peer, gw.inner4) is None:
            raise LabError("no tunnel between wireguard-go and riceguard before any attack")
        wgnet.ping(peer, gw.inner4, count=10, interval=0.1)
        time.sleep(0.3)
        wgnet.stop_process(cap)

        st = self.peer_state()
        self.legit_ep = st["endpoint"]
        want = f"{peer.outer4}:{peer.port}"
        if self.legit_ep != want:
            raise LabError(f"gateway has endpoint {self.legit_ep} for the peer, expected {want}")
        log(f"gateway {gw.ifname} (riceguard pid {self.gw_pid}), peer {peer.ifname} "
            f"(wireguard-go) at {self.legit_ep}; attacker {self.att_ns} with "
            f"{len(self.sources)} addresses; log {self.gw_log}")

    def peer_state(self):
        for p in uapi_get(self.gw.ifname):
            if p["public_key"] == self.peer_hex:
                return p
        raise LabError("the peer vanished from the gateway's configuration")

    def wg_show_endpoint(self):
        cp = self.gw.sh(["wg", "show", self.gw.ifname, "endpoints"], timeout=5)
        for line in cp.stdout.splitlines():
            f = line.split("\t")
            if len(f) == 2 and f[0] == self.peer.public_key:
                return f[1]
        return None

    # -- one attack ----------------------------------------------------------------------
    def forge_argv(self, kind, count, rate, deadline, sources, extra=()):
        return ["ip", "netns", "exec", self.att_ns, sys.executable, FORGE, kind,
                "--gateway-public", self.gw.public_key,
                "--target", f"{self.gw.outer4}:{self.gw.port}",
                "--sources", ",".join(sources), "--count", str(count), "--rate", str(rate),
                "--deadline", str(deadline)] + list(extra)

    def snapshot(self):
        if self.gw_proc.poll() is not None:
            raise LabError(f"riceguard exited {self.gw_proc.returncode}: "
                           f"{wgnet.tail(self.gw_log)}")
        return {"rss": rss_kib(self.gw_pid), "cpu": wgnet.cpu_seconds(self.gw_pid),
                "drops": read_drops(self.gw_pid, self.gw_log), "peer": self.peer_state(),
                "log_off": os.path.getsize(self.gw_log), "t": time.monotonic(),
                "wall": time.time()}

    def attack(self, num, title, argv, expect_secs, during=None, new_handshake=False,
               ping_secs=None):
        """Run one attack: the forge process `argv` in the attacker namespace, the peer's
        ping and the endpoint sampler alongside; `during(proc)` (optional) runs while the
        forge process is alive. Then all the checks, and a summary block."""
        log(f"\n=== attack {num}: {title}")
        name = f"attack {num}"
        self.restore_endpoint()
        before = self.snapshot()
        sampler = EndpointSampler(self.gw.ifname, self.peer_hex, expect_secs * 3 + 30)
        sampler.start()
        ping_secs = expect_secs + 1.5 if ping_secs is None else ping_secs
        ping_count = max(10, math.ceil(ping_secs / PING_INTERVAL))
        # Legitimate traffic both ways: the peer's pings (answered by the gateway) and the
        # gateway side's own pings to the peer (sent to wherever the gateway thinks the
        # peer is: a moved endpoint loses them).
        pinger = wgnet.ping_start(self.lab, self.peer, self.gw.inner4, ping_count, PING_INTERVAL)
        time.sleep(PING_INTERVAL / 2)  # out of phase with the peer's pings
        pinger_gw = wgnet.ping_start(self.lab, self.gw, self.peer.inner4, ping_count,
                                     PING_INTERVAL)
        forge_out = os.path.join(self.lab.workdir, f"forge{num}.out")
        forge_err = os.path.join(self.logdir, f"forge{num}.err")
        with open(forge_out, "wb") as fo, open(forge_err, "wb") as fe:
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.lab.procs.append(proc)
        during_result = during(proc) if during else None
        try:
            proc.wait(timeout=expect_secs * 3 + 30)
        except subprocess.TimeoutExpired:
            wgnet.stop_process(proc)
        ping_res = wgnet.ping_finish(pinger, timeout=ping_count * PING_INTERVAL + 15)
        ping_gw = wgnet.ping_finish(pinger_gw, timeout=ping_count * PING_INTERVAL + 15)
        time.sleep(0.5)  # let the last replies and the peer's next packet land
        sampler.stop()
        after = self.snapshot()
        try:
            report = json.loads(open(forge_out).read().strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = None
        ep_after = self.wg_show_endpoint()
        newlog = log_since(self.gw_log, before["log_off"])
        moved_lines = [l for l in newlog.splitlines() if moved_to_attacker(l)]

        # -- checks --
        r = self.res
        r.check(name, "riceguard still running, no panic in its log",
                self.gw_proc.poll() is None and "panicked" not in newlog,
                "" if self.gw_proc.poll() is None else f"exited {self.gw_proc.returncode}")
        r.check(name, "attacker sent its messages", report is not None and report["sent"] > 0,
                "" if report else f"forge produced no report: {wgnet.tail(forge_err)}")
        rep = report or {"sent": 0, "seconds": 0, "rate": 0, "received": {},
                         "received_from": {}}
        recv = rep.get("received", {})
        cookies = recv.get("3", 0)
        non_cookie = sum(v for k, v in recv.items() if k != "3")
        r.check(name, f"endpoint unchanged (wg show {self.gw.ifname} endpoints)",
                ep_after == self.legit_ep, f"{self.legit_ep} -> {ep_after}")
        others = {e: n for e, n in sampler.endpoints.items() if e != self.legit_ep}
        r.check(name, "endpoint never moved while sampled", sampler.samples > 0 and not others,
                f"{sampler.samples} samples" + (f", saw {others}" if others else ""))
        r.check(name, "gateway sent the attacker nothing but cookie replies", non_cookie == 0,
                f"cookie replies {cookies}, other messages {non_cookie} {recv}")
        r.check(name, "no 'endpoint' log line naming an attacker address", not moved_lines,
                f"{len(moved_lines)} lines, first: {moved_lines[0].strip()}" if moved_lines else "")
        if new_handshake:
            pass  # attack 3 checks its own handshake
        else:
            r.check(name, "session intact (latest handshake unchanged, still recent)",
                    after["peer"]["hs"] == before["peer"]["hs"] and before["peer"]["hs"] > 0
                    and time.time() - after["peer"]["hs"] < 180,
                    f"handshake {before['peer']['hs']} -> {after['peer']['hs']}")
        for label, pr in (("peer -> gateway", ping_res), ("gateway -> peer", ping_gw)):
            what = f"legitimate ping {label} loss <= {LOSS_PCT:g} %"
            if pr is None:
                r.check(name, what, False, "ping gave no summary")
            else:
                r.check(name, what, pr["loss_pct"] <= LOSS_PCT,
                        f"{pr['sent']} sent, {pr['received']} received, "
                        f"{pr['loss_pct']:.1f} % loss")
        grow = None
        if before["rss"] is not None and after["rss"] is not None:
            grow = (after["rss"] - before["rss"]) / 1024
        r.check(name, f"daemon RSS growth <= {RSS_MIB:g} MiB",
                grow is not None and grow <= RSS_MIB,
                f"{before['rss']} KiB -> {after['rss']} KiB")

        drops = {k: after["drops"].get(k, 0) - before["drops"].get(k, 0)
                 for k in after["drops"]}
        cpu = None
        if before["cpu"] is not None and after["cpu"] is not None:
            cpu = after["cpu"] - before["cpu"]
        wall = after["t"] - before["t"]
        block = {
            "num": num, "title": title, "sent": rep["sent"], "secs": rep["seconds"],
            "rate": rep["rate"], "sources": rep.get("sources"), "cookies": cookies,
            "non_cookie": non_cookie, "drops": drops, "rss": (before["rss"], after["rss"]),
            "ping": ping_res, "ping_gw": ping_gw, "cpu": cpu, "wall": wall, "report": rep,
            "samples": sampler.samples, "endpoints_seen": sampler.endpoints,
            "moved_lines": len(moved_lines), "during": during_result,
        }
        self.summary.append(block)
        self.print_block(block)
        return block

    def print_block(self, b):
        p = b["ping"] or {}
        g = b["ping_gw"] or {}
        nz = ", ".join(f"{k} +{v}" for k, v in b["drops"].items() if v) or "(no change)"
        lines = [
            f"--- attack {b['num']}: {b['title']}",
            f"  sent     {b['sent']} messages in {b['secs']} s (~{b['rate']}/s) "
            f"from {b['sources']} source addresses",
            f"  attacker received: cookie replies {b['cookies']}, other messages {b['non_cookie']}",
            f"  gateway drop counters (delta): {nz}",
            f"  endpoint samples {b['samples']}: {b['endpoints_seen']}",
            f"  RSS      {b['rss'][0]} KiB -> {b['rss'][1]} KiB",
            f"  CPU      {b['cpu']:.2f} s of daemon CPU over {b['wall']:.1f} s"
            if b["cpu"] is not None else "  CPU      (unknown)",
            f"  ping     peer -> gateway: {p.get('sent')} sent, {p.get('received')} received, "
            f"{p.get('loss_pct', 100):.1f} % loss",
            f"  ping     gateway -> peer: {g.get('sent')} sent, {g.get('received')} received, "
            f"{g.get('loss_pct', 100):.1f} % loss",
        ]
        extra = {k: v for k, v in b["report"].items()
                 if k in ("captured", "cookies_opened", "cookies_bad", "cookie_for_unknown",
                          "mac2_sent", "mac2_cookied", "send_errors")}
        if extra:
            lines.append(f"  forge    {extra}")
        if b["during"]:
            lines.append(f"  during   {b['during']}")
        print("\n".join(lines), flush=True)

    # -- the attacks ---------------------------------------------------------------------
    def run_all(self):
        n_guess = forge.guessed_total()

        # 1: forged responses
        self.attack(1, "forged handshake responses (valid mac1) over guessed receiver indexes",
                    self.forge_argv("response", n_guess, RATE, n_guess / RATE * 2 + 10,
                                    self.sources),
                    n_guess / RATE + 1)

        # 2: forged cookie replies
        self.attack(2, "forged cookie replies over guessed receiver indexes",
                    self.forge_argv("cookie", n_guess, RATE, n_guess / RATE * 2 + 10,
                                    self.sources),
                    n_guess / RATE + 1)

        # 1b, 2b: the same at the receiver index the gateway really uses for the peer,
        # read off the captured traffic (an attacker who can watch the wire but not
        # change it): the index is no secret, only the keys authenticate.
        idx = self.captured_receiver_indexes()
        n_known = 4000
        if not idx:
            self.res.check("attack 1b/2b", "captured data shows the gateway's receiver index",
                           False, "no data message in the capture")
        else:
            known = ",".join(f"{i:#010x}" for i in idx)
            self.attack("1b", f"forged handshake responses (valid mac1, mac2 once a cookie "
                              f"is held) at the peer's real receiver index {known}",
                        self.forge_argv("response", n_known, 2000, n_known / 2000 * 2 + 10,
                                        self.sources[:50], ["--indexes", known]),
                        n_known / 2000 + 1)
            self.attack("2b", f"forged cookie replies at the peer's real receiver index {known}",
                        self.forge_argv("cookie", n_known, 2000, n_known / 2000 * 2 + 10,
                                        self.sources[:50], ["--indexes", known]),
                        n_known / 2000 + 1)

        # 3: initiation flood; the peer handshakes again in the middle of it
        flood_rate, flood_max = 2000, 60000
        self.attack(3, f"handshake-initiation flood (valid mac1) from {N_SOURCES} addresses, "
                       f"peer re-handshakes during it",
                    self.forge_argv("init", flood_max, flood_rate, flood_max / flood_rate + 5,
                                    self.sources, ["--linger", "1.5"]),
                    flood_max / flood_rate, during=self.rehandshake_under_flood,
                    new_handshake=True, ping_secs=FLOOD_PING_SECS)
        b = self.summary[-1]
        rep = b["report"]
        self.res.check("attack 3", "cookie replies reached the attackers", b["cookies"] > 0,
                       f"{b['cookies']} cookie replies for {b['sent']} initiations")
        self.res.check("attack 3", "cookie replies are genuine (opened with the gateway's "
                       "key, bound to our mac1)",
                       rep.get("cookies_opened", 0) > 0 and rep.get("cookies_bad", 1) == 0,
                       f"opened {rep.get('cookies_opened')}, bad {rep.get('cookies_bad')}, "
                       f"for unknown index {rep.get('cookie_for_unknown')}")
        self.res.check("attack 3", "initiations with a valid mac2 pass the rate limiter "
                       "(most get no cookie back)",
                       rep.get("mac2_sent", 0) > 0
                       and rep.get("mac2_cookied", 0) * 2 <= rep.get("mac2_sent", 0),
                       f"mac2 sent {rep.get('mac2_sent')}, cookied {rep.get('mac2_cookied')}")
        d = b["during"] or {}
        self.res.check("attack 3", "the peer's new handshakes completed while the flood ran",
                       d.get("attempts") and d.get("all_completed_under_flood"),
                       f"{d.get('attempts')}")
        self.res.check("attack 3", "one of them went through a cookie reply to the peer "
                       "(its retry carried mac2)", d.get("cookie_path_completed"),
                       f"cookie replies to the peer per attempt: "
                       f"{[a['cookies_to_peer'] for a in d.get('attempts', [])]}")
        cpu_frac = b["cpu"] / b["wall"] if b["cpu"] is not None and b["wall"] else None
        self.res.check("attack 3", "daemon CPU bounded (< 1 core on average during the flood)",
                       cpu_frac is not None and cpu_frac < 1.0,
                       f"{b['cpu']:.2f} s CPU over {b['wall']:.1f} s" if cpu_frac is not None
                       else "unknown")
        self.res.check("attack 3", "endpoint after the new handshake is the peer's",
                       self.wg_show_endpoint() == self.legit_ep, self.wg_show_endpoint())
        pr = wgnet.ping(self.peer, self.gw.inner4, count=10, interval=0.1)
        self.res.check("attack 3", "tunnel passes traffic on the new session",
                       pr["received"] >= 9, f"{pr['received']}/{pr['sent']} replies")

        # 4: replay of the peer's captured packets
        n_replay = 6000
        self.attack(4, "replayed captured packets of the peer (handshake initiation + data) "
                       "from attacker addresses",
                    self.forge_argv("replay", n_replay, min(RATE, 2000),
                                    n_replay / min(RATE, 2000) * 2 + 10, self.sources[:20],
                                    ["--pcap", self.pcap]),
                    n_replay / min(RATE, 2000) + 1)

    def restore_endpoint(self):
        """Each attack starts with the peer at its own endpoint: if an earlier attack left
        it elsewhere, the peer's next packets bring it back (bounded)."""
        for _ in range(5):
            if self.peer_state()["endpoint"] == self.legit_ep:
                return
            log(f"  (endpoint is {self.peer_state()['endpoint']} after the previous attack; "
                f"the peer pings to bring it back)")
            wgnet.ping(self.peer, self.gw.inner4, count=2, interval=0.2)
        log("  endpoint could not be restored")

    def captured_receiver_indexes(self):
        """Receiver indexes of the peer's data messages to the gateway in the capture."""
        seen = []
        for d in forge.read_pcap_udp(self.pcap):
            p = d["payload"]
            if forge.msg_type(p) == forge.MSG_DATA and len(p) >= 32:
                i = int.from_bytes(p[4:8], "little")
                if i not in seen:
                    seen.append(i)
        return seen

    def rehandshake_under_flood(self, flood):
        """While the flood runs: make wireguard-go forget the gateway (remove and re-add
        the peer: no session, no cookie), so its next ping starts a new handshake. An
        initiation that meets the gateway under load gets a cookie reply and wireguard-go's
        retry (REKEY_TIMEOUT, 5 s, later) carries mac2 and must complete; one that lands
        in the limiter's free budget completes at once. Up to 3 attempts, until one took
        the cookie path (the peer's side is captured to see the cookie reply). Stops the
        flood 1 s after the last handshake."""
        peer, gw = self.peer, self.gw
        time.sleep(FLOOD_PING_SECS + 0.5)  # the flood alone, with the steady ping
        attempts = []
        for k in range(3):
            a = self.one_rehandshake(flood, k)
            attempts.append(a)
            log(f"  re-handshake {k + 1}: {a}")
            if not a["gateway_handshake"] or a["cookies_to_peer"] > 0:
                break
            time.sleep(2.0)  # whole-second handshake times: keep attempts apart
        time.sleep(1.0)
        if flood.poll() is None:
            flood.send_signal(signal.SIGTERM)  # forge stops sending and reports
        return {"attempts": attempts,
                "all_completed_under_flood": all(a["gateway_handshake"] and a["peer_handshake"]
                                                 and a["under_flood"] for a in attempts),
                "cookie_path_completed": any(a["gateway_handshake"] and a["cookies_to_peer"]
                                             for a in attempts)}

    def one_rehandshake(self, flood, k):
        peer, gw = self.peer, self.gw
        pcap = os.path.join(self.lab.workdir, f"peer-rehandshake{k}.pcap")
        err = os.path.join(self.lab.workdir, f"peer-rehandshake{k}.err")
        with open(err, "wb") as ef:
            cap = subprocess.Popen(
                ["ip", "netns", "exec", peer.ns, "tcpdump", "-i", peer.veth, "-n", "-U",
                 "-c", "500", "-w", pcap,
                 f"udp and src host {gw.outer4} and dst port {peer.port}"],
                stdout=subprocess.DEVNULL, stderr=ef, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.lab.procs.append(cap)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b"listening on" not in open(err, "rb").read():
            time.sleep(0.05)
        # Handshake times are whole seconds, and the gateway's is taken at its timer tick
        # before the handshake: a new one reads >= t_trigger - 1 (the previous handshake
        # is tens of seconds older).
        # The gateway's limiter budget is renewed about once a second at a fixed phase;
        # a random phase makes the peer's first initiation meet it under load (and get a
        # cookie) in all but ~5 % of the attempts.
        t_trigger = int(time.time()) + 1
        time.sleep(max(0.0, t_trigger + random.uniform(0.1, 0.9) - time.time()))
        peer.sh(["wg", "set", peer.ifname, "peer", gw.public_key, "remove"])
        peer.sh(["wg", "set", peer.ifname, "peer", gw.public_key,
                 "endpoint", f"{gw.outer4}:{gw.port}",
                 "allowed-ips", f"{gw.inner4}/32,{gw.inner6}/128"])
        # Traffic makes wireguard-go handshake; bounded, stopped once it completed.
        pinger = wgnet.ping_start(self.lab, peer, gw.inner4, 60, 0.25)
        t0 = time.monotonic()
        out = {"gateway_handshake": False, "peer_handshake": False, "under_flood": False,
               "seconds_to_handshake": None, "cookies_to_peer": 0}
        deadline = t0 + 16
        while time.monotonic() < deadline:
            if self.peer_state()["hs"] >= t_trigger - 1:
                out["gateway_handshake"] = True
                out["under_flood"] = flood.poll() is None
                out["seconds_to_handshake"] = round(time.monotonic() - t0, 1)
                break
            if flood.poll() is not None:
                # Flood over (count or deadline) before the handshake: wait a little more
                # to report, but it no longer counts as "under flood".
                deadline = min(deadline, time.monotonic() + 6)
            time.sleep(0.2)
        time.sleep(0.3)
        for p in uapi_get(peer.ifname):
            if p["public_key"] == key_hex(gw.public_key):
                out["peer_handshake"] = p["hs"] >= t_trigger - 1
        wgnet.stop_process(pinger)
        wgnet.stop_process(cap)
        try:
            out["cookies_to_peer"] = sum(1 for d in forge.read_pcap_udp(pcap)
                                         if forge.msg_type(d["payload"]) == forge.MSG_COOKIE)
        except (OSError, ValueError):
            out["cookies_to_peer"] = None
        return out

    # -- closing summary -----------------------------------------------------------------
    def print_table(self):
        rows = []
        for b in self.summary:
            p = b["ping"] or {}
            g = b["ping_gw"] or {}
            d = b["drops"]
            drops = ", ".join(f"{k} {v}" for k, v in d.items() if v) or "-"
            rows.append([b["num"], SHORT.get(str(b["num"]), b["title"]),
                         f"{b['sent']} @ {b['rate']}/s", b["cookies"], drops,
                         f"{b['rss'][0]} -> {b['rss'][1]}",
                         f"{p.get('loss_pct', 100):.1f} % of {p.get('sent')} / "
                         f"{g.get('loss_pct', 100):.1f} % of {g.get('sent')}",
                         f"{b['cpu']:.2f}/{b['wall']:.0f}" if b["cpu"] is not None else "?"])
        print()
        print(wgnet.md_table(["#", "attack", "sent (count @ rate)", "cookies to attacker",
                              "gateway drops (delta)", "RSS KiB",
                              "ping loss peer->gw / gw->peer",
                              "CPU s / wall s"], rows))


SHORT = {"1": "forged responses, guessed indexes",
         "2": "forged cookie replies, guessed indexes",
         "1b": "forged responses, real index (+mac2)",
         "2b": "forged cookie replies, real index",
         "3": "initiation flood + peer re-handshake",
         "4": "replay of captured init + data"}

MOVED_RE = re.compile(r"->\s*\[?" + re.escape(ATTACK_NET) + r"\.")


def moved_to_attacker(line):
    """A daemon log line saying a peer's endpoint is now an attacker's address."""
    if "endpoint" not in line:
        return False
    if "->" in line:
        return MOVED_RE.search(line) is not None
    return f"{ATTACK_NET}." in line


def main():
    wgnet.require_root()
    wgnet.install_signal_handlers()

    def on_alarm(_s, _f):
        raise SystemExit(f"adversarial: whole run exceeded {TIMEOUT} s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT)
    for tool in ("wg", "tcpdump", "ip"):
        if not shutil.which(tool):
            log(f"missing {tool}")
            sys.exit(2)
    if wgnet.impl_path("riceguard") is None or wgnet.impl_path("wireguard-go") is None:
        log("needs target/release/riceguard ($RG_BIN) and wireguard-go")
        sys.exit(2)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    logdir = os.path.join(wgnet.REPO, "out", "adversarial", stamp)
    os.makedirs(logdir, exist_ok=True)
    wgnet.sweep_stale()
    log(f"adversarial: riceguard {wgnet.riceguard_bin()}; logs in {logdir}")
    res = Results()
    t0 = time.monotonic()
    adv = None
    try:
        with wgnet.Lab(LAB_INDEX, logdir) as lab:
            adv = Adversarial(lab, logdir, res)
            adv.setup()
            adv.run_all()
            adv.print_table()
    except LabError as e:
        res.check("setup", "lab", False, str(e))
    except SystemExit as e:
        res.check("setup", "run finished", False, str(e))
    except Exception as e:  # a bug here must still end with the count line
        import traceback
        traceback.print_exc()
        res.check("setup", "run finished", False, f"{type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
    print()
    for a, n, ok, d in res.checks:
        if not ok:
            print(f"FAILED  {a}: {n}" + (f" — {d}" if d else ""))
    print(f"adversarial: {time.monotonic() - t0:.0f} s; logs in {logdir}")
    print(f"{res.passed} passed, {res.failed} failed")
    sys.exit(1 if res.failed else 0)


if __name__ == "__main__":
    main()
