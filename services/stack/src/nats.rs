//! The NATS server of a stack: its configuration (loopback, JetStream, the two users and their
//! permissions), and starting, checking and stopping it.
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::commands::Stack;
use crate::credentials::{self, Credentials, NATS_APP_USER, NATS_RO_USER};
use crate::pins::NATS_VERSION;
use crate::sys::{self, command};
use crate::{Error, Result, log, warn};

/// Changes whenever the subjects below do, so that `up` restarts a NATS that runs with the old
/// ones (the settings line records it).
pub const PERMISSIONS_VERSION: u32 = 2;

/// A subject token: letters, digits, '_' and '-'.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The prefixes (`SB_STACK_NATS_PREFIXES`, space-separated; empty: `*`, any) and the analytics
/// prefix (empty: `sb`), checked.
fn checked_prefixes<'a>(prefixes: &'a str, analytics: &'a str) -> Result<(Vec<&'a str>, &'a str)> {
    let prefixes = if prefixes.is_empty() { "*" } else { prefixes };
    let list: Vec<&str> = prefixes.split_whitespace().collect();
    if list.is_empty() {
        return Err(Error::Invalid("SB_STACK_NATS_PREFIXES is empty".into()));
    }
    if let Some(bad) = list.iter().find(|p| **p != "*" && !is_token(p)) {
        return Err(Error::Invalid(format!(
            "SB_STACK_NATS_PREFIXES: '{bad}' is not a subject token (or '*')"
        )));
    }
    let analytics = if analytics.is_empty() {
        "sb"
    } else {
        analytics
    };
    if !is_token(analytics) {
        return Err(Error::Invalid(format!(
            "SB_STACK_ANALYTICS_PREFIX: '{analytics}' is not a subject token"
        )));
    }
    Ok((list, analytics))
}

/// Checks the prefixes before anything is stopped or written.
pub fn check_prefixes(prefixes: &str, analytics: &str) -> Result<()> {
    checked_prefixes(prefixes, analytics).map(drop)
}

/// The line that identifies the credentials and permissions a config was written with.
pub fn settings_line(fingerprint: &str, prefixes: &str, analytics: &str) -> String {
    format!(
        "# settings: credentials {fingerprint}, prefixes {}, analytics {}, permissions v{PERMISSIONS_VERSION}",
        if prefixes.is_empty() { "*" } else { prefixes },
        if analytics.is_empty() {
            "sb"
        } else {
            analytics
        },
    )
}

/// A NATS config array of quoted strings.
fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// What a stack's nats.conf is made of.
pub struct ConfInput<'a> {
    pub name: &'a str,
    pub nats_port: u16,
    pub monitor_port: u16,
    pub pid_file: &'a Path,
    pub store_dir: &'a Path,
    pub cred_dir: &'a Path,
    pub credentials: &'a Credentials,
    pub fingerprint: &'a str,
    /// As given (`SB_STACK_NATS_PREFIXES`; empty: any).
    pub prefixes: &'a str,
    /// As given (`SB_STACK_ANALYTICS_PREFIX`; empty: sb).
    pub analytics: &'a str,
}

