//! The SSH server: the accept loop (source check, admission, the login grace) and the
//! per-connection [`Handler`] (public keys only, login name `admin`, a console per
//! session channel).

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::server::{Auth, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, MethodKind, MethodSet, Pty};

use super::admission::{Admission, Refusal};
use super::child::{Console, Launch, Mode};
use crate::core::config::SshKey;

/// The login name every key logs in as.
pub const LOGIN_NAME: &str = "admin";
/// A connection that has not logged in by then is closed (sshd's `LoginGraceTime`).
pub const LOGIN_GRACE: Duration = Duration::from_secs(20);

/// Whether a peer address may connect at all (asked right after accept).
pub type SourceCheck = Arc<dyn Fn(IpAddr) -> Result<(), String> + Send + Sync>;

/// What every connection of one server shares.
pub struct Shared {
    /// The perm directory: saved configuration (keys), the consoles' `--root`.
    pub root: PathBuf,
    /// This binary, run as `console` for each session.
    pub bin: PathBuf,
    /// More arguments for each console (`--pidfile` etc. in tests).
    pub console_args: Vec<String>,
    pub source_allowed: SourceCheck,
    /// The keys, read from the saved configuration at each login.
    pub keys: Box<dyn Fn() -> Vec<SshKey> + Send + Sync>,
    /// The server's settings with the host key: swapped when the key on perm changes.
    config: Mutex<Arc<russh::server::Config>>,
    admission: Mutex<Admission>,
    /// The logged-in connections, by connection number: ended when their key goes.
    live: Mutex<HashMap<u64, Live>>,
    next_conn: AtomicU64,
    /// Session numbers: unique per run, and from the pid up, across restarts.
    next_session: AtomicU64,
    refused_sources: AtomicU64,
    refused_busy: AtomicU64,
}

impl Shared {
    pub fn new(
        root: PathBuf,
        bin: PathBuf,
        console_args: Vec<String>,
        source_allowed: SourceCheck,
        keys: Box<dyn Fn() -> Vec<SshKey> + Send + Sync>,
        config: Arc<russh::server::Config>,
    ) -> Shared {
        Shared {
            root,
            bin,
            console_args,
            source_allowed,
            keys,
            config: Mutex::new(config),
            admission: Mutex::new(Admission::default()),
            live: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            next_session: AtomicU64::new(u64::from(std::process::id()) * 10_000),
            refused_sources: AtomicU64::new(0),
            refused_busy: AtomicU64::new(0),
        }
    }

