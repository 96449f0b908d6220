"""Real-peer WireGuard interop matrix in network namespaces (run through ci/interop.sh).

Owns: the list of pairs, the checks run on each pair and the report. The plumbing lives in
wgnet.py. A pair "X:Y" runs implementation X as the client (it has the endpoint and is the
side that roams) and Y as the server (it learns and re-learns the client's endpoint).
"X+wgquick:Y" brings the client up with `wg-quick up` and
WG_QUICK_USERSPACE_IMPLEMENTATION=X instead of starting it directly.
"""

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgnet  # noqa: E402
from wgnet import LabError, log  # noqa: E402

DEFAULT_PAIRS = [
    "wireguard-go:wireguard-go",  # the harness's own baseline
    "boringtun:wireguard-go",     # second baseline: two independent implementations
    "riceguard:wireguard-go",
    "wireguard-go:riceguard",
    "riceguard:boringtun",
    "boringtun:riceguard",
    "riceguard:riceguard",
    "riceguard+wgquick:wireguard-go",
]
CHECKS = ("up", "handshake", "ping4", "ping6", "iperf3", "wg-show", "roaming")
MAX_LOSS_PCT = 10.0        # steady-state ping loss tolerated (userspace peers on a busy host)
AFTER_PINGS = 10           # pings each way after a move (so one late packet is tolerated)
HANDSHAKE_MAX_AGE = 180    # seconds; WireGuard rekeys every 120 s


def parse_pair(spec):
    try:
        client, server = spec.split(":")
    except ValueError:
        raise SystemExit(f"bad pair {spec!r}: want CLIENT:SERVER, e.g. riceguard:wireguard-go")
    wg_quick = client.endswith("+wgquick")
    client = client.removesuffix("+wgquick")
    for name in (client, server):
        if name not in wgnet.IMPLS:
            raise SystemExit(f"unknown implementation {name!r} in {spec!r}: "
                             f"one of {', '.join(wgnet.IMPLS)}")
    return {"spec": spec, "client": client, "server": server, "wg_quick": wg_quick}


