"""Throughput/latency/CPU benchmark of riceguard against wireguard-go, boringtun and the plain
veth ceiling, in the same namespaces as the interop test (run through ci/bench.sh).

Owns: the benchmark setups, the measurements, median/spread/ratios, and the markdown + JSON +
SVG report (`--plot-only JSON` redraws the SVG of an earlier run). Not a test: it fails only
when a setup cannot be brought up at all.
"""

import argparse
import datetime
import json
import math
import os
import platform
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
# Each setup brings up its path in a fresh Lab and returns (dst address on b, payload MTU,
# daemon PIDs whose CPU is counted). Add a setup by adding a function and a SETUPS entry.

def setup_veth(lab):
    return lab.b.outer4, 1500, []


def setup_tunnel(impl, extra_args=(), attempts=10, side_args=None):
    """Setup for `impl` on both sides; riceguard gets `extra_args` after $RG_ARGS, then
    `side_args[tag]` for side "a" or "b" (all recorded in the JSON as the setup's "args")."""
    side_args = side_args or {}

    def setup(lab):
        lab.start(lab.b, impl, list(extra_args) + side_args.get("b", []))
        lab.start(lab.a, impl, list(extra_args) + side_args.get("a", []))
        wgnet.configure_pair(lab, lab.a, lab.b)
        if wgnet.wait_reply(lab.a, lab.b.inner4, attempts=attempts) is None:
            raise LabError(f"{impl}: no reply through the tunnel within {attempts} s")
        return lab.b.inner4, wgnet.TUNNEL_MTU, [lab.a.pid, lab.b.pid]
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
    dst, _, pids = setup_tunnel("riceguard", extra, attempts=25)(lab)
    return dst, wgnet.TUNNEL_MTU - 54, pids  # DESIGN.md: ~54 bytes less inside TCP


SETUPS = {
    "veth": (setup_veth, None),
    "wireguard-go": (setup_tunnel("wireguard-go"), "wireguard-go"),
    "boringtun": (setup_tunnel("boringtun"), "boringtun"),
    "riceguard": (setup_tunnel("riceguard"), "riceguard"),
    # Busy-polling workers (the latency target) need cores of their own: one worker per
    # side, side a's on core 0 and side b's on core 1. Pinned to the same core, the two
    # spinning workers took turns by scheduler time slice (idle ping 9 ms).
    "riceguard-busy": (setup_tunnel("riceguard", ["--poll", "busy", "--workers", "1"],
                                    side_args={"a": ["--cores", "0"], "b": ["--cores", "1"]}),
                       "riceguard"),
    "riceguard-tcp": (setup_riceguard_tcp, "riceguard"),
}
DEFAULT_SETUPS = ["veth", "wireguard-go", "boringtun", "riceguard", "riceguard-busy"]

