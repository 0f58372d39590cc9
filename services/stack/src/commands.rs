//! The verbs: `up`, `down`, `status`, `env`, `destroy`, `restart`, `crash`, `rotate`. Each takes
//! the name's lock (`.locks/<name>.lock`), so parallel invocations on one name are safe.
//!
//! `restart` stops one server of a running stack and starts it again on the same ports and data.
//! `crash` SIGKILLs it instead (Postgres: the postmaster and every backend at once, as a power cut
//! or the OOM killer would) and starts it again, so it comes back by crash recovery (chaos runs
//! use both). `rotate` makes new passwords and restarts the servers of a running stack with them.
//!
//! NATS may be a JetStream cluster (`SB_STACK_NATS_CLUSTER=3|5` at `up`, recorded in `ports`):
//! every verb then acts on every node, and `restart`/`crash` also take `nats-<i>`, node i alone.
use std::io::Write;
use std::str::FromStr;
use std::time::Instant;

use crate::binaries;
use crate::credentials::{self, Credentials};
use crate::env::{self, EnvInput};
use crate::layout::{Cache, Settings, StackPaths, fallback_base, up_ports, validate_name};
use crate::nats::check_prefixes;
use crate::nats_cluster::{self, CLUSTER_VAR};
use crate::pguser::PgUser;
use crate::pins::PG_PKG;
use crate::state::State;
use crate::sys::{self, Lock};
use crate::{Error, Result, log, warn};

/// What `restart` and `crash` act on: `nats` (every NATS node), `nats-<i>` (node i alone;
/// `nats-1` is a single server too) or `pg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Nats,
    NatsNode(u16),
    Pg,
}

impl FromStr for Server {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Server, String> {
        let node = s
            .strip_prefix("nats-")
            .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|i| i.parse::<u16>().ok())
            .filter(|i| *i >= 1);
        match (s, node) {
            ("nats", _) => Ok(Server::Nats),
            ("pg", _) => Ok(Server::Pg),
            (_, Some(i)) => Ok(Server::NatsNode(i)),
            _ => Err(format!(
                "'{s}' is none of nats (every NATS node), nats-<i> (NATS node i, from 1) and pg"
            )),
        }
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Server::Nats => f.write_str("nats"),
            Server::NatsNode(i) => write!(f, "nats-{i}"),
            Server::Pg => f.write_str("pg"),
        }
    }
}

/// One named stack, as a command sees it.
pub struct Stack {
    pub settings: Settings,
    pub cache: Cache,
    pub paths: StackPaths,
    /// The `ports` file (defaults when there is none yet).
    pub state: State,
    pub creds: Option<Credentials>,
    /// The system user Postgres runs as (when run as root).
    pub pg_user: Option<PgUser>,
    /// What this invocation started (NATS: the nodes, 1-based): a failing `up` stops it again.
    pub started_nats: Vec<u16>,
    pub started_pg: bool,
}

impl Stack {
    pub fn open(settings: &Settings, name: &str) -> Result<Stack> {
        validate_name(name)?;
        Ok(Stack {
            cache: Cache::new(&settings.root),
            paths: StackPaths::new(&settings.root, name),
            settings: settings.clone(),
            state: State::default(),
            creds: None,
            pg_user: None,
            started_nats: Vec::new(),
            started_pg: false,
        })
    }

    fn name(&self) -> &str {
        &self.paths.name
    }

    /// The name's lock (`.locks/<name>.lock`).
    fn lock(&self) -> Result<Lock> {
        sys::mkdir_p(&self.settings.root.join(".locks"))?;
        Lock::acquire(&self.paths.lock)
    }

    /// Read the `ports` file; false if there is none.
    fn load_state(&mut self) -> Result<bool> {
        let Some(state) = State::load(&self.paths.ports)? else {
            return Ok(false);
        };
        self.pg_user = match &state.pg_user {
            Some(user) => Some(PgUser::lookup(user).ok_or_else(|| {
                Error::failed(format!(
                    "user {user} (from {}) does not exist",
                    self.paths.ports.display()
                ))
            })?),
            None => None,
        };
        self.state = state;
        Ok(true)
    }