class PairRun:
    """The checks of one pair and their outcomes."""

    def __init__(self, pair, opts, index, logdir):
        self.pair, self.opts, self.index, self.logdir = pair, opts, index, logdir
        self.results = {}  # check -> (ok: bool|None, detail)
        self.cells = {"ping4": "-", "ping6": "-", "iperf3": "-", "roaming": "-"}
        self.lab = None  # while the pair's lab is up

    def record(self, check, ok, detail=""):
        self.results[check] = (ok, detail)
        mark = "ok" if ok else "FAIL"
        log(f"  [{mark}] {check}: {detail}")
        if not ok and self.lab is not None:
            self.snapshot(check)

    def snapshot(self, check):
        """Keep both sides' `wg show` and interface counters next to the daemon logs, to
        tell which side dropped what."""
        path = os.path.join(self.logdir, f"{self.index}-{self.pair['spec']}.failures.txt")
        with open(path, "a") as f:
            f.write(f"=== {time.strftime('%H:%M:%S')} {check} failed: "
                    f"{self.results[check][1]}\n")
            for side in (self.lab.a, self.lab.b):
                for argv in (["wg", "show", side.ifname], ["ip", "-s", "link", "show"]):
                    cp = side.sh(argv, check=False, timeout=5)
                    f.write(f"--- {side.tag} ({side.impl}): {' '.join(argv)}\n"
                            f"{cp.stdout}{cp.stderr}")

    def check_names(self):
        return CHECKS + (("detach",) if self.pair["wg_quick"] else ())

    def skip_all(self, why):
        for c in self.check_names():
            self.results[c] = (None, why)

    def run(self):
        p = self.pair
        missing = [n for n in (p["client"], p["server"]) if wgnet.impl_path(n) is None]
        if missing:
            why = f"{', '.join(sorted(set(missing)))} not available"
            log(f"  [skip] {why}")
            self.skip_all(why)
            return
        try:
            with wgnet.Lab(self.index, self.logdir) as lab:
                self.lab = lab
                try:
                    self.checks(lab)
                finally:
                    self.lab = None
        except LabError as e:
            self.record("lab", False, str(e))
        for c in self.check_names():  # a step that could not run is a failed check, not a silent one
            self.results.setdefault(c, (False, "not reached"))

    def checks(self, lab):
        p, a, b = self.pair, lab.a, lab.b
        conf = None
        try:
            lab.start(b, p["server"])
            if p["wg_quick"]:
                wgnet.configure_server(b, a)
                conf = wgnet.wg_quick_conf(lab, a, b)
                detach = wgnet.wg_quick_up(lab, a, p["client"], conf)
            else:
                lab.start(a, p["client"])
                wgnet.configure_pair(lab, a, b)
        except LabError as e:
            self.record("up", False, str(e))
            return
        self.record("up", True, f"{a.ifname} ({p['client']}), {b.ifname} ({p['server']})")
        if conf is not None:
            self.record("detach", not detach, "; ".join(detach) or "daemon left wg-quick's "
                        "stdio and runs on its own")

        took = wgnet.wait_reply(a, b.inner4)
        if took is None:
            self.record("handshake", False, "no reply a->b over the tunnel within 10 s")
            return
        self.record("handshake", True, f"first reply after {took:.1f}s")

        self.ping_family("ping4", a, b, a.inner4, b.inner4)
        self.ping_family("ping6", a, b, a.inner6, b.inner6)
        self.iperf(lab, a, b)
        self.wg_show(a, b)
        self.roaming(a, b)

        if conf is not None:
            cp = wgnet.wg_quick_down(a, conf)
            if cp.returncode != 0:
                self.record("wg-quick down", False, f"wg-quick down exited {cp.returncode}: "
                            f"{cp.stderr.strip()[-200:]}")

    def ping_family(self, check, a, b, a_addr, b_addr):
        gap = 0.1 if self.opts.quick else 0.2  # 10 pings either way: one loss is tolerated
        try:
            ab = wgnet.ping(a, b_addr, count=10, interval=gap)
            ba = wgnet.ping(b, a_addr, count=10, interval=gap)
        except LabError as e:
            self.record(check, False, str(e))
            return
        self.cells[check] = f"{ab['loss_pct']:.0f}% / {ba['loss_pct']:.0f}%"
        ok = ab["loss_pct"] <= MAX_LOSS_PCT and ba["loss_pct"] <= MAX_LOSS_PCT
        self.record(check, ok, f"loss a->b {ab['loss_pct']:.0f}%, b->a {ba['loss_pct']:.0f}%, "
                    f"rtt {ab['rtt_avg_ms']} ms")

    def iperf(self, lab, a, b):
        secs = 2 if self.opts.quick else 5
        try:
            res = wgnet.iperf3(lab, a, b, b.inner4, seconds=secs)
            mbps = wgnet.tcp_mbps(res)
        except (LabError, KeyError) as e:
            self.record("iperf3", False, str(e))
            return
        self.cells["iperf3"] = f"{mbps:.0f}"
        self.record("iperf3", mbps > 0, f"{mbps:.0f} Mbit/s over {secs}s TCP a->b")

    def wg_show(self, a, b):
        now = time.time()
        problems = []
        for side, peer in ((a, b), (b, a)):
            try:
                peers = wgnet.wg_dump(side)
            except LabError as e:
                problems.append(str(e))
                continue
            match = [x for x in peers if x["public_key"] == peer.public_key]
            if not match:
                problems.append(f"{side.tag}: peer missing from wg show")
                continue
            x = match[0]
            hs = x["latest_handshake"]
            # boringtun 0.7.1 reports the handshake's age instead of its time (its
            # api.rs writes time_since_last_handshake): accept that, for boringtun only.
            age = hs if side.impl == "boringtun" and hs < 1e9 else now - hs
            if hs == 0 or age > HANDSHAKE_MAX_AGE:
                problems.append(f"{side.tag}: latest handshake {hs} (age {age:.0f}s)")
            if x["rx"] == 0 or x["tx"] == 0:
                problems.append(f"{side.tag}: transfer rx={x['rx']} tx={x['tx']}")
        self.record("wg-show", not problems,
                    "; ".join(problems) or "recent handshake, nonzero transfer both sides")

    def b_sees_endpoint(self, b, a):
        for x in wgnet.wg_dump(b):
            if x["public_key"] == a.public_key:
                return x["endpoint"]
        return None

    def roaming(self, a, b):
        """Side a moves while a ping runs: (1) its IPv4 outer address is replaced; if b
        has not seen the new source within 3 s, a rebinds (`wg set listen-port`), as the
        WireGuard apps do on a network change: wireguard-go 0.0.20220316 keeps a stale
        sticky source (it retries only on EINVAL, this kernel says ENETUNREACH) and
        boringtun a connected socket. (2) a's endpoint for b is switched to b's IPv6
        address. Each time b must carry on and show a's new endpoint."""
        steps = []
        rebound = False
        try:
            before = self.b_sees_endpoint(b, a)
            n = 60
            bg = wgnet.ping_start(a.lab, a, b.inner4, n, 0.1)
            time.sleep(0.8)
            a.sh(["ip", "addr", "add", f"{wgnet.ROAM4}/24", "dev", a.veth])
            a.sh(["ip", "addr", "del", f"{a.outer4}/24", "dev", a.veth])
            want4 = f"{wgnet.ROAM4}:{a.port}"
            if not self.wait_endpoint(b, a, want4, 3):
                rebound = True
                a.port += 10
                want4 = f"{wgnet.ROAM4}:{a.port}"
                a.sh(["wg", "set", a.ifname, "listen-port", str(a.port)])
                self.wait_endpoint(b, a, want4, 3)
            res = wgnet.ping_finish(bg, n * 0.1 + 15)
            during = res["loss_pct"] if res else 100.0
            after_ab = wgnet.ping(a, b.inner4, count=AFTER_PINGS, interval=0.1)
            after_ba = wgnet.ping(b, a.inner4, count=AFTER_PINGS, interval=0.1)
            ep4 = self.b_sees_endpoint(b, a)
            ok4 = (ep4 == want4 and after_ab["loss_pct"] <= MAX_LOSS_PCT
                   and after_ba["loss_pct"] <= MAX_LOSS_PCT)
            steps.append((ok4, f"v4 move{' + rebind' if rebound else ''}: endpoint {before} "
                               f"-> {ep4} (want {want4}), loss during {during:.0f}%, after "
                               f"a->b {after_ab['loss_pct']:.0f}% b->a "
                               f"{after_ba['loss_pct']:.0f}%"))
            # (2) a now reaches b over the IPv6 outer network.
            endpoint = ["endpoint", f"[{b.outer6}]:{b.port}"]
            if a.impl == "boringtun":
                # boringtun 0.7.1 panics when an existing peer is changed ("Modifying
                # existing peers is not yet supported. Remove and add again instead.").
                a.sh(["wg", "set", a.ifname, "peer", b.public_key, "remove"])
                endpoint += ["allowed-ips", f"{b.inner4}/32,{b.inner6}/128"]
            a.sh(["wg", "set", a.ifname, "peer", b.public_key] + endpoint)
            wgnet.wait_reply(a, b.inner6, attempts=5)
            after_ab = wgnet.ping(a, b.inner6, count=AFTER_PINGS, interval=0.1)
            after_ba = wgnet.ping(b, a.inner6, count=AFTER_PINGS, interval=0.1)
            ep6 = self.b_sees_endpoint(b, a)
            want6 = f"[{a.outer6}]:{a.port}"
            ok6 = (ep6 == want6 and after_ab["loss_pct"] <= MAX_LOSS_PCT
                   and after_ba["loss_pct"] <= MAX_LOSS_PCT)
            steps.append((ok6, f"v6 outer: endpoint -> {ep6} (want {want6}), loss a->b "
                               f"{after_ab['loss_pct']:.0f}% b->a {after_ba['loss_pct']:.0f}%"))
        except LabError as e:
            steps.append((False, str(e)))
        ok = all(s[0] for s in steps)
        self.cells["roaming"] = ("ok (rebind)" if rebound else "ok") if ok else "FAIL"
        self.record("roaming", ok, "; ".join(s[1] for s in steps))

    def wait_endpoint(self, b, a, want, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.b_sees_endpoint(b, a) == want:
                return True
            time.sleep(0.2)
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ci/interop.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", help="only pairs whose both sides are among these "
                    f"(comma-separated; {', '.join(wgnet.IMPLS)})")
    ap.add_argument("--pairs", help="explicit CLIENT:SERVER list, comma-separated "
                    "(CLIENT may end in +wgquick)")
    ap.add_argument("--quick", action="store_true", help="fewer pings, 2 s iperf3")
    ap.add_argument("--require-all", action="store_true",
                    help="count a pair whose implementation is missing as failed, not skipped")
    ap.add_argument("--list", action="store_true", help="print the selected pairs and exit")
    opts = ap.parse_args(argv)

    pairs = [parse_pair(s) for s in (opts.pairs.split(",") if opts.pairs else DEFAULT_PAIRS)]
    if opts.impls:
        keep = set(opts.impls.split(","))
        bad = keep - set(wgnet.IMPLS)
        if bad:
            raise SystemExit(f"unknown implementation(s): {', '.join(sorted(bad))}")
        pairs = [p for p in pairs if p["client"] in keep and p["server"] in keep]
    if opts.list:
        print("\n".join(p["spec"] for p in pairs))
        return 0
    if not pairs:
        raise SystemExit("no pairs selected")

    wgnet.require_root()
    wgnet.install_signal_handlers()
    wgnet.sweep_stale()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logdir = os.path.join(wgnet.REPO, "out", "interop", stamp)
    os.makedirs(logdir, exist_ok=True)
    log(f"interop: {len(pairs)} pair(s); daemon logs in {logdir}")
    for name in wgnet.IMPLS:
        log(f"  {name}: {wgnet.impl_path(name) or 'not available'} "
            f"({wgnet.impl_version(name) or '-'})")

    runs = []
    for i, p in enumerate(pairs):
        log(f"== {p['spec']}")
        r = PairRun(p, opts, i, logdir)
        r.run()
        runs.append(r)

    passed = failed = skipped = 0
    rows = []
    for r in runs:
        oks = [v[0] for v in r.results.values()]
        if all(o is None for o in oks):
            verdict = "skipped"
        else:
            verdict = "pass" if all(oks) else "FAIL"
        for ok, _ in r.results.values():
            if ok is None:
                if opts.require_all:
                    failed += 1
                else:
                    skipped += 1
            elif ok:
                passed += 1
            else:
                failed += 1
        bad = [c for c, v in r.results.items() if v[0] is False]
        rows.append([r.pair["spec"].replace(":", " ↔ "), r.cells["ping4"], r.cells["ping6"],
                     r.cells["iperf3"], r.cells["roaming"],
                     verdict + (f" ({', '.join(bad)})" if bad else "")])
    print(wgnet.md_table(["pair (client ↔ server)", "ping v4 loss a→b / b→a",
                          "ping v6 loss a→b / b→a", "iperf3 Mbit/s", "roaming", "result"], rows))
    print()
    for r in runs:
        unreached = [c for c, (ok, d) in r.results.items() if ok is False and d == "not reached"]
        for c, (ok, detail) in r.results.items():
            if ok is False and c not in unreached:
                print(f"- {r.pair['spec']} {c}: {detail}")
        if unreached:
            print(f"- {r.pair['spec']} not reached: {', '.join(unreached)}")
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
