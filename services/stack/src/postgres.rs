//! The Postgres server of a stack: its cluster (initdb), its settings (switchboard.conf,
//! pg_hba.conf), the passwords of its roles, the `switchboard` database with pgvector, and
//! starting, checking, stopping and crashing it.
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::commands::Stack;
use crate::credentials::{self, PG_APP_ROLE, new_scram_verifier};
use crate::pguser::as_pg;
use crate::pins::{PG_MAJOR, PG_REL_BASE};
use crate::sys::{self, command, to_stderr};
use crate::{Error, Result, log, warn};

/// Who may connect: TCP only with a password (scram-sha-256), every role. The Unix socket (in
/// the data folder, mode 0700: only the server's user and root reach it) lets the owner in
/// without one.
pub const PG_HBA: &str =
    "# Written by the stack tool (services/stack) on every start. Do not edit; it is rewritten.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  trust
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
";

/// What `up` appends to a new cluster's postgresql.conf.
const INCLUDE: &str = "\n# Local Switchboard stack settings (rewritten by the stack tool on every 'up').\ninclude_if_exists = 'switchboard.conf'\n";

/// The stack's switchboard.conf, and whether the data path is too long for a Unix socket
/// (sun_path is limited to 107 bytes: then Postgres listens on TCP only).
pub fn render_conf(
    name: &str,
    port: u16,
    data: &str,
    fast: bool,
    extra: Option<&str>,
) -> (String, bool) {
    let too_long = data.len() + 16 + port.to_string().len() > 100;
    let socket = if too_long { "" } else { data };
    let mut conf = format!(
        "# Written by the stack tool (services/stack) up {name}. Do not edit; it is rewritten.
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket}'
max_connections = 300
password_encryption = 'scram-sha-256'
"
    );
    if fast {
        conf.push_str("# SB_STACK_FAST=1: throwaway data, no crash safety.\n");
        conf.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
    } else {
        conf.push_str("fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n");
    }
    if let Some(extra) = extra.filter(|e| !e.is_empty()) {
        conf.push_str(&format!("# SB_STACK_PG_CONF:\n{extra}\n"));
    }
    (conf, too_long)
}

/// The statements that set the roles' passwords in single-user mode (one a line: single-user
/// mode ends a statement at a newline), given their SCRAM verifiers.
pub fn credential_statements(super_verifier: &str, app_verifier: &str) -> String {
    let r = PG_APP_ROLE;
    format!(
        "ALTER ROLE postgres PASSWORD '{super_verifier}'
DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{r}') THEN CREATE ROLE {r}; END IF; END$$
ALTER ROLE {r} LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '{app_verifier}'
ALTER ROLE {r} SET search_path = public
"
    )
}

impl Stack {
    fn pg_dir(&self) -> Result<PathBuf> {
        self.state.pg_dir.clone().ok_or_else(|| {
            Error::failed(format!(
                "stack '{}' has no PG_DIR in {}",
                self.paths.name,
                self.paths.ports.display()
            ))
        })
    }

    fn pg_data(&self) -> Result<PathBuf> {
        Ok(self.pg_dir()?.join("data"))
    }

    fn pg_port(&self) -> Result<u16> {
        self.state
            .pg_port
            .ok_or_else(|| Error::failed(format!("stack '{}' has no PG_PORT", self.paths.name)))
    }

    fn pg_bin(&self, tool: &str) -> PathBuf {
        self.state
            .pg_install
            .as_ref()
            .unwrap_or(&self.cache.pg_home)
            .join(PG_REL_BASE)
            .join("bin")
            .join(tool)
    }

    fn pg_log(&self) -> Result<PathBuf> {
        Ok(self.pg_dir()?.join("postgres.log"))
    }

    /// A Postgres tool run as the Postgres user.
    fn as_pg(&self, tool: &str) -> Command {
        as_pg(self.pg_user.as_ref(), self.pg_bin(tool))
    }