    fn never_up(&self) -> Error {
        Error::failed(format!(
            "stack '{}' has never been brought up (no {})",
            self.name(),
            self.paths.ports.display()
        ))
    }

    /// Read the secrets file; false if there is none yet.
    fn load_credentials(&mut self) -> Result<bool> {
        self.creds = Credentials::load(&self.paths.cred_file, self.name())?;
        Ok(self.creds.is_some())
    }

    /// New random passwords into the secrets file (replacing any).
    fn generate_credentials(&self) -> Result<()> {
        credentials::secure_dir(&self.paths.cred_dir)?;
        let secrets = Credentials::generate()?.render(self.name());
        sys::private_write(&self.paths.cred_file, &secrets)
    }

    /// The stack's credentials, generated on its first start, loaded.
    fn ensure_credentials(&mut self) -> Result<()> {
        if !self.paths.cred_file.is_file() {
            log!(
                "generating credentials for stack '{}' in {}/",
                self.name(),
                self.paths.cred_dir.display()
            );
            self.generate_credentials()?;
        }
        credentials::secure_dir(&self.paths.cred_dir)?;
        sys::chmod(&self.paths.cred_file, 0o600)?;
        if !self.load_credentials()? {
            return Err(Error::failed("the secrets file vanished"));
        }
        self.check_prefixes()
    }

    /// The NATS prefixes are valid (checked before anything is stopped).
    fn check_prefixes(&self) -> Result<()> {
        check_prefixes(&self.state.nats_prefixes, &self.state.analytics_prefix)
    }

    /// The export lines for the current ports and credentials.
    pub fn env_text(&self) -> String {
        env::render(&EnvInput {
            model_dir: &self.cache.model_dir,
            onnx: self.cache.onnx_installed().then_some((
                self.cache.ort_lib.as_path(),
                self.cache.onnx_model.as_path(),
            )),
            static_dir: self
                .cache
                .static_installed()
                .then_some(self.cache.static_dir.as_path()),
            nats_port: self.state.nats_port,
            nats_monitor_port: self.state.nats_monitor_port,
            nats_nodes: self.state.nats_nodes(),
            pg_port: self.state.pg_port,
            credentials: self.creds.as_ref(),
            cred_dir: &self.paths.cred_dir,
            pg_bin: Some(
                &self
                    .cache
                    .pg_home
                    .join(crate::pins::PG_REL_BASE)
                    .join("bin"),
            ),
        })
    }

    /// pgpass and env for the current ports (after the credentials are loaded).
    fn write_credential_files(&self) -> Result<()> {
        credentials::secure_dir(&self.paths.cred_dir)?;
        if let (Some(creds), Some(port)) = (&self.creds, self.state.pg_port) {
            sys::private_write(&self.paths.cred_dir.join("pgpass"), &creds.pgpass(port))?;
        }
        sys::private_write(&self.paths.cred_dir.join("env"), &self.env_text())
    }

    /// What `restart` and `crash` need: ports and credentials.
    fn load_for_server(&mut self) -> Result<()> {
        if !self.load_state()? {
            return Err(self.never_up());
        }
        if !self.load_credentials()? {
            return Err(Error::failed(format!(
                "stack '{0}' has no credentials yet; run 'stack up {0} ...' first",
                self.name()
            )));
        }
        self.check_prefixes()
    }

    /// After a failed `up`: stop what it started (no half stacks).
    fn up_cleanup(&mut self) {
        if self.started_pg {
            warn!("stopping the Postgres this 'up' started");
            self.stop_pg();
        }
        if !self.started_nats.is_empty() {
            warn!("stopping the NATS this 'up' started");
            let nodes: Vec<_> = self
                .started_nats
                .iter()
                .map(|i| self.nats_node(*i))
                .collect();
            self.stop_nodes(&nodes);
        }
    }
}