/// The authorization block for the users of credentials/secrets:
///
/// - `switchboard`, the product: its subjects under each prefix, the JetStream and key-value
///   APIs, reply inboxes;
/// - `analytics`, read-only: the public event stream of the analytics prefix, live (subscribe
///   `<prefix>.events.>`) or by sequence (STREAM.MSG.GET / DIRECT.GET on `<PREFIX>_EVENTS`);
///   replies on its own inbox prefix `_INBOX_analytics`. It may not create consumers: a push
///   consumer's deliver subject is not checked against its creator's permissions (nats-server
///   issue 8274), so that would let it publish into the work stream.
pub fn authorization(c: &ConfInput<'_>) -> Result<String> {
    let (prefixes, ro) = checked_prefixes(c.prefixes, c.analytics)?;
    let mut publish: Vec<String> = Vec::new();
    for p in &prefixes {
        for s in [
            "in.>",
            "identified",
            "turn.>",
            "reply",
            "events.>",
            "dlq.>",
            "mailbox.>",
        ] {
            publish.push(format!("{p}.{s}"));
        }
    }
    let mut subscribe = publish.clone();
    subscribe.push("_INBOX.>".into());
    publish.extend(["$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "_INBOX.>"].map(String::from));
    let stream: String = ro
        .chars()
        .map(|ch| {
            let ch = ch.to_ascii_uppercase();
            if ch.is_ascii_uppercase() || ch.is_ascii_digit() {
                ch
            } else {
                '_'
            }
        })
        .collect::<String>()
        + "_EVENTS";
    let ro_publish = [
        "$JS.API.INFO".to_string(),
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
    ];
    let ro_subscribe = [format!("{ro}.events.>"), format!("_INBOX_{NATS_RO_USER}.>")];
    let mut out = String::new();
    let _ = write!(
        out,
        "# Who may connect: the users below, with the passwords in {cred_dir}/secrets
# (generated on the stack's first start; 'stack rotate {name}' replaces them).
# There is no anonymous access and no no_auth_user.
{settings}
authorization {{
  users = [
    {{
      user: \"{NATS_APP_USER}\"
      password: \"{app_password}\"
      permissions: {{
        publish: {{ allow: {publish} }}
        subscribe: {{ allow: {subscribe} }}
      }}
    }}
    {{
      user: \"{NATS_RO_USER}\"
      password: \"{ro_password}\"
      permissions: {{
        publish: {{ allow: {ro_publish} }}
        subscribe: {{ allow: {ro_subscribe} }}
      }}
    }}
  ]
}}",
        cred_dir = c.cred_dir.display(),
        name = c.name,
        settings = settings_line(c.fingerprint, c.prefixes, c.analytics),
        app_password = c.credentials.nats_password,
        publish = quoted_list(&publish),
        subscribe = quoted_list(&subscribe),
        ro_password = c.credentials.analytics_password,
        ro_publish = quoted_list(&ro_publish),
        ro_subscribe = quoted_list(&ro_subscribe),
    );
    Ok(out)
}

/// The whole nats.conf.
pub fn render_conf(c: &ConfInput<'_>) -> Result<String> {
    Ok(format!(
        "# NATS configuration for the local Switchboard stack '{name}'.
# Generated by the stack tool (services/stack) on every start; edits are overwritten.
# It holds passwords: mode 0600.
server_name: \"switchboard-{name}\"

# Loopback only.
listen: \"127.0.0.1:{port}\"
# HTTP monitoring (/healthz, /varz, /jsz).
http: \"127.0.0.1:{monitor}\"
pid_file: \"{pid_file}\"

# The default maximum message size (1 MB), stated so it is visible.
max_payload: 1MB

jetstream {{
  # nats-server appends \"jetstream/\" itself: streams end up in nats/jetstream/.
  store_dir: \"{store_dir}\"

  # DURABILITY: sync_interval is left at its default, which fsyncs the stream
  # files only every 2 minutes; until then acknowledged messages may sit in the
  # OS page cache. Jepsen's NATS 2.12.1 analysis found acknowledged writes lost
  # after power failures / OS crashes with this default. Good enough for a
  # dev/test box. Production must use R3 (3-replica) streams and/or:
  # sync_interval: always
}}

{authorization}
",
        name = c.name,
        port = c.nats_port,
        monitor = c.monitor_port,
        pid_file = c.pid_file.display(),
        store_dir = c.store_dir.display(),
        authorization = authorization(c)?,
    ))
}

impl Stack {
    fn nats_ports(&self) -> Result<(u16, u16)> {
        match (self.state.nats_port, self.state.nats_monitor_port) {
            (Some(p), Some(m)) => Ok((p, m)),
            _ => Err(Error::failed(format!(
                "stack '{}' has no NATS ports in {}",
                self.paths.name,
                self.paths.ports.display()
            ))),
        }
    }

    /// The pid in nats.pid, if it holds one.
    pub fn nats_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(&self.paths.nats_pid).ok()?;
        let text = text.trim_end_matches('\n');
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok()
    }

    /// Alive, and started with this stack's config file.
    fn nats_pid_is_ours(&self, pid: i32) -> bool {
        // A command line that cannot be read: trust the pid file.
        sys::pid_alive(pid) && sys::cmdline_has(pid, &self.paths.nats_conf).unwrap_or(true)
    }

    pub fn nats_running(&self) -> bool {
        self.nats_pid()
            .is_some_and(|pid| self.nats_pid_is_ours(pid))
    }

    pub fn nats_healthy(&self) -> bool {
        self.state.nats_monitor_port.is_some_and(|m| {
            crate::http::answers(
                &format!("http://127.0.0.1:{m}/healthz?js-enabled-only=true"),
                Duration::from_secs(2),
            )
        })
    }

    /// The config NATS runs with has the current credentials and prefixes.
    pub fn nats_creds_current(&self) -> bool {
        let Ok(fingerprint) = credentials::fingerprint(&self.paths.cred_file) else {
            return false;
        };
        let line = settings_line(
            &fingerprint,
            &self.state.nats_prefixes,
            &self.state.analytics_prefix,
        );
        std::fs::read_to_string(&self.paths.nats_conf)
            .is_ok_and(|conf| conf.lines().any(|l| l == line))
    }

    fn write_nats_conf(&self) -> Result<()> {
        sys::mkdir_p(&self.paths.nats_dir)?;
        sys::chmod(&self.paths.nats_dir, 0o700)?; // the config holds the passwords
        let credentials = self
            .creds
            .as_ref()
            .ok_or_else(|| Error::failed("write_nats_conf: no credentials loaded"))?;
        let (nats_port, monitor_port) = self.nats_ports()?;
        let fingerprint = credentials::fingerprint(&self.paths.cred_file)?;
        let conf = render_conf(&ConfInput {
            name: &self.paths.name,
            nats_port,
            monitor_port,
            pid_file: &self.paths.nats_pid,
            store_dir: &self.paths.nats_dir,
            cred_dir: &self.paths.cred_dir,
            credentials,
            fingerprint: &fingerprint,
            prefixes: &self.state.nats_prefixes,
            analytics: &self.state.analytics_prefix,
        })?;
        sys::private_write(&self.paths.nats_conf, &conf)
    }

    /// Start nats-server detached (its own session, SIGHUP ignored: it outlives the caller)
    /// and wait until it answers its health check with JetStream enabled.
    pub fn start_nats(&mut self) -> Result<()> {
        let (port, monitor) = self.nats_ports()?;
        let name = self.paths.name.clone();
        for p in [port, monitor] {
            if sys::port_in_use(p) {
                return Err(Error::failed(format!(
                    "127.0.0.1:{p} is already in use by another process (needed by NATS for stack '{name}')"
                )));
            }
        }
        self.write_nats_conf()?;
        sys::remove_file(&self.paths.nats_pid);
        let log_path = &self.paths.nats_log;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| Error::io("writing", log_path, e))?;
        let _ = write!(
            log,
            "\n==== {}: starting nats-server (stack up {name}) ====\n",
            sys::utc_timestamp()
        );
        self.started_nats = true;
        log!("starting NATS {NATS_VERSION} on 127.0.0.1:{port} (monitoring 127.0.0.1:{monitor})");
        let stderr = log
            .try_clone()
            .map_err(|e| Error::io("writing", log_path, e))?;
        let mut cmd = command(&self.cache.nats_bin);
        cmd.arg("-c")
            .arg(&self.paths.nats_conf)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            Error::failed(format!(
                "could not start {}: {e}",
                self.cache.nats_bin.display()
            ))
        })?;
        let pid = child.id() as i32;
        // nats-server writes its own pid file too (pid_file in the config); same pid.
        std::fs::write(&self.paths.nats_pid, format!("{pid}\n"))
            .map_err(|e| Error::io("writing", &self.paths.nats_pid, e))?;
        let deadline = Instant::now() + Duration::from_secs(self.settings.timeout_s);
        while !self.nats_healthy() {
            sys::check_interrupted()?;
            if !sys::pid_alive(pid) {
                let other = self.nats_pid();
                if other.is_none_or(|p| p == pid || !sys::pid_alive(p)) {
                    sys::remove_file(&self.paths.nats_pid);
                    return Err(Error::server("NATS exited during startup", log_path));
                }
            }
            if Instant::now() >= deadline {
                self.stop_nats();
                return Err(Error::server(
                    format!(
                        "NATS was not healthy within {}s (stopped it again)",
                        self.settings.timeout_s
                    ),
                    log_path,
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        log!(
            "NATS is ready (JetStream enabled), pid {}",
            self.nats_pid().unwrap_or(pid)
        );
        Ok(())
    }

    /// SIGTERM the stack's NATS (SIGKILL after 15 s) and remove its pid file.
    pub fn stop_nats(&self) {
        let Some(pid) = self.nats_pid() else {
            sys::remove_file(&self.paths.nats_pid);
            return;
        };
        if self.nats_pid_is_ours(pid) {
            log!("stopping NATS (pid {pid})");
            sys::kill(pid, libc::SIGTERM);
            if !sys::wait_until(Duration::from_secs(15), || !sys::pid_alive(pid)) {
                warn!("NATS did not stop within 15s; sending SIGKILL");
                sys::kill(pid, libc::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        sys::remove_file(&self.paths.nats_pid);
    }

    /// SIGKILL the stack's NATS and start it again on the same ports and data.
    pub fn crash_nats(&mut self) -> Result<()> {
        let pid = self.nats_pid().ok_or_else(|| {
            Error::failed(format!(
                "NATS of stack '{}' is not running",
                self.paths.name
            ))
        })?;
        log!("SIGKILL NATS (pid {pid})");
        let started = sys::start_time(pid);
        sys::kill(pid, libc::SIGKILL);
        let gone = sys::wait_until(Duration::from_secs(30), || {
            !sys::same_alive(pid, started.as_deref())
        });
        if !gone {
            return Err(Error::failed(format!(
                "NATS (pid {pid}) still alive 30s after SIGKILL"
            )));
        }
        let (port, monitor) = self.nats_ports()?;
        sys::wait_ports_released(&[port, monitor]);
        sys::remove_file(&self.paths.nats_pid);
        self.start_nats()
    }
}

#[cfg(test)]
#[path = "nats_tests.rs"]
mod tests;