    /// The postmaster's pid (the first line of postmaster.pid).
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.pg_data().ok()?.join("postmaster.pid")).ok()?;
        let first = text.lines().next()?;
        first
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| first.parse().ok())?
    }

    pub fn pg_running(&self) -> bool {
        let Ok(data) = self.pg_data() else {
            return false;
        };
        data.join("postmaster.pid").is_file()
            && sys::succeeds(self.as_pg("pg_ctl").arg("status").arg("-D").arg(&data))
    }

    pub fn pg_ready(&self) -> bool {
        let Ok(port) = self.pg_port() else {
            return false;
        };
        sys::succeeds(command(self.pg_bin("pg_isready")).args([
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-t",
            "1",
        ]))
    }

    /// psql as the superuser, over TCP with its password (credentials/pgpass).
    fn psql_admin(&self) -> Result<Command> {
        let mut cmd = command(self.pg_bin("psql"));
        cmd.env("PGPASSFILE", self.paths.cred_dir.join("pgpass"))
            .args([
                "-X",
                "-q",
                "-w",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
            ])
            .arg(self.pg_port()?.to_string())
            .args(["-U", "postgres"]);
        Ok(cmd)
    }

    /// psql with these arguments, its output on our stderr.
    fn psql_run(&self, args: &[&str], failure: &str) -> Result<()> {
        let status = self
            .psql_admin()?
            .args(args)
            .stdin(Stdio::null())
            .stdout(to_stderr())
            .status();
        match status {
            Ok(s) if s.success() => Ok(()),
            _ => Err(Error::failed(failure)),
        }
    }

    /// psql with these arguments; what it printed (trimmed).
    fn psql_query(&self, args: &[&str]) -> Result<String> {
        let out = self
            .psql_admin()?
            .args(args)
            .stdin(Stdio::null())
            .stderr(to_stderr())
            .output()
            .map_err(|e| Error::failed(format!("psql: {e}")))?;
        if !out.status.success() {
            return Err(Error::failed(format!("psql {} failed", args.join(" "))));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn pg_cred_marker(&self) -> Result<PathBuf> {
        Ok(self.pg_data()?.join("switchboard-credentials"))
    }

    /// The cluster has the passwords of the current secrets file.
    pub fn pg_credentials_current(&self) -> bool {
        let (Ok(marker), Ok(fingerprint)) = (
            self.pg_cred_marker(),
            credentials::fingerprint(&self.paths.cred_file),
        ) else {
            return false;
        };
        std::fs::read_to_string(marker).is_ok_and(|m| m.trim_end_matches('\n') == fingerprint)
    }

    /// With the server stopped, set the passwords of the roles postgres and switchboard
    /// (created if missing) in single-user mode, which needs no authentication, so this works
    /// for a new cluster, one from before credentials existed, and after a rotate.
    fn pg_apply_credentials(&self) -> Result<()> {
        if self.pg_credentials_current() {
            return Ok(());
        }
        let creds = self
            .creds
            .as_ref()
            .ok_or_else(|| Error::failed("no credentials loaded"))?;
        log!("setting the Postgres passwords (roles postgres and {PG_APP_ROLE})");
        let statements = credential_statements(
            &new_scram_verifier(&creds.pg_super_password)?,
            &new_scram_verifier(&creds.pg_password)?,
        );
        let out_path = self.pg_dir()?.join("credentials.log");
        let out =
            std::fs::File::create(&out_path).map_err(|e| Error::io("writing", &out_path, e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("writing", &out_path, e))?;
        let data = self.pg_data()?;
        let done = self
            .as_pg("postgres")
            .arg("--single")
            .arg("-D")
            .arg(&data)
            .args(["-c", "exit_on_error=true", "postgres"])
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .and_then(|mut child| {
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(statements.as_bytes())?;
                }
                child.wait()
            })
            .is_ok_and(|s| s.success());
        if !done {
            sys::eprint_tail(&out_path, 20, "    | ");
            return Err(Error::failed(format!(
                "could not set the Postgres passwords (single-user mode; output in {})",
                out_path.display()
            )));
        }
        sys::remove_file(&out_path);
        let marker = self.pg_cred_marker()?;
        let fingerprint = credentials::fingerprint(&self.paths.cred_file)?;
        sys::private_write(&marker, &format!("{fingerprint}\n"))?;
        if let Some(user) = &self.pg_user {
            user.chown(&marker)?;
        }
        Ok(())
    }

    /// A cluster in `<pg_dir>/data`, made by initdb if there is none (via a temp folder).
    fn ensure_pg_initdb(&self) -> Result<()> {
        let (dir, data) = (self.pg_dir()?, self.pg_data()?);
        let name = &self.paths.name;
        sys::mkdir_p(&dir)?;
        if let Some(user) = &self.pg_user {
            user.chown(&dir)?;
        }
        sys::chmod(&dir, 0o700)?;
        if let Ok(ver) = std::fs::read_to_string(data.join("PG_VERSION")) {
            let ver = ver.trim_end_matches('\n');
            if ver != PG_MAJOR {
                return Err(Error::failed(format!(
                    "{} was created by PostgreSQL {ver}, these binaries are {PG_MAJOR}; run 'stack destroy {name}'",
                    data.display()
                )));
            }
            if let Some(user) = &self.pg_user {
                use std::os::unix::fs::MetadataExt as _;
                if data.metadata().is_ok_and(|m| m.uid() != user.uid) {
                    user.chown_all(&dir)?;
                }
            }
            return Ok(());
        }
        if data.exists() {
            return Err(Error::failed(format!(
                "{} exists but is not a Postgres data directory; run 'stack destroy {name}'",
                data.display()
            )));
        }
        log!(
            "initdb: creating a new Postgres cluster in {}",
            data.display()
        );
        let tmp = dir.join("data.initdb");
        sys::remove_all(&tmp)?;
        let log_path = dir.join("initdb.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| Error::io("writing", &log_path, e))?;
        let err = log
            .try_clone()
            .map_err(|e| Error::io("writing", &log_path, e))?;
        let ok = self
            .as_pg("initdb")
            .arg("-D")
            .arg(&tmp)
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            sys::eprint_tail(&log_path, 40, "");
            sys::remove_all(&tmp)?;
            return Err(Error::failed(format!(
                "initdb failed (full output in {})",
                log_path.display()
            )));
        }
        let conf = tmp.join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut f| f.write_all(INCLUDE.as_bytes()))
            .map_err(|e| Error::io("writing", &conf, e))?;
        std::fs::rename(&tmp, &data).map_err(|e| Error::io("writing", &data, e))
    }

    /// switchboard.conf and pg_hba.conf, rewritten on every start.
    fn write_pg_conf(&self) -> Result<()> {
        let data = self.pg_data()?;
        let (conf, too_long) = render_conf(
            &self.paths.name,
            self.pg_port()?,
            &data.display().to_string(),
            self.state.pg_fast,
            self.settings.pg_conf.as_deref(),
        );
        if too_long {
            warn!("data path too long for a unix socket; Postgres listens on TCP only");
        }
        let conf_path = data.join("switchboard.conf");
        let hba_path = data.join("pg_hba.conf");
        std::fs::write(&conf_path, conf).map_err(|e| Error::io("writing", &conf_path, e))?;
        std::fs::write(&hba_path, PG_HBA).map_err(|e| Error::io("writing", &hba_path, e))?;
        for path in [&conf_path, &hba_path] {
            if let Some(user) = &self.pg_user {
                user.chown(path)?;
            }
            sys::chmod(path, 0o600)?;
        }
        Ok(())
    }

    /// Start Postgres (initdb first if needed, its passwords set) and wait until it accepts
    /// connections.
    pub fn start_pg(&mut self) -> Result<()> {
        let port = self.pg_port()?;
        let timeout = self.settings.timeout_s;
        if sys::port_in_use(port) {
            return Err(Error::failed(format!(
                "127.0.0.1:{port} is already in use by another process (needed by Postgres for stack '{}')",
                self.paths.name
            )));
        }
        self.ensure_pg_initdb()?;
        self.write_pg_conf()?;
        self.pg_apply_credentials()?;
        log!(
            "starting PostgreSQL {PG_MAJOR} on 127.0.0.1:{port}{}{}",
            if self.state.pg_fast {
                " (SB_STACK_FAST: fsync off)"
            } else {
                ""
            },
            self.pg_user
                .as_ref()
                .map(|u| format!(" as user {}", u.name))
                .unwrap_or_default()
        );
        self.started_pg = true;
        let (data, log) = (self.pg_data()?, self.pg_log()?);
        let started = self
            .as_pg("pg_ctl")
            .arg("start")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", &timeout.to_string(), "-s"])
            .stdin(Stdio::null())
            .stdout(to_stderr())
            .status()
            .is_ok_and(|s| s.success());
        sys::check_interrupted()?;
        if !started {
            sys::succeeds(self.as_pg("pg_ctl").arg("stop").arg("-D").arg(&data).args([
                "-m",
                "immediate",
                "-s",
            ]));
            return Err(Error::server(
                format!("Postgres failed to start (or was not ready within {timeout}s)"),
                &log,
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(timeout);
        while !self.pg_ready() {
            sys::check_interrupted()?;
            if Instant::now() >= deadline {
                self.stop_pg();
                return Err(Error::server(
                    format!(
                        "Postgres did not accept connections on 127.0.0.1:{port} within {timeout}s"
                    ),
                    &log,
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        log!(
            "Postgres is ready, pid {}",
            self.postmaster_pid()
                .map_or_else(|| "?".to_string(), |p| p.to_string())
        );
        Ok(())
    }

    /// pgvector in template1 (pgvector is not a trusted extension, so the role switchboard
    /// cannot create it; every database it creates, e.g. a test's, inherits it and the
    /// migrations' CREATE EXTENSION IF NOT EXISTS finds it), and the database switchboard owned
    /// by the role switchboard.
    pub fn ensure_pg_database(&self) -> Result<()> {
        let r = PG_APP_ROLE;
        // The role is named like the product's schema, and search_path starts with "$user": the
        // unqualified tables sqlx creates (_sqlx_migrations) would land in schema switchboard
        // once it exists, next to the one already in public. public only, as for postgres.
        self.psql_run(
            &[
                "-d",
                "postgres",
                "-c",
                &format!("ALTER ROLE {r} SET search_path = public"),
            ],
            &format!("could not set the search_path of role {r}"),
        )?;
        let create_vector =
            "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector";
        self.psql_run(
            &["-d", "template1", "-c", create_vector],
            "CREATE EXTENSION vector in template1 failed",
        )?;
        let owner = self.psql_query(&[
            "-d",
            "postgres",
            "-tAc",
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'switchboard'",
        ])?;
        if owner.is_empty() {
            log!("creating database 'switchboard' (owner {r})");
            self.psql_run(
                &[
                    "-d",
                    "postgres",
                    "-c",
                    &format!("CREATE DATABASE switchboard OWNER {r}"),
                ],
                "CREATE DATABASE switchboard failed",
            )?;
        } else if owner != r {
            log!("giving database 'switchboard' and its objects (owned by {owner}) to role {r}");
            self.pg_give_objects(&owner)?;
        }
        self.psql_run(
            &["-d", "switchboard", "-c", create_vector],
            "CREATE EXTENSION vector failed",
        )?;
        let version = self.psql_query(&[
            "-d",
            "switchboard",
            "-tAc",
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'",
        ])?;
        log!("database 'switchboard' has pgvector {version}");
        Ok(())
    }

    /// For a stack from before credentials, when the product connected as postgres: the
    /// database switchboard and what the migrations made in it (schemas, tables, views,
    /// sequences, functions, types; not extension members) go to the role switchboard, so the
    /// product (and later migrations) can use them.
    fn pg_give_objects(&self, old_owner: &str) -> Result<()> {
        let failure = || {
            Error::failed(format!(
                "could not give the objects of {old_owner} to {PG_APP_ROLE}"
            ))
        };
        let mut child = self
            .psql_admin()?
            .args(["-d", "switchboard", "-v"])
            .arg(format!("old={old_owner}"))
            .arg("-v")
            .arg(format!("new={PG_APP_ROLE}"))
            .stdin(Stdio::piped())
            .stdout(to_stderr())
            .spawn()
            .map_err(|_| failure())?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(include_str!("give_objects.sql").as_bytes())
                .map_err(|_| failure())?;
        }
        if !child.wait().is_ok_and(|s| s.success()) {
            return Err(failure());
        }
        self.psql_run(
            &[
                "-d",
                "postgres",
                "-c",
                &format!("ALTER DATABASE switchboard OWNER TO {PG_APP_ROLE}"),
            ],
            "ALTER DATABASE switchboard OWNER failed",
        )
    }

    /// pg_ctl stop -m fast; immediate if that fails; SIGKILL to the postmaster if that fails.
    pub fn stop_pg(&self) {
        let Ok(data) = self.pg_data() else {
            return;
        };
        if !data.join("postmaster.pid").is_file() {
            return;
        }
        if !self.pg_running() {
            log!("Postgres is not running (stale postmaster.pid is left for Postgres to clean up)");
            return;
        }
        log!("stopping Postgres (pg_ctl stop -m fast)");
        let stop = |mode: &str, wait: &str| {
            self.as_pg("pg_ctl")
                .arg("stop")
                .arg("-D")
                .arg(&data)
                .args(["-m", mode, "-w", "-t", wait, "-s"])
                .stdin(Stdio::null())
                .stdout(to_stderr())
                .status()
                .is_ok_and(|s| s.success())
        };
        if stop("fast", "60") {
            return;
        }
        warn!("fast shutdown failed; trying immediate");
        if stop("immediate", "30") {
            return;
        }
        if let Some(pid) = self.postmaster_pid() {
            warn!("sending SIGKILL to postmaster {pid}");
            sys::kill(pid, libc::SIGKILL);
        }
    }

    /// SIGKILL the postmaster and every backend at the same instant, as a power cut or the OOM
    /// killer would (postmaster.pid stays behind, as after a real crash), and start Postgres
    /// again: it comes back by crash recovery.
    pub fn crash_pg(&mut self) -> Result<()> {
        let pid = self
            .postmaster_pid()
            .filter(|&p| sys::pid_alive(p))
            .ok_or_else(|| {
                Error::failed(format!(
                    "Postgres of stack '{}' is not running",
                    self.paths.name
                ))
            })?;
        log!("SIGKILL Postgres (postmaster {pid} and every backend)");
        if !sys::kill_tree_now(pid)? {
            // Dead, but not yet reaped by whoever inherited it: Postgres would take a zombie
            // postmaster for a live one and refuse to start.
            if sys::pid_alive(pid) {
                return Err(Error::failed(format!(
                    "Postgres (pid {pid}) still alive 30s after SIGKILL"
                )));
            }
            warn!("the killed postmaster was not reaped; removing its stale postmaster.pid");
            sys::remove_file(&self.pg_data()?.join("postmaster.pid"));
        }
        sys::wait_ports_released(&[self.pg_port()?]);
        self.start_pg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: &str = "/tmp/stk-golden/root/demo/pg/data";

    /// As the former deploy/local/stack.sh wrote it (write_pg_conf), but for the first line.
    #[test]
    fn the_settings_are_the_scripts() {
        let (fast, long) = render_conf(
            "demo",
            27432,
            DATA,
            true,
            Some("shared_buffers = 1GB\nwork_mem = 8MB"),
        );
        assert!(!long);
        assert_eq!(
            fast,
            format!(
                "# Written by the stack tool (services/stack) up demo. Do not edit; it is rewritten.
listen_addresses = '127.0.0.1'
port = 27432
unix_socket_directories = '{DATA}'
max_connections = 300
password_encryption = 'scram-sha-256'
# SB_STACK_FAST=1: throwaway data, no crash safety.
fsync = off
synchronous_commit = off
full_page_writes = off
# SB_STACK_PG_CONF:
shared_buffers = 1GB
work_mem = 8MB
"
            )
        );
        let (safe, _) = render_conf("demo", 27432, DATA, false, None);
        assert!(safe.ends_with(
            "password_encryption = 'scram-sha-256'\nfsync = on\nsynchronous_commit = on\nfull_page_writes = on\n"
        ));
        assert_eq!(render_conf("demo", 27432, DATA, false, Some("")).0, safe);
    }

    #[test]
    fn a_data_path_too_long_for_a_socket_listens_on_tcp_only() {
        let long = format!("/{}", "d".repeat(80));
        let (conf, too_long) = render_conf("x", 27432, &long, false, None);
        assert!(too_long);
        assert!(conf.contains("unix_socket_directories = ''\n"));
        // 84 + 16 + 5 > 100, 79 + 16 + 5 = 100 is not.
        assert!(!render_conf("x", 27432, &"d".repeat(79), false, None).1);
        assert!(render_conf("x", 27432, &"d".repeat(80), false, None).1);
    }

    #[test]
    fn tcp_logins_need_a_password_and_the_socket_is_trusted() {
        let tcp: Vec<&str> = PG_HBA.lines().filter(|l| l.starts_with("host")).collect();
        assert_eq!(tcp.len(), 2);
        assert!(tcp.iter().all(|l| l.ends_with("scram-sha-256")));
        assert!(PG_HBA.contains("\nlocal   all       all                  trust\n"));
    }

    #[test]
    fn each_credential_statement_is_one_line() {
        let s = credential_statements("SCRAM-SHA-256$4096:a$b:c", "SCRAM-SHA-256$4096:d$e:f");
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            "ALTER ROLE postgres PASSWORD 'SCRAM-SHA-256$4096:a$b:c'"
        );
        assert!(lines[2].starts_with("ALTER ROLE switchboard LOGIN CREATEDB NOSUPERUSER"));
        assert!(lines[2].ends_with("PASSWORD 'SCRAM-SHA-256$4096:d$e:f'"));
        assert_eq!(lines[3], "ALTER ROLE switchboard SET search_path = public");
    }
}
