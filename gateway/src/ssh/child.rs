//! A session's console: `riceguard console --root DIR --name ssh-N:KEY --authenticated
//! ssh` as a child process, on a pseudo-terminal (interactive) or on pipes (a command or
//! a script). Its output goes to the SSH channel, the channel's data to its input; when it
//! exits, its status is the channel's exit status. Dropping a [`Console`] kills the
//! child's process group and reaps it (the channel closed, the connection ended).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use russh::server::Handle;
use russh::ChannelId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How the console runs.
pub enum Mode {
    /// On a pseudo-terminal of this size (columns, rows), `TERM` set to the client's.
    Pty { cols: u16, rows: u16, term: String },
    /// On pipes; `Some(cmd)`: the command (an `exec` request) is its whole input.
    Pipes { command: Option<Vec<u8>> },
}

/// The most of the channel's data queued for a console that does not read it: beyond
/// that its input is cut (a script that large is not typed by anyone). The queue must not
/// make the connection wait: the console may be blocked writing output that the same
/// connection carries.
pub const MAX_QUEUED: usize = 1 << 20;

pub struct Console {
    pid: Pid,
    /// `None` once reaped.
    child: Arc<Mutex<Option<Child>>>,
    input: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes in `input` not yet written to the console.
    queued: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

fn set_nonblocking_cloexec(fd: &OwnedFd) -> io::Result<()> {
    let fl = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// Which console to run: `bin console --root ROOT --name NAME --authenticated ssh
/// --source SOURCE EXTRA...`.
pub struct Launch<'a> {
    pub bin: &'a Path,
    pub root: &'a Path,
    /// The session's name, `ssh-N:KEY`.
    pub name: &'a str,
    /// The session's peer address.
    pub source: std::net::IpAddr,
    /// More arguments (`--pidfile` etc. in tests).
    pub extra: &'a [String],
}

impl Console {
    /// Start the console `l` says and connect it to `channel`.
    pub fn start(
        l: &Launch<'_>,
        mode: Mode,
        handle: Handle,
        channel: ChannelId,
    ) -> io::Result<Console> {
        let Launch {
            bin,
            root,
            name,
            source,
            extra,
        } = *l;
        let mut cmd = Command::new(bin);
        cmd.arg("console")
            .arg("--root")
            .arg(root)
            .arg("--name")
            .arg(name)
            .arg("--authenticated")
            .arg("ssh")
            .arg("--source")
            .arg(source.to_string())
            .args(extra);
        let (out, pty_input, exec) = match mode {
            Mode::Pty { cols, rows, term } => {
                let ws = nix::pty::Winsize {
                    ws_row: rows.max(1),
                    ws_col: cols.max(1),
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                let pty = nix::pty::openpty(Some(&ws), None).map_err(io::Error::from)?;
                // Neither end leaks into other sessions' consoles (the child gets the
                // slave as 0, 1, 2: dup2 clears the flag on those).
                set_nonblocking_cloexec(&pty.master)?;
                fcntl(&pty.slave, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
                let slave = File::from(pty.slave);
                cmd.stdin(Stdio::from(slave.try_clone()?))
                    .stdout(Stdio::from(slave.try_clone()?))
                    .stderr(Stdio::from(slave))
                    .env(
                        "TERM",
                        if term.is_empty() {
                            "vt100".into()
                        } else {
                            term
                        },
                    );
                crate::sys::os::new_session(&mut cmd, true);
                // Read and written through two descriptors of the one master.
                let writer = pty.master.try_clone()?;
                (
                    pipe::Receiver::from_owned_fd_unchecked(pty.master)?,
                    Some(pipe::Sender::from_owned_fd_unchecked(writer)?),
                    None,
                )
            }
            Mode::Pipes { command } => {
                // stdout and stderr on one pipe: the client sees them in the order written.
                let (r, w) = std::io::pipe()?;
                cmd.stdin(Stdio::piped())
                    .stdout(Stdio::from(w.try_clone()?))
                    .stderr(Stdio::from(w));
                crate::sys::os::new_session(&mut cmd, false);
                let r = OwnedFd::from(r);
                set_nonblocking_cloexec(&r)?;
                (pipe::Receiver::from_owned_fd_unchecked(r)?, None, command)
            }
        };
        let mut child = cmd.spawn()?;
        drop(cmd); // our copies of the child's ends: EOF reaches us when it exits
        let inp = match (pty_input, child.stdin.take()) {
            (Some(master), _) => master,
            (None, Some(stdin)) => {
                let fd = OwnedFd::from(stdin);
                set_nonblocking_cloexec(&fd)?;
                pipe::Sender::from_owned_fd_unchecked(fd)?
            }
            (None, None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other("the console has no input pipe"));
            }
        };
        let pid = Pid::from_raw(child.id() as i32);
        let child = Arc::new(Mutex::new(Some(child)));
        let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![tokio::spawn(write_input(inp, rx, Arc::clone(&queued)))];
        tasks.push(tokio::spawn(pump_output(
            out,
            Arc::clone(&child),
            handle,
            channel,
        )));
        let mut c = Console {
            pid,
            child,
            input: Some(tx),
            queued,
            tasks,
        };
        if let Some(mut line) = exec {
            line.push(b'\n');
            if let Some(tx) = c.input.take() {
                // The command, then end of input (dropping `tx`).
                c.queued.fetch_add(line.len(), Ordering::Relaxed);
                let _ = tx.send(line);
            }
        }
        Ok(c)
    }

    /// Data from the channel, for the console's input. `false`: more than [`MAX_QUEUED`]
    /// would wait, so the input was cut here (the console sees its end).
    pub fn input(&mut self, data: &[u8]) -> bool {
        let Some(tx) = &self.input else {
            return true;
        };
        if self.queued.load(Ordering::Relaxed) + data.len() > MAX_QUEUED {
            self.input = None;
            return false;
        }
        self.queued.fetch_add(data.len(), Ordering::Relaxed);
        let _ = tx.send(data.to_vec());
        true
    }

    /// The channel's end of input: the console's stdin is closed (on pipes; a terminal's
    /// end is the channel's close).
    pub fn end_input(&mut self, pty: bool) {
        if !pty {
            self.input = None;
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut c) = g.take() {
            if matches!(c.try_wait(), Ok(None)) {
                // Still running: the whole group (the console is its leader, after setsid).
                let _ = killpg(self.pid, Signal::SIGKILL);
                let _ = c.wait();
                log::info!(
                    "ssh: session console (pid {}) ended with its channel",
                    self.pid
                );
            }
        }
    }
}

async fn write_input(
    mut to: pipe::Sender,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    queued: Arc<AtomicUsize>,
) {
    while let Some(buf) = rx.recv().await {
        if to.write_all(&buf).await.is_err() {
            return; // the console is gone
        }
        queued.fetch_sub(buf.len(), Ordering::Relaxed);
    }
    // End of input: dropping `to` closes the pipe's write end (the console reads EOF).
}

async fn pump_output(
    mut from: pipe::Receiver,
    child: Arc<Mutex<Option<Child>>>,
    handle: Handle,
    channel: ChannelId,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if handle.data(channel, buf[..n].to_vec()).await.is_err() {
                    return; // the connection is gone; Drop kills the console
                }
            }
            // EIO: a terminal's last slave end closed (the console exited).
            Err(_) => break,
        }
    }
    drop(from);
    // The output ended: the console exited (or is about to). Its status for the channel.
    let code = loop {
        let st = {
            let mut g = child.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(st))) => {
                    g.take();
                    Some(st)
                }
                Some(Ok(None)) => None,
                _ => return,
            }
        };
        match st {
            Some(st) => {
                use std::os::unix::process::ExitStatusExt;
                break st
                    .code()
                    .or_else(|| st.signal().map(|s| 128 + s))
                    .unwrap_or(255);
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let _ = handle.exit_status_request(channel, code as u32).await;
    let _ = handle.eof(channel).await;
    let _ = handle.close(channel).await;
}
