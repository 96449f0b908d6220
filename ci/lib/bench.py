"""Throughput/latency/CPU benchmark of riceguard against wireguard-go, boringtun and the plain
veth ceiling, in the same namespaces as the interop test (run through ci/bench.sh).

Owns: the benchmark setups, the measurements, median/spread/ratios, and the markdown + JSON
report. Not a test: it fails only when a setup cannot be brought up at all.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wgnet  # noqa: E402
from wgnet import LabError, log  # noqa: E402


# --- setups: how the path between side a and side b is made ---------------------------
# Each setup brings up its path in a fresh Lab and returns (dst address on b, payload MTU,
# daemon PIDs whose CPU is counted). Add a setup by adding a function and a SETUPS entry.

def setup_veth(lab):
    return lab.b.outer4, 1500, []


def setup_tunnel(impl, extra_args=(), attempts=10):
    def setup(lab):
        lab.start(lab.b, impl, extra_args)
        lab.start(lab.a, impl, extra_args)
        wgnet.configure_pair(lab, lab.a, lab.b)
        if wgnet.wait_reply(lab.a, lab.b.inner4, attempts=attempts) is None:
            raise LabError(f"{impl}: no reply through the tunnel within {attempts} s")
        return lab.b.inner4, wgnet.TUNNEL_MTU, [lab.a.pid, lab.b.pid]
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
    dst, _, pids = setup_tunnel("riceguard", extra, attempts=25)(lab)
    return dst, wgnet.TUNNEL_MTU - 54, pids  # DESIGN.md: ~54 bytes less inside TCP


SETUPS = {
    "veth": (setup_veth, None),
    "wireguard-go": (setup_tunnel("wireguard-go"), "wireguard-go"),
    "boringtun": (setup_tunnel("boringtun"), "boringtun"),
    "riceguard": (setup_tunnel("riceguard"), "riceguard"),
    "riceguard-tcp": (setup_riceguard_tcp, "riceguard"),
}
DEFAULT_SETUPS = ["veth", "wireguard-go", "boringtun", "riceguard"]

# --- metrics ----------------------------------------------------------------------------
# name -> (label, unit, whether to show ratios vs wireguard-go and veth: throughputs only)
METRICS = {
    "tcp1_mbps": ("TCP 1 stream", "Mbit/s", True),
    "tcp4_mbps": ("TCP 4 streams", "Mbit/s", True),
    "udp_goodput_mbps": ("UDP @1G goodput", "Mbit/s", True),
    "udp_loss_pct": ("UDP @1G loss", "%", False),
    "pps64_kpps": ("UDP 64 B", "kpps", True),
    "rtt_idle_ms": ("ping idle", "ms", False),
    "rtt_load_ms": ("ping under load", "ms", False),
    "cpu_s_per_gbit_tcp1": ("CPU TCP 1", "s/Gbit", False),
    "cpu_s_per_gbit_udp": ("CPU UDP", "s/Gbit", False),
}


# Without a bigger socket buffer the receiving iperf3 drops ~half of 1 Gbit/s even on a bare
# veth on this 2-core host; 4 MiB is net.core.rmem_max here (recorded in the JSON).
UDP_BUF = ["-w", "4M"]


def daemon_cpu(pids):
    vals = [wgnet.cpu_seconds(p) for p in pids]
    return None if any(v is None for v in vals) else sum(vals)


def measure(lab, dst, mtu, pids, secs):
    a, b = lab.a, lab.b
    out = {}
    out["rtt_idle_ms"] = wgnet.ping(a, dst, count=20, interval=0.05)["rtt_avg_ms"]

    # Single TCP stream with a ping alongside for the loaded RTT.
    pinger = wgnet.ping_start(lab, a, dst, max(1, int(secs / 0.2) - 5), 0.2)
    c0 = daemon_cpu(pids)
    res = wgnet.iperf3(lab, a, b, dst, seconds=secs)
    c1 = daemon_cpu(pids)
    loaded = wgnet.ping_finish(pinger, secs + 10)
    out["rtt_load_ms"] = loaded["rtt_avg_ms"] if loaded else None
    out["tcp1_mbps"] = wgnet.tcp_mbps(res)
    gbits = res["end"]["sum_received"]["bytes"] * 8 / 1e9
    out["cpu_s_per_gbit_tcp1"] = (c1 - c0) / gbits if pids and c0 is not None \
        and c1 is not None and gbits > 0 else None

    res = wgnet.iperf3(lab, a, b, dst, seconds=secs, args=["-P", "4"])
    out["tcp4_mbps"] = wgnet.tcp_mbps(res)

    # UDP at 1 Gbit/s offered, datagrams sized to the path (no IP fragmentation).
    payload = mtu - 28
    c0 = daemon_cpu(pids)
    res = wgnet.iperf3(lab, a, b, dst, seconds=secs, args=["-u", "-b", "1G", "-l", str(payload)] + UDP_BUF)
    c1 = daemon_cpu(pids)
    sent, recv = res["end"]["sum_sent"]["bytes"], res["end"]["sum_received"]["bytes"]
    out["udp_goodput_mbps"] = res["end"]["sum_received"]["bits_per_second"] / 1e6
    out["udp_loss_pct"] = 100.0 * (1 - recv / sent) if sent else None
    gbits = recv * 8 / 1e9
    out["cpu_s_per_gbit_udp"] = (c1 - c0) / gbits if pids and c0 is not None \
        and c1 is not None and gbits > 0 else None

    # Small packets, unlimited rate: packets per second delivered.
    res = wgnet.iperf3(lab, a, b, dst, seconds=secs, args=["-u", "-b", "0", "-l", "64"] + UDP_BUF)
    r = res["end"]["sum_received"]
    out["pps64_kpps"] = r["bytes"] / 64 / r["seconds"] / 1e3 if r["seconds"] else None
    return out


def riceguard_status(lab, side):
    """What riceguard says about itself (offload decisions): `riceguard status IFNAME`, else
    the lines of its log that mention offload/GSO/GRO/io_uring."""
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


def run_setup(name, opts, index, logdir):
    setup, impl = SETUPS[name]
    if impl and wgnet.impl_path(impl) is None:
        return {"skipped": f"{impl} not available"}
    reps, extra = [], {}
    for rep in range(opts.reps):
        log(f"== {name} rep {rep + 1}/{opts.reps}")
        try:
            with wgnet.Lab(index * 100 + rep, logdir) as lab:
                dst, mtu, pids = setup(lab)
                if impl == "riceguard" and rep == 0:
                    extra["riceguard"] = riceguard_status(lab, lab.a)
                r = measure(lab, dst, mtu, pids, opts.seconds)
        except (LabError, KeyError, ValueError) as e:
            log(f"  failed: {e}")
            return {"error": str(e), "reps": reps, **extra}
        log("  " + ", ".join(f"{k}={v:.3g}" for k, v in r.items() if v is not None))
        reps.append(r)
    summary = {}
    for k in METRICS:
        vals = [r[k] for r in reps if r.get(k) is not None]
        if vals:
            summary[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return {"reps": reps, "summary": summary, **extra}


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def add_ratios(results):
    """results[setup]["ratios"][metric] = {baseline: median / baseline's median} for the
    throughput metrics, against wireguard-go and the veth ceiling."""
    for n, r in results.items():
        if "summary" not in r or n == "veth":
            continue
        r["ratios"] = {}
        for k, (_, _, ratio) in METRICS.items():
            mine = r["summary"].get(k)
            for base in ("wireguard-go", "veth"):
                b = results.get(base, {}).get("summary", {}).get(k)
                if ratio and mine and b and b["median"] and n != base:
                    r["ratios"].setdefault(k, {})[base] = mine["median"] / b["median"]


def report(results, opts):
    lines = []
    names = [n for n in results if "summary" in results[n]]
    header = ["metric"] + names
    rows = []
    for k, (label, unit, _) in METRICS.items():
        row = [f"{label} ({unit})"]
        for n in names:
            s = results[n]["summary"].get(k)
            if s is None:
                row.append("-")
                continue
            cell = fmt(s["median"])
            if opts.reps > 1:
                cell += f" [{fmt(s['min'])}–{fmt(s['max'])}]"
            parts = [f"{v:.2f}× {'wg-go' if base == 'wireguard-go' else base}"
                     for base, v in results[n].get("ratios", {}).get(k, {}).items()]
            if parts:
                cell += " (" + ", ".join(parts) + ")"
            row.append(cell)
        rows.append(row)
    lines.append(wgnet.md_table(header, rows))
    if opts.reps > 1:
        lines.append(f"\nmedian of {opts.reps} runs of {opts.seconds} s, [min–max]; ratios of medians.")
    for n, r in results.items():
        if "summary" not in r:
            lines.append(f"- {n}: {r.get('skipped') or 'error: ' + r.get('error', '?')}")
    return "\n".join(lines)


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
    ap.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                    help=f"comma-separated, from: {', '.join(SETUPS)}")
    ap.add_argument("--with-tcp-fallback", action="store_true",
                    help="add the riceguard-over-TCP row (UDP dropped by nftables)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="length of each iperf3 run")
    ap.add_argument("--quick", action="store_true", help="1 repetition of 3 s runs")
    ap.add_argument("--out", help="JSON path (default out/bench/bench-<UTC time>.json)")
    opts = ap.parse_args(argv)
    if opts.quick:
        opts.reps, opts.seconds = 1, 3
    setups = opts.setups.split(",")
    if opts.with_tcp_fallback and "riceguard-tcp" not in setups:
        setups.append("riceguard-tcp")
    bad = [s for s in setups if s not in SETUPS]
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
    log(f"bench: {', '.join(setups)}; {opts.reps} x {opts.seconds} s; kernel {env['kernel']}, "
        f"load {env['loadavg_at_start']}")

    t0 = time.monotonic()
    results = {}
    for i, name in enumerate(setups):
        results[name] = run_setup(name, opts, i, logdir)
    add_ratios(results)
    text = report(results, opts)
    print(text)
    path = opts.out or os.path.join(outdir, f"bench-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"date": stamp, "reps": opts.reps, "seconds": opts.seconds,
                   "environment": env, "results": results,
                   "elapsed_s": round(time.monotonic() - t0, 1)}, f, indent=1)
    print(f"\nJSON: {os.path.relpath(path, wgnet.REPO)}; kernel {env['kernel']}, "
          f"{env['nproc']} cpus, load at start {env['loadavg_at_start'][0]:.1f}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