    fn admission(&self) -> std::sync::MutexGuard<'_, Admission> {
        self.admission.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The settings new connections get.
    pub fn config(&self) -> Arc<russh::server::Config> {
        Arc::clone(&self.config.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// New connections present `config`'s host key; logged-in ones keep theirs.
    pub fn set_config(&self, config: Arc<russh::server::Config>) {
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
    }

    /// End every logged-in connection whose key is no longer one of `keys` (deleted, or
    /// its name given another key): a removed key locks its holder out now, not at their
    /// next login. Their consoles end with them (uncommitted edits dropped, as at `exit`).
    /// Says who was ended, a line each.
    pub fn end_revoked(&self, keys: &[SshKey]) -> Vec<String> {
        let mut said = Vec::new();
        self.live().retain(|_, l| {
            let kept = keys
                .iter()
                .any(|k| k.name == l.key_name && k.key.blob() == l.blob.as_slice());
            if !kept {
                // Both ways: russh's reader sees the end at once, whatever it waits for.
                let _ = l.sock.shutdown(Shutdown::Both);
                said.push(format!(
                    "ssh: the session of key {} from {} ended: the key is no longer in the saved configuration",
                    l.key_name, l.ip
                ));
            }
            kept
        });
        said
    }

    /// How many connections are logged in.
    pub fn logged_in(&self) -> usize {
        self.live().len()
    }
}

/// A logged-in connection: which key it logged in with, and a handle on its socket.
struct Live {
    key_name: String,
    blob: Vec<u8>,
    ip: IpAddr,
    sock: std::net::TcpStream,
}

/// The server's settings: publickey only, rejections slowed, no idle limit for a
/// logged-in console (keepalives find dead clients instead).
pub fn russh_config(host_key: russh::keys::PrivateKey) -> russh::server::Config {
    russh::server::Config {
        server_id: russh::SshId::Standard("SSH-2.0-riceguard".into()),
        methods: MethodSet::from(&[MethodKind::PublicKey][..]),
        auth_rejection_time: Duration::from_secs(1),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![host_key],
        max_auth_attempts: 6,
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_max: 3,
        nodelay: true,
        ..Default::default()
    }
}

/// Accept connections on `listener` until the task is aborted. Each one is checked
/// against the source rule and the admission limits, then served on its own task.
pub async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log::warn!("ssh: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = peer.ip().to_canonical();
        if let Err(why) = (shared.source_allowed)(ip) {
            let n = shared.refused_sources.fetch_add(1, Ordering::Relaxed) + 1;
            drop(sock);
            log::warn!(target: "net::ssh-source", "ssh: connection from {ip} refused: not a source SSH is open to: {why} ({n} refused so far)");
            continue;
        }
        if let Err(why) = shared.admission().admit(ip) {
            let n = shared.refused_busy.fetch_add(1, Ordering::Relaxed) + 1;
            drop(sock);
            log::warn!(target: "net::ssh-busy", "ssh: connection from {ip} closed: {why} ({n} closed so far)");
            continue;
        }
        let slot = Slot {
            shared: Arc::clone(&shared),
            ip,
            logged_in: false,
        };
        tokio::spawn(serve(sock, peer, slot));
    }
}

/// A connection's place in the [`Admission`] counts, given back when it ends.
struct Slot {
    shared: Arc<Shared>,
    ip: IpAddr,
    logged_in: bool,
}

impl Slot {
    fn login(&mut self) -> Result<(), Refusal> {
        if !self.logged_in {
            self.shared.admission().login(self.ip)?;
            self.logged_in = true;
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut a = self.shared.admission();
        if self.logged_in {
            a.logout();
        } else {
            a.leave(self.ip);
        }
    }
}

async fn serve(sock: tokio::net::TcpStream, peer: SocketAddr, slot: Slot) {
    // A second handle on the socket: shutting it down ends the connection whatever the
    // session is waiting for (a client that sends nothing, a full send buffer).
    let std_sock = match sock.into_std() {
        Ok(s) => s,
        Err(_) => return,
    };
    let killer = std_sock.try_clone();
    let sock = match tokio::net::TcpStream::from_std(std_sock) {
        Ok(s) => s,
        Err(_) => return,
    };
    let logged_in = Arc::new(AtomicBool::new(false));
    let shared = Arc::clone(&slot.shared);
    let handler = Conn {
        shared: Arc::clone(&shared),
        peer: SocketAddr::new(slot.ip, peer.port()),
        id: shared.next_conn.fetch_add(1, Ordering::Relaxed),
        sock: killer.as_ref().ok().and_then(|k| k.try_clone().ok()),
        slot,
        logged_in: Arc::clone(&logged_in),
        key_name: None,
        channels: HashMap::new(),
    };
    let config = shared.config();
    let session = async move {
        match russh::server::run_stream(config, sock, handler).await {
            Ok(s) => {
                let _ = s.await;
            }
            Err(e) => log::debug!("ssh: connection setup: {e}"),
        }
    };
    tokio::pin!(session);
    tokio::select! {
        _ = &mut session => return,
        _ = tokio::time::sleep(LOGIN_GRACE) => {}
    }
    if !logged_in.load(Ordering::Relaxed) {
        log::info!(target: "net::ssh-grace", "ssh: {} did not log in within {} s: closed", peer.ip().to_canonical(), LOGIN_GRACE.as_secs());
        if let Ok(k) = &killer {
            let _ = k.shutdown(Shutdown::Both);
        }
    }
    session.await;
}

/// One connection.
struct Conn {
    shared: Arc<Shared>,
    peer: SocketAddr,
    /// This connection's number in [`Shared::live`].
    id: u64,
    /// A handle on the socket, kept in [`Shared::live`] once logged in.
    sock: Option<std::net::TcpStream>,
    slot: Slot,
    logged_in: Arc<AtomicBool>,
    /// The key's name once logged in.
    key_name: Option<String>,
    channels: HashMap<ChannelId, Chan>,
}

#[derive(Default)]
struct Chan {
    /// From a `pty-req`: columns, rows, TERM.
    pty: Option<(u16, u16, String)>,
    console: Option<Console>,
}

fn reject_publickey() -> Auth {
    Auth::Reject {
        proceed_with_methods: Some(MethodSet::from(&[MethodKind::PublicKey][..])),
        partial_success: false,
    }
}

impl Conn {
    /// The configured key whose blob `key` is, if `user` is the login name. Logs a
    /// refusal.
    fn check(&self, user: &str, key: &russh::keys::PublicKey) -> Option<SshKey> {
        let ip = self.peer.ip();
        let blob = key.to_bytes().unwrap_or_default();
        let fp = crate::core::ssh_key::fingerprint(&blob);
        if user != LOGIN_NAME {
            log::warn!(
                "ssh: login as `{}` from {ip} refused (key {fp}): the login name is {LOGIN_NAME}",
                crate::console::validate::short(user)
            );
            return None;
        }
        let found = (self.shared.keys)()
            .into_iter()
            .find(|k| k.key.blob() == blob.as_slice());
        if found.is_none() {
            log::warn!(
                "ssh: key {fp} ({}) from {ip} refused: not a configured key",
                key.algorithm().as_str()
            );
        }
        found
    }

