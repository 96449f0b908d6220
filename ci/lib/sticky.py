"""Sends made outside the workers leave from the peer's sticky source (ci/sticky-source.sh).

riceguard (drop-in, configured by stock `wg`) in namespace a holds two addresses on its
uplink veth, 10.203.0.1 (the primary: what routing picks) and 10.203.0.11, and the same
for IPv6 (fd03::1 and fd03::11). A stock wireguard-go peer in namespace b knows riceguard
only as 10.203.0.11 (then [fd03::11]) and starts the handshake; riceguard learns the
peer's endpoint from it and has `persistent-keepalive 1`, so its keepalives are made by
the timer thread, not by a worker answering a datagram. tcpdump in b's namespace
records what reaches the peer. Asserted on the capture, per family:

  * every datagram riceguard sent came from the address the peer uses (10.203.0.11 /
    fd03::11), none from the primary;
  * at least two keepalives (UDP payload 32 bytes, type 4) among them: the timer's sends
    were seen, not only the workers' replies;
  * the ping through the tunnel was answered (sanity).

A ping test alone would pass without the source: wireguard-go roams to whatever address
an authenticated datagram comes from. Ends with "N passed, N failed"; exit 1 on failure.
"""

import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forge  # noqa: E402
import wgnet  # noqa: E402
from wgnet import LabError  # noqa: E402

LAB_INDEX = 8
SECOND = {4: "10.203.0.11", 6: "fd03::11"}
# Keepalives are due once a second; this many seconds of quiet show several.
QUIET = 3.5


def main():
    lab = wgnet.CheckLab("sticky-source")
    print(f"sticky-source: riceguard {wgnet.riceguard_bin()} with two uplink addresses, "
          f"wireguard-go knows it by the second; logs in {lab.logdir}", flush=True)
    for fam in (4, 6):
        try:
            run_family(fam, lab.logdir, lab.check)
        except LabError as e:
            lab.check(f"IPv{fam} lab", False, str(e))
    lab.finish("captures")


def run_family(fam, logdir, check):
    with wgnet.Lab(LAB_INDEX, logdir) as lab:
        rg, wg = lab.a, lab.b
        primary = rg.outer4 if fam == 4 else rg.outer6
        second = SECOND[fam]
        plen = 24 if fam == 4 else 64
        # IPv6 source selection would pick fd03::11 itself (longest match with the peer's
        # fd03::2); deprecated (preferred_lft 0) it is never picked, still used when asked.
        extra = [] if fam == 4 else ["nodad", "preferred_lft", "0"]
        rg.sh(["ip", "addr", "add", f"{second}/{plen}", "dev", rg.veth] + extra)
        lab.start(rg, "riceguard")
        lab.start(wg, "wireguard-go")
        pcap = os.path.join(logdir, f"ipv{fam}.pcap")
        cap = wgnet.start_capture(lab, wg, pcap, f"udp port {rg.port}", 2000, f"tcpdump{fam}")
        # riceguard: the peer without an endpoint (learnt from its handshake), keepalives
        # from its timer every second.
        wgnet.configure_server(rg, wg)
        rg.sh(["wg", "set", rg.ifname, "peer", wg.public_key, "persistent-keepalive", "1"])
        host = second if fam == 4 else f"[{second}]"
        wg.sh(["wg", "set", wg.ifname, "private-key", wg.keyfile, "listen-port", str(wg.port),
               "peer", rg.public_key, "endpoint", f"{host}:{rg.port}",
               "allowed-ips", f"{rg.inner4}/32,{rg.inner6}/128"])
        wgnet.address_tunnel(wg)
        r = wgnet.ping(wg, rg.inner4 if fam == 4 else rg.inner6, count=2, wait=3)
        time.sleep(QUIET)
        wgnet.stop_process(cap)
        from_rg = [d for d in forge.read_pcap_udp(pcap)
                   if d["sport"] == rg.port and forge.msg_type(d["payload"]) in (1, 2, 3, 4)]
        srcs = sorted({d["src"] for d in from_rg})
        wrong = [d for d in from_rg if d["src"] != second]
        keepalives = [d for d in from_rg
                      if forge.msg_type(d["payload"]) == 4 and len(d["payload"]) == 32]
        check(f"IPv{fam}: every datagram riceguard sent left from {second}, the address "
              f"the peer uses (not the primary {primary})",
              from_rg and not wrong,
              f"{len(from_rg)} datagrams from {', '.join(srcs) or 'nowhere'}"
              + (f"; {len(wrong)} from another" if wrong else ""))
        check(f"IPv{fam}: the timer's keepalives are among them (at least 2)",
              len(keepalives) >= 2, f"{len(keepalives)} keepalives")
        check(f"IPv{fam}: ping through the tunnel answered", r["received"] > 0,
              f"{r['received']}/{r['sent']}")


if __name__ == "__main__":
    main()