# --- metrics ----------------------------------------------------------------------------
# name -> (label, unit, baselines the median is divided by for the ratio columns). The
# throughputs are compared with wireguard-go and the veth ceiling, idle RTT with the bare veth
# (the issue-11 targets); veth itself and a baseline against itself get no ratio.
TPUT = ("wireguard-go", "veth")
METRICS = {
    "tcp1_mbps": ("TCP 1 stream", "Mbit/s", TPUT),
    "tcp4_mbps": ("TCP 4 streams", "Mbit/s", TPUT),
    "udp_goodput_mbps": ("UDP @1G goodput", "Mbit/s", TPUT),
    "udp_loss_pct": ("UDP @1G loss", "%", ()),
    "pps64_kpps": ("UDP 64 B", "kpps", TPUT),
    "rtt_idle_ms": ("ping idle", "ms", ("veth",)),
    "rtt_load_ms": ("ping under load", "ms", ()),
    "cpu_s_per_gbit_tcp1": ("CPU TCP 1", "s/Gbit", ()),
    "cpu_s_per_gbit_udp": ("CPU UDP", "s/Gbit", ()),
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
    if getattr(setup, "extra_args", None):
        extra["args"] = setup.extra_args
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
    """results[setup]["ratios"][metric] = {baseline: median / baseline's median} for each
    metric's baselines (METRICS)."""
    for n, r in results.items():
        if "summary" not in r or n == "veth":
            continue
        r["ratios"] = {}
        for k, (_, _, bases) in METRICS.items():
            mine = r["summary"].get(k)
            for base in bases:
                b = results.get(base, {}).get("summary", {}).get(k)
                if mine and b and b["median"] and n != base:
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
        if r.get("args"):
            lines.append(f"- {n}: riceguard {' '.join(r['args'])}")
    for n, r in results.items():
        if "summary" not in r:
            lines.append(f"- {n}: {r.get('skipped') or 'error: ' + r.get('error', '?')}")
    return "\n".join(lines)


# --- the plot: three panels of bars, one bar per setup, SVG by hand -----------------------
# metric, panel title, y-axis label, what the small "N×" under each value is relative to
PANELS = [
    ("tcp1_mbps", "single-stream TCP", "Mbit/s (higher is better)", "wireguard-go"),
    ("cpu_s_per_gbit_tcp1", "daemon CPU per Gbit/s", "CPU s per Gbit (lower is better)", None),
    ("rtt_idle_ms", "idle ping RTT", "ms (lower is better)", "veth"),
]
COLORS = {"veth": "#9e9e9e", "wireguard-go": "#4e79a7", "boringtun": "#f28e2b",
          "riceguard": "#59a14f", "riceguard-busy": "#2e6b2a", "riceguard-tcp": "#76b7b2"}
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
    height = foot_y + 46
    reps = doc.get("reps", 1)
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
        sums = {n: results[n]["summary"].get(key) for n in names}
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
            ratio = results[n].get("ratios", {}).get(key, {}).get(base) if base else None
            if ratio is not None:
                r = f"{ratio:.2f}" if ratio < 1 else f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}"
                text(cx, label_top - 4, f"{r}×", 9, extra=' fill="#666"')
                label_top -= 11
                ratios += 1
            text(cx, label_top - 4, fmt(s["median"]), 10, extra=' font-weight="bold"')
        if ratios:
            text((left + right) / 2, top - 3, f"grey: ratio to {base}", 9, extra=' fill="#666"')

    notes = [("bars: median of %d runs, whiskers min–max" % reps) if reps > 1
             else "bars: a single run (no spread)"]
    notes += [f"{n}: riceguard {' '.join(r['args'])}" for n, r in results.items() if r.get("args")]
    notes += [f"{n}: {r.get('skipped') or 'error: ' + str(r.get('error', '?'))[:80]}"
              for n, r in results.items() if "summary" not in r]
    for j, ln in enumerate([" · ".join(notes[:3])] + ([" · ".join(notes[3:])] if notes[3:] else [])):
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
    ap.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                    help=f"comma-separated, from: {', '.join(SETUPS)}")
    ap.add_argument("--with-tcp-fallback", action="store_true",
                    help="add the riceguard-over-TCP row (UDP dropped by nftables)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="length of each iperf3 run")
    ap.add_argument("--quick", action="store_true", help="1 repetition of 3 s runs")
    ap.add_argument("--out", help="JSON path (default out/bench/bench-<UTC time>.json); "
                    "the SVG plot goes next to it (same name, .svg)")
    ap.add_argument("--plot-only", metavar="JSON",
                    help="only (re)draw the SVG of an earlier run's JSON, next to it; no root")
    opts = ap.parse_args(argv)
    if opts.plot_only:
        with open(opts.plot_only) as f:
            doc = json.load(f)
        add_ratios(doc["results"])  # JSON from before a METRICS change gets today's ratios
        print(f"SVG: {write_plot(doc, opts.plot_only)}")
        return 0
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
    doc = {"date": stamp, "reps": opts.reps, "seconds": opts.seconds,
           "environment": env, "results": results,
           "elapsed_s": round(time.monotonic() - t0, 1)}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    svg = write_plot(doc, path)
    print(f"\nJSON: {os.path.relpath(path, wgnet.REPO)}; kernel {env['kernel']}, "
          f"{env['nproc']} cpus, load at start {env['loadavg_at_start'][0]:.1f}")
    print(f"SVG: {os.path.relpath(svg, wgnet.REPO)}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