    fn start_console(
        &mut self,
        channel: ChannelId,
        exec: Option<Vec<u8>>,
        session: &mut Session,
    ) -> bool {
        let Some(key) = self.key_name.clone() else {
            return false;
        };
        let Some(chan) = self.channels.get_mut(&channel) else {
            return false;
        };
        if chan.console.is_some() {
            return false;
        }
        let n = self.shared.next_session.fetch_add(1, Ordering::Relaxed);
        let name = format!("ssh-{n}:{key}");
        let mode = match (&chan.pty, &exec) {
            (Some((cols, rows, term)), None) => Mode::Pty {
                cols: *cols,
                rows: *rows,
                term: term.clone(),
            },
            _ => Mode::Pipes { command: exec },
        };
        let how = match &mode {
            Mode::Pty { .. } => "terminal",
            Mode::Pipes { command: Some(_) } => "command",
            Mode::Pipes { command: None } => "script",
        };
        let launch = Launch {
            bin: &self.shared.bin,
            root: &self.shared.root,
            name: &name,
            source: self.peer.ip(),
            extra: &self.shared.console_args,
        };
        match Console::start(&launch, mode, session.handle(), channel) {
            Ok(c) => {
                log::info!("ssh: console {name} ({how}) for {}", self.peer.ip());
                chan.console = Some(c);
                true
            }
            Err(e) => {
                log::error!("ssh: cannot start a console for {}: {e}", self.peer.ip());
                false
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.live().remove(&self.id);
    }
}

impl russh::server::Handler for Conn {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(reject_publickey())
    }

    async fn auth_password(&mut self, user: &str, _password: &str) -> Result<Auth, Self::Error> {
        log::warn!(
            "ssh: password login as `{}` from {} refused: keys only",
            crate::console::validate::short(user),
            self.peer.ip()
        );
        Ok(reject_publickey())
    }

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(match self.check(user, offer.public_key) {
            Some(_) => Auth::Accept,
            None => reject_publickey(),
        })
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        let Some(k) = self.check(user, key.public_key) else {
            return Ok(reject_publickey());
        };
        if let Err(why) = self.slot.login() {
            log::warn!(
                "ssh: key {} ({}) from {} refused: {why}",
                k.key.fingerprint(),
                k.name,
                self.peer.ip()
            );
            return Ok(reject_publickey());
        }
        log::info!(
            "ssh: {} logged in from {} with key {} ({})",
            LOGIN_NAME,
            self.peer.ip(),
            k.name,
            k.key.fingerprint()
        );
        if let Some(sock) = self.sock.take() {
            self.shared.live().insert(
                self.id,
                Live {
                    key_name: k.name.clone(),
                    blob: k.key.blob().to_vec(),
                    ip: self.peer.ip(),
                    sock,
                },
            );
        }
        self.key_name = Some(k.name);
        self.logged_in.store(true, Ordering::Relaxed);
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.key_name.is_none() || self.channels.len() >= 4 {
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        // Requests arrive through this handler's methods: the channel object itself is
        // not read (dropping it keeps russh from queueing its messages for us).
        self.channels.insert(channel.id(), Chan::default());
        drop(channel);
        reply.accept().await;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn pty_request(
        &mut self,
        channel: ChannelId,
        term: &str,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.channels.get_mut(&channel) {
            Some(c) if c.console.is_none() => {
                let term: String = term
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    .take(32)
                    .collect();
                c.pty = Some((
                    u16::try_from(col_width).unwrap_or(80),
                    u16::try_from(row_height).unwrap_or(24),
                    term,
                ));
                session.channel_success(channel)?;
            }
            _ => session.channel_failure(channel)?,
        }
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let cols = u16::try_from(col_width).unwrap_or(u16::MAX);
        let rows = u16::try_from(row_height).unwrap_or(u16::MAX);
        if let Some(c) = self.channels.get_mut(&channel) {
            if let Some((w, h, _)) = c.pty.as_mut() {
                (*w, *h) = (cols, rows);
            }
            if let Some(con) = &c.console {
                con.resize(cols, rows);
            }
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.start_console(channel, None, session) {
            session.channel_success(channel)?;
        } else {
            session.channel_failure(channel)?;
        }
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.start_console(channel, Some(data.to_vec()), session) {
            session.channel_success(channel)?;
        } else {
            session.channel_failure(channel)?;
        }
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // No SFTP, no subsystems: the console is all there is.
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(c) = self
            .channels
            .get_mut(&channel)
            .and_then(|c| c.console.as_mut())
        {
            if !c.input(data) {
                log::warn!(
                    "ssh: {}: more than {} KiB of input the console has not read: its input is cut",
                    self.peer.ip(),
                    super::child::MAX_QUEUED / 1024
                );
            }
        }
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(c) = self.channels.get_mut(&channel) {
            let pty = c.pty.is_some();
            if let Some(con) = c.console.as_mut() {
                con.end_input(pty);
            }
        }
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Dropping the console kills it if it still runs.
        self.channels.remove(&channel);
        Ok(())
    }
}
