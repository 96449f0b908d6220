#!/usr/bin/env python3
"""Write the seed inputs of the structured fuzz targets (datagram, coalesce, udp_cmsg,
uring_recv) into seeds/<target>/. Each target reads its input as a little script or
description (see fuzz/src/*.rs), so the seeds are built here from the same encoding
rather than captured. Run from anywhere: python3 fuzz/gen_seeds.py
"""
import os, struct
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'seeds')
def w(t, name, data):
    d = os.path.join(root, t); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), 'wb').write(bytes(data))

# ---- datagram: op scripts (see fuzz/src/datagram.rs, Sim::op) ----
P_TUN = lambda spec=0, n=10: [0, spec, n]
DELIVER_G = lambda sel=0, addr=0: [2, sel, addr]
DELIVER_P = [4]
REPLAY = lambda sel=0, addr=0: [5, sel, addr]
MUTATE = lambda sel, muts, fix, addr: [6, sel, len(muts) - 1] + sum(muts, []) + [fix, addr]
RAW = lambda data, addr=0: [7, len(data)] + list(data) + [addr]
def FORGE(kind2=True, idxsel=0, fill=b'', addr=0, mac2=False):
    spec = (0 if kind2 else 1) | (2 if mac2 else 0)
    out = [8, spec, 1, 2, 3]
    if kind2: out += [idxsel]
    out += list(fill.ljust(48 if kind2 else 108, b'\x00'))
    if mac2: out += [0x55] * 16
    return out + [addr]
COOKIE = lambda skip=0, addr=0: [9, skip] + [7] * 24 + [9] * 16 + [addr]
def FLOOD(n, big, kind2=True, addr=0):
    f = FORGE(kind2, 0, b'', addr)
    return [10, n, 0x80 if big else 0] + f[1:]
