"""Passive keepalive and padding conformance (ci/keepalive.sh: what a stock peer expects on the wire).

riceguard (drop-in, `-f`, configured by stock `wg`, with the peer's endpoint) and stock
wireguard-go in two namespaces. riceguard's side pings wireguard-go's tunnel address once
every KA_INTERVAL seconds (default 20) for KA_DURATION seconds (default 120), then waits
long enough for a passive keepalive (10 s) and for the handshake a stock peer starts when
it stops hearing back (15 s after its last packet). tcpdump in riceguard's namespace
records the outer UDP. Asserted on the capture (no timing is asserted):

  * exactly one handshake: one initiation and one response in the whole run (a peer owed
    a keepalive that never comes re-handshakes after every pause);
  * after each data message riceguard received (the echo replies), the next data message
    riceguard sends is a keepalive (type 4, UDP payload 32 bytes);
  * every data message's UDP payload is a multiple of 16 bytes (16 header + padded
    plaintext + 16 tag), in both directions;
  * every ping was answered (sanity).

Ends with "N passed, N failed"; exit 1 on failure. RG_BIN picks the riceguard binary.
"""

import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forge  # noqa: E402
import wgnet  # noqa: E402
from wgnet import LabError, log  # noqa: E402

DURATION = float(os.environ.get("KA_DURATION", "120"))
INTERVAL = float(os.environ.get("KA_INTERVAL", "20"))
# After the last ping: the keepalive is due within 10 s, a stock peer re-handshakes 15 s
# after its last packet when it heard nothing back; 17 s sees both.
TAIL = float(os.environ.get("KA_TAIL", "17"))
LAB_INDEX = 7
NAMES = {1: "initiation", 2: "response", 3: "cookie", 4: "data"}


def main():
    frame = wgnet.CheckLab("keepalive")
    logdir, check = frame.logdir, frame.check
    n_pings = max(1, math.ceil(DURATION / INTERVAL))
    print(f"keepalive: riceguard {wgnet.riceguard_bin()} <-> wireguard-go; a ping every "
          f"{INTERVAL:g} s for {DURATION:g} s ({n_pings} pings), then {TAIL:g} s; logs in {logdir}",
          flush=True)
    if INTERVAL <= 10:
        log("KA_INTERVAL <= 10 s: the next ping comes before a keepalive is due; "
            "the keepalive check then only sees the last reply")
    try:
        with wgnet.Lab(LAB_INDEX, logdir) as lab:
            rg, wg = lab.a, lab.b
            pcap = os.path.join(logdir, "outer.pcap")
            lab.start(rg, "riceguard")
            lab.start(wg, "wireguard-go")
            cap = wgnet.start_capture(lab, rg, pcap, f"udp and host {wg.outer4}")
            wgnet.configure_pair(lab, rg, wg)  # riceguard has the endpoint and initiates

            results = []
            t0 = time.monotonic()
            for k in range(n_pings):
                due = t0 + k * INTERVAL
                time.sleep(max(0.0, due - time.monotonic()))
                r = wgnet.ping(rg, wg.inner4, count=1, wait=5)
                results.append(r)
                print(f"  ping {k + 1}/{n_pings} at +{time.monotonic() - t0:5.1f} s: "
                      f"{'reply' if r['received'] else 'NO REPLY'}", flush=True)
            time.sleep(TAIL)
            time.sleep(0.5)
            wgnet.stop_process(cap)
            msgs = analyse(pcap, rg, wg)

            print("\nouter UDP between riceguard (rg) and wireguard-go (wg):")
            tz = msgs[0]["time"] if msgs else 0
            for m in msgs:
                print(f"  +{m['time'] - tz:7.3f} s  {m['dir']}  {NAMES.get(m['type'], '?'):10s} "
                      f"{m['len']:5d} B" + ("  (keepalive)" if m["type"] == 4 and m["len"] == 32
                                           else ""))
            print()
            inits = [m for m in msgs if m["type"] == 1]
            resps = [m for m in msgs if m["type"] == 2]
            check("exactly one handshake (one initiation, one response)",
                  len(inits) == 1 and len(resps) == 1,
                  f"{len(inits)} initiations ({when(inits, tz)}), "
                  f"{len(resps)} responses ({when(resps, tz)})")
            rg_to, wg_to = "rg->wg", "wg->rg"
            data = [m for m in msgs if m["type"] == 4]
            replies = [i for i, m in enumerate(data) if m["dir"] == wg_to and m["len"] > 32]
            missing = []
            for i in replies:
                nxt = next((m for m in data[i + 1:] if m["dir"] == rg_to), None)
                if nxt is None or nxt["len"] != 32:
                    missing.append((data[i]["time"] - tz,
                                    None if nxt is None else (nxt["time"] - tz, nxt["len"])))
            check("riceguard sends a keepalive after each data message it received",
                  replies and not missing,
                  f"{len(replies)} data messages received, {len(replies) - len(missing)} "
                  f"followed by a keepalive" + (
                      "; missing after " + ", ".join(
                          f"+{t:.1f} s (next rg->wg data: "
                          f"{'none' if n is None else f'+{n[0]:.1f} s {n[1]} B'})"
                          for t, n in missing[:8]) if missing else ""))
            for d, who in ((rg_to, "riceguard"), (wg_to, "wireguard-go")):
                sizes = sorted({m["len"] for m in data if m["dir"] == d})
                bad = [s for s in sizes if s % 16]
                check(f"{who}'s data messages are padded (UDP payload % 16 == 0)",
                      sizes and not bad, f"sizes {sizes}")
            answered = sum(1 for r in results if r["received"])
            check("every ping answered", answered == len(results),
                  f"{answered}/{len(results)}")
    except LabError as e:
        check("lab", False, str(e))
    frame.finish("capture and logs")


def when(msgs, tz):
    return ", ".join("+%.1f s %s" % (m["time"] - tz, m["dir"]) for m in msgs)


def analyse(pcap, rg, wg):
    """WireGuard messages between the two outer addresses, in capture order."""
    out = []
    for d in forge.read_pcap_udp(pcap):
        if {d["src"], d["dst"]} != {rg.outer4, wg.outer4}:
            continue
        t = forge.msg_type(d["payload"])
        if t not in NAMES:
            continue
        out.append({"time": d["time"], "type": t, "len": len(d["payload"]),
                    "dir": "rg->wg" if d["src"] == rg.outer4 else "wg->rg"})
    return out


if __name__ == "__main__":
    main()