/// `up <name> <nats_port> <pg_port> [<nats_monitor_port>]`: start the stack's servers (those
/// not running yet) and wait until they are ready; the export lines to print.
pub fn up(
    settings: &Settings,
    name: &str,
    nats_port: &str,
    pg_port: &str,
    monitor_port: Option<&str>,
) -> Result<String> {
    validate_name(name)?;
    let (want_nats, want_pg, want_mon) = up_ports(
        nats_port,
        pg_port,
        monitor_port,
        settings.nats_monitor_port.as_deref(),
    )?;
    let want_nodes = nats_cluster::cluster_size(settings.nats_cluster.as_deref())?;
    let want_sync = match settings.nats_sync.as_deref() {
        None => false,
        Some("always") => true,
        Some(other) => {
            return Err(Error::Usage(format!(
                "SB_STACK_NATS_SYNC must be 'always' (fsync every JetStream write) or unset, got '{other}'"
            )));
        }
    };
    nats_cluster::check_ports(want_nats, want_mon, want_pg, want_nodes)?;
    let root = &settings.root;
    sys::mkdir_p(root)?;
    let gitignore = root.join(".gitignore");
    if !gitignore.is_file() {
        std::fs::write(&gitignore, "*\n").map_err(|e| Error::io("writing", &gitignore, e))?;
    }
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    binaries::ensure(&s.cache, &settings.python)?;
    sys::mkdir_p(&s.paths.nats_dir)?;
    s.load_state()?;
    if let Some(p) = &settings.nats_prefixes {
        s.state.nats_prefixes = p.clone();
    }
    if let Some(a) = &settings.analytics_prefix {
        s.state.analytics_prefix = a.clone();
    }
    s.ensure_credentials()?;

    // What is already running, on which ports? (NATS: any node of the recorded size.)
    let mut nats_up = s.state.nats_port.is_some() && s.nats_running();
    let mut pg_up = false;
    if s.state.pg_dir.is_some() {
        if sys::is_root() {
            s.pg_user = Some(PgUser::ensure(&settings.pg_sysuser)?);
        }
        pg_up = s.pg_running();
    }
    let port = |p: Option<u16>| p.map(|p| p.to_string()).unwrap_or_default();
    if nats_up
        && (s.state.nats_port != Some(want_nats) || s.state.nats_monitor_port != Some(want_mon))
    {
        return Err(Error::failed(format!(
            "stack '{name}' already runs NATS on {} (monitoring {}); run 'stack down {name}' first to change ports",
            port(s.state.nats_port),
            port(s.state.nats_monitor_port)
        )));
    }
    if nats_up && s.state.nats_nodes() != want_nodes {
        let size = |n: u16| {
            if n == 1 {
                "a single NATS server".to_string()
            } else {
                format!("a NATS cluster of {n} nodes")
            }
        };
        return Err(Error::failed(format!(
            "stack '{name}' already runs {} and {CLUSTER_VAR} asks for {}; run 'stack down {name}' first to change the cluster size",
            size(s.state.nats_nodes()),
            size(want_nodes)
        )));
    }
    if nats_up && s.state.nats_sync_always != want_sync {
        return Err(Error::failed(format!(
            "stack '{name}' already runs NATS with sync_interval {}; run 'stack down {name}' first to change SB_STACK_NATS_SYNC",
            if s.state.nats_sync_always {
                "always"
            } else {
                "at its default"
            }
        )));
    }
    if pg_up && s.state.pg_port != Some(want_pg) {
        return Err(Error::failed(format!(
            "stack '{name}' already runs Postgres on {}; run 'stack down {name}' first to change ports",
            port(s.state.pg_port)
        )));
    }
    // A server that runs without the current credentials (a stack from before they existed, or
    // rotated while stopped) is restarted with them.
    if nats_up && !s.nats_creds_current() {
        log!(
            "NATS of stack '{name}' runs without the current credentials or prefixes; restarting it"
        );
        s.stop_nats();
        nats_up = false;
    }
    if pg_up && !s.pg_credentials_current() {
        log!("Postgres of stack '{name}' runs without the current credentials; restarting it");
        s.stop_pg();
        pg_up = false;
    }
    let nats_all_up = nats_up && s.nats_nodes().iter().all(|n| s.node_running(n));
    if nats_all_up && pg_up && s.nats_healthy() && s.pg_ready() {
        let nats_ports = match (s.state.nats_nodes(), s.state.nats_port) {
            (nodes @ 2.., Some(p)) => format!("{p}-{}", u32::from(p) + u32::from(nodes) - 1),
            _ => port(s.state.nats_port),
        };
        log!(
            "stack '{name}' is already running (NATS {nats_ports}, Postgres {})",
            port(s.state.pg_port)
        );
        s.write_credential_files()?;
        return Ok(s.env_text());
    }

    s.state.nats_port = Some(want_nats);
    s.state.nats_monitor_port = Some(want_mon);
    // Stopped (or it would have been refused above): the size asked for now is taken; node 1
    // keeps the single server's files and data.
    s.state.set_nats_nodes(want_nodes);
    s.state.nats_sync_always = want_sync;
    s.state.pg_port = Some(want_pg);
    if !pg_up {
        s.state.pg_fast = settings.fast;
    }
    s.resolve_pg_layout()?;
    s.state.pg_user = s.pg_user.as_ref().map(|u| u.name.clone());
    s.state.save(&s.paths.ports, name)?;
    s.write_credential_files()?;

    // From here a failure or an interruption stops what this `up` started: no half stacks.
    sys::catch_interrupts();
    let t0 = Instant::now();
    let started = (|| {
        // Every node not running (all of them, or those a crash left down).
        s.start_nats()?;
        if let Some(sick) = s.nats_nodes().into_iter().find(|n| !s.node_healthy(n)) {
            return Err(Error::failed(format!(
                "{} (pid {}) runs but is not healthy; see {} or run 'stack down {name}'",
                sick.label(),
                s.node_pid(&sick).map(|p| p.to_string()).unwrap_or_default(),
                sick.files.log.display()
            )));
        }
        sys::check_interrupted()?;
        if !pg_up {
            s.start_pg()?;
        }
        sys::check_interrupted()?;
        s.ensure_pg_database()?;
        sys::check_interrupted()
    })();
    if let Err(e) = started {
        // The children an interruption reached (pg_ctl, psql) fail of it: the signal is the cause.
        let interrupted = sys::interrupted();
        if interrupted.is_none() {
            eprintln!("stack: ERROR: {e}");
        }
        s.up_cleanup();
        return Err(interrupted.map_or(Error::Reported, Error::Interrupted));
    }
    let pg_dir = s.state.pg_dir.clone().unwrap_or_default();
    log!(
        "stack '{name}' is up ({}s). Data: {}{}",
        t0.elapsed().as_secs(),
        s.paths.dir.display(),
        if pg_dir != s.paths.dir.join("pg") {
            format!(", Postgres data: {}", pg_dir.display())
        } else {
            String::new()
        }
    );
    Ok(s.env_text())
}