TIMERS = lambda dt=3: [11, dt]
G_TUN = lambda to_q=0, spec=0, n=10: [12, 0, spec, n, to_q]
P_FORCE = [12, 2]
G_RAW_TUN = lambda data: [12, 3, len(data) // 2] + list(data)

hs = P_TUN() + DELIVER_G() + DELIVER_P + DELIVER_G()
w('datagram', 'handshake_data', hs + P_TUN(0, 30) + DELIVER_G() + P_TUN(1, 5) + DELIVER_G() + DELIVER_G())
w('datagram', 'replay_mutate', hs + P_TUN(0, 20) + DELIVER_G() + REPLAY(0, 0) + REPLAY(0, 3)
  + REPLAY(2, 1) + MUTATE(0, [[20, 0, 3]], 0, 0) + MUTATE(1, [[0, 4, 0]], 0, 2)
  + MUTATE(3, [[3, 0, 1], [200, 6, 9]], 0, 4) + MUTATE(2, [[100, 1, 0x42]], 0, 3))
w('datagram', 'roam_tcp', hs + P_TUN(0, 8) + DELIVER_G(0, 170) + P_TUN(1, 8) + DELIVER_G(0, 210)
  + G_TUN() + DELIVER_P + DELIVER_G() + P_TUN(0, 3) + DELIVER_G(0, 240))
w('datagram', 'late_genuine', P_TUN() + P_FORCE + P_FORCE + DELIVER_G(201, 0) + DELIVER_P
  + DELIVER_G(0, 230) + DELIVER_G() + DELIVER_G() + REPLAY(1, 5))
w('datagram', 'g_initiates_cookie', G_TUN() + G_TUN(1) + COOKIE(0, 0) + COOKIE(1, 3)
  + FORGE(True, 0, b'\x11' * 48, 0) + FORGE(True, 1, b'', 4) + DELIVER_P + DELIVER_G()
  + FORGE(False, 0, b'\x22' * 108, 1) + COOKIE(0, 2))
w('datagram', 'flood_then_cookie', hs + DELIVER_G() + FLOOD(255, True) + P_FORCE + DELIVER_G() + DELIVER_P
  + P_FORCE + DELIVER_G() + DELIVER_P + P_TUN() + DELIVER_G() + DELIVER_G() + TIMERS(5)
  + FLOOD(30, False, False, 1))
w('datagram', 'forged_responses', G_TUN() + FORGE(True, 0) + FORGE(True, 0, b'', 3, True)
  + FLOOD(20, False) + DELIVER_P + DELIVER_G() + FORGE(True, 0) + REPLAY(0, 2))
# The raw-datagram seeds of the earlier one-message target, as RAW ops around a handshake.
import subprocess
for name in ['ipv4', 'type1_148', 'type2_92', 'type3_64', 'type4_200', 'type4_32']:
    old = subprocess.run(['git', '-C', root, 'show', '9c8dcf5:fuzz/seeds/datagram/' + name],
                         check=True, capture_output=True).stdout
    w('datagram', name, RAW(old[:255], 0) + hs + RAW(old[:255], 3) + G_RAW_TUN(old[:254]))

# ---- coalesce: descriptors (see fuzz/src/coalesce.rs, build) ----
def tcp(v6=False, flow=0, noopt=False, plensel=0, step=0, flags=0, corrupt=None, extra=()):
    kind = (1 if v6 else 0) | (flow << 2) | (0x10 if noopt else 0)
    out = [kind, plensel] + list(extra) + [step]
    if not v6 and step & 0x10: out += [0x33]
    if step & 3 == 2: out += [5]
    out += [flags]
    if step & 0x80: out += [0x20]
    out += corrupt if corrupt else [0]
    return out
def udpd(v6=False, flow=0, plensel=0, step=0, corrupt=None, extra=()):
    kind = 2 | (1 if v6 else 0) | (flow << 2)
    out = [kind, plensel] + list(extra) + [step]
    if not v6 and step & 0x10: out += [0x33]
    return out + (corrupt if corrupt else [0])
w('coalesce', 'tcp4_train', [0] + sum([tcp() for _ in range(6)], []) + tcp(flags=210))
w('coalesce', 'tcp6_train_short_last', [0] + sum([tcp(True) for _ in range(5)], []) + tcp(True, plensel=160, extra=[50]))
w('coalesce', 'udp_both', [0] + sum([udpd() for _ in range(4)], []) + sum([udpd(True, 1) for _ in range(4)], []) + udpd(plensel=200, extra=[7]))
w('coalesce', 'interleaved', [0] + sum([tcp(False, 0) + tcp(False, 1) + tcp(True, 2) for _ in range(4)], []))
w('coalesce', 'rules', [0] + tcp() + tcp(step=2) + tcp() + tcp(step=0x80) + tcp(step=0x04) + tcp(flags=0x19)
  + tcp(step=0x20) + tcp(step=0x10) + tcp(step=0x08) + tcp() + tcp(noopt=True) + tcp(step=3))
w('coalesce', 'corrupt', [0] + tcp() + tcp(corrupt=[0xf0, 0, 10, 0x99]) + tcp(corrupt=[0xf1, 0, 5, 7])
  + tcp(corrupt=[0xf0, 0, 45, 1]) + tcp() + udpd() + udpd(corrupt=[0xf0, 0, 26, 0]) + [0xe0, 5] + [0x45] * 20)
w('coalesce', 'big', [1] + sum([udpd(plensel=240, extra=[0x0f, 0xa0]) for _ in range(3)], [])
  + sum([tcp(plensel=240, extra=[0x20, 0x00]) for _ in range(12)], []))
w('coalesce', 'opts_off', [3] + sum([tcp() for _ in range(3)], []) + sum([udpd() for _ in range(3)], []))

# ---- udp_cmsg (see fuzz/src/sys.rs, control + check_cmsg) ----
def cm_gro(v=1376): return [0, 0, 250] + list(struct.pack('<i', v))
def cm_pi4(): return [1, 0] + [2, 0, 0, 0, 10, 0, 0, 1, 10, 0, 0, 1]
def cm_pi6(mapped=False):
    a = [0] * 10 + [0xff, 0xff, 192, 0, 2, 1] if mapped else [0x20, 1, 0xd, 0xb8] + [0] * 11 + [1]
    return [2, 0] + a + [3, 0, 0, 0]
def cm_seg(): return [3, 0, 0xb0, 0x04]
def tail(len_=(0x10, 0), fl=0x40, a=5, seg=200, spec=0x11, pk=(1, 2, 3)):
    return list(len_) + [fl, a, seg, spec] + list(pk)
sa4 = [2, 0, 0xca, 0x6c, 192, 0, 2, 1] + [0] * 8
sa6 = [10, 0, 0xca, 0x6c, 0, 0, 0, 0] + [0x20, 1, 0xd, 0xb8] + [0] * 11 + [1] + [0] * 4
w('udp_cmsg', 'gro_pktinfo4', [2] + cm_gro() + cm_pi4() + tail() + sa4)
w('udp_cmsg', 'pktinfo6_gro', [2] + cm_pi6() + cm_gro(1200) + tail((0x30, 0), 0x80, 7, 130, 0x12, (9, 9)) + sa6)
w('udp_cmsg', 'mapped_seg', [3] + cm_seg() + cm_pi6(True) + cm_gro(65535) + tail((0, 0), 0x41, 0, 255, 0x0f) + sa4)
w('udp_cmsg', 'lies', [3] + [0, 210, 3, 0, 250, 0xb0, 4, 0, 0] + cm_pi4() + [0, 230, 2, 0, 250, 1, 0, 0, 0] + tail() + sa6)
w('udp_cmsg', 'huge_len_second', [2] + cm_pi4() + [0, 225, 15, 250, 0xb0, 4, 0, 0] + tail())
w('udp_cmsg', 'raw', [0x80, 32] + list(struct.pack('<Qii', 20, 17, 104)) + [0xb0, 4, 0, 0] + [0] * 4 + list(struct.pack('<Qii', 99, 0, 8)) + tail())
w('udp_cmsg', 'bad_gro_values', [2] + [0, 0, 240, 0, 0, 0, 0] + [4, 0, 2, 1, 2] + tail((0, 100), 2))

# ---- uring_recv (see fuzz/src/sys.rs, check_uring_recv) ----
def ur(mode=0, namesel=0, name=(0xca, 0x6c, 5), control=(0,), payload=b'', extra=()):
    out = [mode, namesel] + list(name) + list(control) + list(struct.pack('>H', len(payload))) + list(payload) + list(extra)
    return out
w('uring_recv', 'v4_gro', ur(0, 0, (0xca, 0x6c, 5), [1] + cm_gro(100), bytes(range(256)) * 2))
w('uring_recv', 'v6_pktinfo', ur(0, 1, (2,), [2] + cm_pi6() + cm_gro(1200), b'\x04' * 1500))
w('uring_recv', 'mapped_plain', ur(0, 1, (3,), [0], b'\x01' * 148))
w('uring_recv', 'truncated_flag', ur(2, 0, (0, 1, 1), [1] + cm_pi4(), b'x' * 64))
w('uring_recv', 'lying_header', ur(0x40, 3, (30,) + tuple(range(30)), [1] + cm_gro(), b'y' * 100,
   list(struct.pack('<III', 500, 1 << 31, 0xffffffff))))
w('uring_recv', 'short_buffer', ur(4, 0, (0, 2, 3), [0], b'z' * 10, [90]))
raw = list(struct.pack('<IIII', 16, 24, 30, 0)) + [2, 0, 0, 53, 10, 0, 0, 1] + [0] * 120 + list(struct.pack('<Qii', 20, 17, 104)) + [8, 0, 0, 0] + [0] * 44 + [0x42] * 30
w('uring_recv', 'raw', [0x80] + raw)
