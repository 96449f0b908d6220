#!/usr/bin/env python3
"""Drive the appliance's two consoles in QEMU at once (ci/test-console2-qemu.sh).

The serial line (ttyS0) is image/qemu.sh's FIFO + log file; the second console is a
virtio console (hvc0 in the guest, standing in for a box's screen and keyboard, tty1)
on a QEMU socket chardev; QMP injects NMIs, whose "NMI received for unknown reason"
is a KERN_EMERG printk from the guest kernel.

Prints PASS/FAIL lines (the shell harness counts them) and `     ` notes; exits 0.
Every wait has a deadline; nothing here sleeps to assert anything.
"""
import json
import os
import re
import socket
import sys
import threading
import time

# No `$`: the daemon's and init's lines may follow a prompt on the serial line.
PROMPT = r"(riceguard(\(edit\))?# |Password: )"
KERNEL_TEXT = re.compile(r"NMI received|Uhhuh|Dazed and confused|^\[ *\d+\.\d+\] ", re.M)


class Line:
    """One console: what it printed so far (CRs dropped), and a way to type."""

    def __init__(self, name):
        self.name = name
        self.buf = ""
        self.lock = threading.Lock()

    def text(self, since=0):
        with self.lock:
            return self.buf[since:]

    def mark(self):
        with self.lock:
            return len(self.buf)

    def add(self, s):
        with self.lock:
            self.buf += s.replace("\r", "")

    def wait(self, regex, secs, since=0):
        r = re.compile(regex, re.M)
        end = time.monotonic() + secs
        while time.monotonic() < end:
            m = r.search(self.text(since))
            if m:
                return m
            time.sleep(0.1)
        return None


class Serial(Line):
    def __init__(self, fifo, log):
        super().__init__("ttyS0")
        self.fd = os.open(fifo, os.O_RDWR)
        self.log = log
        self.pos = 0
        threading.Thread(target=self._tail, daemon=True).start()

    def _tail(self):
        while True:
            try:
                with open(self.log, "rb") as f:
                    f.seek(self.pos)
                    b = f.read()
            except OSError:
                b = b""
            if b:
                self.pos += len(b)
                self.add(b.decode("utf-8", "replace"))
            time.sleep(0.05)

    def type(self, s):
        os.write(self.fd, s.encode())


class Virtio(Line):
    def __init__(self, path, secs):
        super().__init__("hvc0")
        self.sock = connect(path, secs)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                b = self.sock.recv(4096)
            except OSError:
                return
            if not b:
                return
            self.add(b.decode("utf-8", "replace"))

    def type(self, s):
        self.sock.sendall(s.encode())


def connect(path, secs):
    end = time.monotonic() + secs
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


class Qmp:
    def __init__(self, path, secs):
        self.sock = connect(path, secs)
        self.f = self.sock.makefile("rwb", buffering=0)
        self.f.readline()  # greeting
        self.call("qmp_capabilities")

    def call(self, cmd):
        self.f.write(json.dumps({"execute": cmd}).encode() + b"\n")
        while True:
            r = json.loads(self.f.readline())
            if "return" in r or "error" in r:
                return r


results = {"fail": 0}


def check(name, cond, detail=""):
    if cond:
        print(f"PASS {name}", flush=True)
    else:
        results["fail"] += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""), flush=True)
    return cond


def note(s):
    print(f"     {s}", flush=True)


def cmd(con, line, secs=30, regex=PROMPT, echo=True):
    """Type LINE, wait for the next prompt; the answer (echo and prompt included).
    echo=False: a password, which the console does not echo."""
    m = con.mark()
    con.type(line + "\r")
    if echo:
        # The echo comes first; the prompt we want is the one after it.
        e = con.wait(re.escape(line), secs, m)
        m2 = m + (e.end() if e else 0)
    else:
        m2 = m + 1
    con.wait(regex, secs, m2)
    return con.text(m)


def main():
    fifo, log, hvc, qmp_path, transcript = sys.argv[1:6]
    T = int(os.environ.get("RG_CONSOLE_TIMEOUT", "180"))
    t0 = time.monotonic()
    serial = Serial(fifo, log)
    virtio = Virtio(hvc, 30)
    qmp = Qmp(qmp_path, 30)
    pw = "rgt-two-consoles"
    try:
        run(serial, virtio, qmp, pw, T, t0)
        print("DONE", flush=True)
    except Exception as e:  # reported as a failure, never a silent pass
        check("the two-console driver ran to its end", False, repr(e))
    finally:
        with open(transcript, "w") as f:
            f.write("==== ttyS0 (serial)\n" + serial.text() + "\n==== hvc0 (virtio console)\n" + virtio.text())
    note(f"two-console run took {time.monotonic() - t0:.0f} s")