/// `down <name>`: stop both servers; the data is kept.
pub fn down(settings: &Settings, name: &str) -> Result<()> {
    let mut s = Stack::open(settings, name)?;
    if !s.paths.dir.is_dir() {
        log!("stack '{name}' does not exist; nothing to stop");
        return Ok(());
    }
    let _lock = s.lock()?;
    if !s.load_state()? {
        log!("stack '{name}' has no ports file; nothing to stop");
        return Ok(());
    }
    s.stop_nats();
    s.stop_pg();
    log!(
        "stack '{name}' is down (data kept in {})",
        s.paths.dir.display()
    );
    Ok(())
}

/// `destroy <name>`: down, and delete the name's data and credentials.
pub fn destroy(settings: &Settings, name: &str) -> Result<()> {
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    let fb = fallback_base(&settings.root);
    if s.load_state()? {
        s.stop_nats();
        s.stop_pg();
        if s.state.pg_dir.as_deref() == Some(fb.join(name).join("pg").as_path()) {
            sys::remove_all(&fb.join(name))?;
            // Remove the fallback copy of the binaries once no stack uses it.
            let in_use = std::fs::read_dir(&fb).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    !e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{PG_PKG}-"))
                })
            });
            if !in_use {
                sys::remove_all(&fb)?;
                log!("removed {}", fb.display());
            }
        }
    }
    sys::remove_all(&s.paths.dir)?;
    sys::remove_file(&s.paths.lock);
    log!(
        "stack '{name}' destroyed (binaries stay cached in {})",
        s.cache.dir.display()
    );
    Ok(())
}

/// `restart <name> nats|nats-<i>|pg`: stop one server (`nats`: every node) and start it again
/// on the same ports and data.
pub fn restart(settings: &Settings, name: &str, server: Server) -> Result<()> {
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    s.load_for_server()?;
    match server {
        Server::Nats => {
            s.stop_nats();
            s.start_nats()?;
        }
        Server::NatsNode(i) => s.restart_nats_node(i)?,
        Server::Pg => {
            s.stop_pg();
            s.start_pg()?;
        }
    }
    log!("stack '{name}': {server} restarted");
    Ok(())
}

/// `crash <name> nats|nats-<i>|pg`: SIGKILL one server (`nats`: every node at once) and start
/// it again (crash recovery).
pub fn crash(settings: &Settings, name: &str, server: Server) -> Result<()> {
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    s.load_for_server()?;
    match server {
        Server::Nats => s.crash_nats()?,
        Server::NatsNode(i) => s.crash_nats_node(i)?,
        Server::Pg => s.crash_pg()?,
    }
    log!("stack '{name}': {server} crashed and came back");
    Ok(())
}

/// `rotate <name>`: new passwords. The servers of a running stack restart with them (clients
/// must reconnect with the new URLs, returned like `env`'s); a stopped one gets them on its
/// next `up`.
pub fn rotate(settings: &Settings, name: &str) -> Result<String> {
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    if !s.load_state()? {
        return Err(s.never_up());
    }
    log!(
        "generating new credentials for stack '{name}' in {}/",
        s.paths.cred_dir.display()
    );
    s.check_prefixes()?;
    s.generate_credentials()?;
    s.load_credentials()?;
    s.write_credential_files()?;
    if s.nats_running() {
        s.stop_nats();
        s.start_nats()?;
    }
    if s.pg_running() {
        s.stop_pg();
        s.start_pg()?;
    }
    log!("stack '{name}': credentials rotated");
    Ok(s.env_text())
}

/// `switchboard readers add|remove`: the stack's event readers become what `change` makes of
/// them; every NATS config is rewritten and each running server reloads it (no restart). The
/// readers now configured.
pub fn update_readers(
    settings: &Settings,
    name: &str,
    change: impl FnOnce(&mut Vec<crate::readers::Reader>) -> Result<()>,
) -> Result<Vec<crate::readers::Reader>> {
    let mut s = Stack::open(settings, name)?;
    let _lock = s.lock()?;
    if !s.load_state()? {
        return Err(s.never_up());
    }
    if !s.load_credentials()? {
        return Err(Error::failed(format!(
            "stack '{name}' has no credentials yet; its next 'up' creates them"
        )));
    }
    let file = s.readers_file();
    let mut readers = crate::readers::load(&file)?;
    change(&mut readers)?;
    crate::readers::save(&file, &readers)?;
    s.reload_nats_confs()?;
    Ok(readers)
}

/// The stack's event readers.
pub fn readers(settings: &Settings, name: &str) -> Result<Vec<crate::readers::Reader>> {
    let s = Stack::open(settings, name)?;
    crate::readers::load(&s.readers_file())
}