def run(serial, virtio, qmp, pw, T, t0):
    # The trigger is real: before the consoles run, an NMI's KERN_EMERG line reaches the
    # serial line at the board's `quiet loglevel=4`.
    if serial.wait(r"riceguard-init: ", T):
        qmp.call("inject-nmi")
        check("an NMI before the consoles start prints its kernel message on the serial line",
              serial.wait(r"NMI received", 30))
    # Failsafe prompt on both; answered on the second console.
    if not check("failsafe prompt on the second console (hvc0)",
                 virtio.wait(r"press f and Enter within", T)):
        return
    check("failsafe prompt on the serial line too", serial.wait(r"press f and Enter within", 10))
    virtio.type("f\r")
    check("failsafe: hvc0 is told it won", virtio.wait(r"failsafe mode \(chosen on hvc0", 20))
    check("failsafe: the serial line is told hvc0 chose it",
          serial.wait(r"riceguard-init: failsafe mode \(chosen on hvc0", 20))
    check("failsafe: init starts the gateway with no peers",
          serial.wait(r"riceguard-init: failsafe: the gateway starts with no peers", 20))
    quiet = serial.wait(r"riceguard-init: kernel messages kept off the consoles", T)
    check("init lowers the kernel's console log level before the consoles start", quiet)
    after = quiet.end() if quiet else serial.mark()
    if not (serial.wait(r"riceguard-init: (boot marked good|FATAL)", T)
            and serial.wait(PROMPT, 30, after) and virtio.wait(PROMPT, 30)):
        check("console prompt on both lines", False, serial.text()[-800:])
        return
    note(f"both console prompts after {time.monotonic() - t0:.0f} s")

    # The same password on both: set on the serial line, then both log in again.
    out = cmd(serial, "set system console-password", 60, r"New console password: ")
    out = cmd(serial, pw, 60, r"Repeat the new password: ", echo=False)
    out = cmd(serial, pw, 120, echo=False)
    check("console password set on ttyS0", "error" not in out.split(pw)[-1], out[-300:])
    for con in (virtio, serial):
        m = con.mark()
        con.type("exit\r")
        if not check(f"{con.name}: a new session asks for the password",
                     con.wait(r"Password: ", 60, m)):
            continue
        out = cmd(con, "not-the-password", 120, echo=False)
        check(f"{con.name}: a wrong password is refused", "riceguard# " not in out, out[-300:])
        m = con.mark()
        if "Password: " not in out:
            con.wait(r"Password: ", 60, m)
        out = cmd(con, pw, 120, echo=False)
        check(f"{con.name}: logged in with the password set on ttyS0",
              "riceguard# " in out, out[-300:])

    # Two edits at once: each console has its own candidate; the second commit is refused
    # and names the console that committed.
    cmd(serial, "set interface listen-port 51000")
    cmd(virtio, "set interface mtu 1300")
    out = cmd(serial, "commit", 60)
    check("two edits: ttyS0 commits first", "committed and saved" in out, out[-400:])
    out = cmd(virtio, "commit", 60)
    check("two edits: hvc0's commit is refused, naming ttyS0 and what to do",
          "console ttyS0 committed" in out and "`discard`" in out and "`compare`" in out, out[-500:])
    out = cmd(virtio, "compare")
    check("two edits: hvc0 keeps its edit until it discards", "1300" in out, out[-300:])
    out = cmd(virtio, "discard")
    check("two edits: discard reloads ttyS0's commit", "reloaded" in out, out[-300:])
    cmd(virtio, "set interface mtu 1300")
    out = cmd(virtio, "commit", 60)
    check("two edits: hvc0 redoes its edit and commits", "committed and saved" in out, out[-400:])
    out = cmd(serial, "discard")
    out = cmd(serial, "show")
    check("two edits: both changes are saved",
          "ListenPort = 51000" in out and "MTU = 1300" in out, out[-600:])

    # commit-confirm from hvc0; what ttyS0 sees and may do.
    cmd(virtio, "set interface listen-port 51001")
    out = cmd(virtio, "commit-confirm 1", 60)
    check("commit-confirm made on hvc0", "rolls back in 1 min" in out, out[-300:])
    out = cmd(serial, "show status", 30)
    check("ttyS0's show status names the pending commit-confirm and hvc0",
          "commit-confirm: pending, made on hvc0" in out, out[-500:])
    cmd(serial, "set interface mtu 1280")
    out = cmd(serial, "commit", 60)
    check("ttyS0 cannot commit over hvc0's pending commit-confirm",
          "commit-confirm made on hvc0 is pending" in out, out[-400:])
    cmd(serial, "discard")
    m = virtio.mark()
    out = cmd(serial, "confirm", 30)
    check("ttyS0 may confirm it", "confirmed the commit-confirm made on hvc0" in out, out[-300:])
    check("hvc0 is told it was confirmed from ttyS0",
          virtio.wait(r"confirmed from another console \(ttyS0\)", 20, m))

    # No kernel text on the console lines once they run: an NMI now is held back. A round
    # trip on each console after it orders the check after the kernel's print.
    r = qmp.call("inject-nmi")
    check("QMP inject-nmi accepted", "return" in r, str(r))
    cmd(serial, "show status", 30)
    cmd(virtio, "show status", 30)
    bad_serial = KERNEL_TEXT.findall(serial.text(after))
    bad_virtio = KERNEL_TEXT.findall(virtio.text())
    check("no kernel message text on the serial console's lines after the console started",
          not bad_serial, str(bad_serial[:3]))
    check("no kernel message text on hvc0's lines", not bad_virtio, str(bad_virtio[:3]))
    # ci/lib/qemu.sh's QEMU_PANIC_RE, passed by ci/test-console2-qemu.sh: one definition.
    check("no kernel panic/oops", not re.search(os.environ["QEMU_PANIC_RE"], serial.text()))


if __name__ == "__main__":
    main()