/// `env <name>`: the export lines.
pub fn env(settings: &Settings, name: &str) -> Result<String> {
    let mut s = Stack::open(settings, name)?;
    if !s.load_state()? {
        return Err(Error::failed(format!(
            "stack '{name}' has never been brought up (no {}); run 'stack up {name} <nats_port> <pg_port>'",
            s.paths.ports.display()
        )));
    }
    if !s.load_credentials()? {
        warn!(
            "stack '{name}' has no credentials yet (made before they existed); its next 'up' creates them"
        );
    }
    Ok(s.env_text())
}

/// Write to `out`; a reader that went away (`stack status x | head -3`) is no error.
fn emit(out: &mut dyn Write, text: &str) -> Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Io {
            what: "writing the status".into(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// `status <name>`: what runs, on `out`; whether both servers are running and ready.
pub fn status(settings: &Settings, name: &str, out: &mut dyn Write) -> Result<bool> {
    let mut s = Stack::open(settings, name)?;
    if !s.load_state()? {
        emit(
            out,
            &format!(
                "stack '{name}': not created (no {})\n",
                s.paths.ports.display()
            ),
        )?;
        return Ok(false);
    }
    let port = |p: Option<u16>| p.map(|p| p.to_string()).unwrap_or_default();
    // One line per NATS node (one for a single server, as always).
    let mut nats_lines = String::new();
    let mut nats_ready = true;
    for node in s.nats_nodes() {
        let mut state = "stopped".to_string();
        if s.node_running(&node) {
            let pid = s.node_pid(&node).map(|p| p.to_string()).unwrap_or_default();
            state = if s.node_healthy(&node) {
                format!("running, healthy (pid {pid})")
            } else {
                format!("running, NOT healthy (pid {pid})")
            };
        }
        nats_ready &= state.starts_with("running, healthy");
        nats_lines.push_str(&if let (true, Some(p)) = (node.clustered(), node.ports) {
            let label = format!("NATS-{}", node.index);
            format!(
                "  {label:<10}127.0.0.1:{} (monitoring http://127.0.0.1:{}, routes 127.0.0.1:{}): {state}\n",
                p.client,
                p.monitor,
                p.route,
            )
        } else {
            format!(
                "  NATS      127.0.0.1:{} (monitoring http://127.0.0.1:{}): {state}\n",
                port(s.state.nats_port),
                port(s.state.nats_monitor_port),
            )
        });
    }
    let mut pg = "stopped".to_string();
    if s.pg_running() {
        pg = if s.pg_ready() {
            let pid = s
                .postmaster_pid()
                .map(|p| p.to_string())
                .unwrap_or_default();
            format!("running, ready (pid {pid})")
        } else {
            "running, NOT ready".to_string()
        };
    }
    let ready = nats_ready && pg.starts_with("running, ready");
    let pg_dir = s
        .state
        .pg_dir
        .as_ref()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    emit(
        out,
        &format!(
            "stack '{name}' (state in {})\n{nats_lines}  Postgres  127.0.0.1:{} (data {pg_dir}/data{}): {pg}\n",
            s.paths.dir.display(),
            port(s.state.pg_port),
            if s.state.pg_fast { ", fsync off" } else { "" },
        ),
    )?;
    s.load_credentials()?;
    // The passwords stay out of status output (it gets pasted); 'env' prints them.
    emit(out, &env::redact(&s.env_text()))?;
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn settings(root: &Path, vars: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(|k| {
            if k == "SB_STACK_DIR" {
                return Some(root.display().to_string());
            }
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap()
    }

    #[test]
    fn servers_are_nats_a_nats_node_or_pg() {
        assert_eq!("nats".parse::<Server>(), Ok(Server::Nats));
        assert_eq!("pg".parse::<Server>(), Ok(Server::Pg));
        assert_eq!("nats-1".parse::<Server>(), Ok(Server::NatsNode(1)));
        assert_eq!("nats-5".parse::<Server>(), Ok(Server::NatsNode(5)));
        for bad in [
            "nats-0",
            "nats-",
            "nats-x",
            "nats--1",
            "nats-+1",
            "nats-99999",
            "redis",
        ] {
            assert!(bad.parse::<Server>().is_err(), "{bad}");
        }
        for s in ["nats", "nats-3", "pg"] {
            assert_eq!(s.parse::<Server>().unwrap().to_string(), s);
        }
    }

    /// Checked before anything is written: the state root is not even made.
    #[test]
    fn up_refuses_a_bad_cluster_size_or_colliding_ports_first() {
        let root = std::env::temp_dir().join(format!("stack-cmd-{}", std::process::id()));
        for bad in ["2", "4", "7", "0", "x"] {
            let s = settings(&root, &[("SB_STACK_NATS_CLUSTER", bad)]);
            let e = up(&s, "x", "27222", "27432", Some("27322")).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
            assert!(e.to_string().contains("SB_STACK_NATS_CLUSTER"), "{e}");
        }
        let s = settings(&root, &[("SB_STACK_NATS_CLUSTER", "3")]);
        let e = up(&s, "x", "27222", "27432", Some("27223")).unwrap_err();
        assert!(e.to_string().starts_with("a NATS cluster of 3"), "{e}");
        for bad in ["sometimes", "1s", "ALWAYS"] {
            let s = settings(&root, &[("SB_STACK_NATS_SYNC", bad)]);
            let e = up(&s, "x", "27222", "27432", Some("27322")).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
            assert!(e.to_string().contains("SB_STACK_NATS_SYNC"), "{e}");
        }
        assert!(!root.exists());
    }

    #[test]
    fn a_node_past_the_clusters_size_is_refused_naming_the_size() {
        let root = Path::new("/nonexistent-stack-root");
        let mut s = Stack::open(&settings(root, &[]), "c").unwrap();
        s.state.nats_port = Some(27222);
        s.state.nats_monitor_port = Some(27322);
        // A single server: nats-1 is it.
        assert_eq!(s.checked_nats_node(1).unwrap().label(), "NATS");
        let e = s.checked_nats_node(2).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("single NATS server"), "{e}");
        s.state.set_nats_nodes(3);
        let node = s.checked_nats_node(3).unwrap();
        assert_eq!(node.label(), "NATS node 3");
        assert_eq!(node.files.pid, root.join("c/nats/nats-3.pid"));
        let ports = node.ports.unwrap();
        assert_eq!(
            (ports.client, ports.monitor, ports.route),
            (27224, 27324, 27234)
        );
        let e = s.checked_nats_node(4).unwrap_err().to_string();
        assert_eq!(
            e,
            "stack 'c' runs a NATS cluster of 3 nodes (nats-1 to nats-3); there is no nats-4"
        );
        assert_eq!(s.nats_nodes().len(), 3);
        assert_eq!(s.nats_nodes()[0].files.conf, root.join("c/nats/nats.conf"));
    }

    #[test]
    fn the_env_of_a_cluster_stack_lists_its_nodes() {
        let root = Path::new("/nonexistent-stack-root");
        let mut s = Stack::open(&settings(root, &[]), "c").unwrap();
        s.state.nats_port = Some(27222);
        s.state.nats_monitor_port = Some(27322);
        s.state.pg_port = Some(27432);
        s.creds = Some(Credentials::for_tests());
        let single = s.env_text();
        assert!(!single.contains("SB_RUNTIME__STREAM_REPLICAS"), "{single}");
        s.state.set_nats_nodes(3);
        let cluster = s.env_text();
        assert!(
            cluster.contains("@127.0.0.1:27222,nats://switchboard:"),
            "{cluster}"
        );
        assert!(cluster.contains("export SB_RUNTIME__STREAM_REPLICAS=3\n"));
        assert!(cluster.contains(
            "export SB_STACK_NATS_MONITOR_URLS=http://127.0.0.1:27322,http://127.0.0.1:27323,http://127.0.0.1:27324\n"
        ));
    }
}
