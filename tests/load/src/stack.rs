//! A named instance of the local stack (NATS + Postgres; the `stack` tool of services/stack),
//! owned by one run.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use sqlx::Connection as _;

/// The repository root (this crate lives in `<repo>/tests/load`).
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/load/ has a grandparent")
        .to_path_buf()
}

#[derive(Debug, Clone)]
pub struct Stack {
    pub name: String,
    pub nats_url: String,
    /// The `switchboard` database; [`Stack::fresh_database`] makes new ones next to it.
    pub database_url: String,
    /// Every `export NAME=value` `stack up` printed (e.g. the local embedder's files, which
    /// `make run` gives the embed worker): read with [`Stack::var`].
    exports: Vec<(String, String)>,
    dir: PathBuf,
}

pub use switchboard_e2e::stack_bin;

fn run(args: &[&str], fast: bool) -> anyhow::Result<String> {
    run_with(args, fast, "", None)
}

/// [`run`], with `pg_conf` (Postgres settings, one per line) as `SB_STACK_PG_CONF` and NATS as
/// a cluster of `nodes` (`SB_STACK_NATS_CLUSTER`, which `up` reads; 1: one server; the other
/// verbs take the size `up` recorded), fsyncing every write when asked (`SB_STACK_NATS_SYNC`).
fn run_with(
    args: &[&str],
    fast: bool,
    pg_conf: &str,
    nodes: Option<(usize, bool)>,
) -> anyhow::Result<String> {
    let mut cmd = Command::new(stack_bin()?);
    cmd.args(args);
    cmd.env_remove("SB_STACK_FAST");
    if fast {
        cmd.env("SB_STACK_FAST", "1");
    }
    cmd.env("SB_STACK_PG_CONF", pg_conf);
    cmd.env_remove("SB_STACK_NATS_SYNC");
    match nodes {
        Some((n, sync_always)) => {
            cmd.env("SB_STACK_NATS_CLUSTER", n.to_string());
            if sync_always {
                cmd.env("SB_STACK_NATS_SYNC", "always");
            }
        }
        None => {
            cmd.env_remove("SB_STACK_NATS_CLUSTER");
        }
    }
    let out = cmd
        .output()
        .with_context(|| format!("running stack {args:?}"))?;
    if !out.status.success() {
        bail!(
            "stack {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Stack {
    /// `stack up <name> <nats_port> <pg_port>`; `fast` sets `SB_STACK_FAST=1` (Postgres
    /// without fsync, for throwaway data).
    pub fn up(name: &str, nats_port: u16, pg_port: u16, fast: bool) -> anyhow::Result<Stack> {
        Self::up_tuned(name, nats_port, pg_port, fast, "")
    }

    /// [`Stack::up`] with Postgres settings of its own (`pg_conf`, one `name = value` a line:
    /// `SB_STACK_PG_CONF`), e.g. the memory a production server would give its buffers.
    pub fn up_tuned(
        name: &str,
        nats_port: u16,
        pg_port: u16,
        fast: bool,
        pg_conf: &str,
    ) -> anyhow::Result<Stack> {
        Self::up_with(name, nats_port, pg_port, fast, pg_conf, 1, false)
    }

    /// [`Stack::up_tuned`] with NATS as a JetStream cluster of `nodes` servers (1: one
    /// server; node i listens on `nats_port + i - 1`), fsyncing every JetStream write when
    /// `sync_always` (`sync_interval: always`).
    pub fn up_with(
        name: &str,
        nats_port: u16,
        pg_port: u16,
        fast: bool,
        pg_conf: &str,
        nodes: usize,
        sync_always: bool,
    ) -> anyhow::Result<Stack> {
        // A stack left from an interrupted run may have other settings: start from scratch.
        let _ = run(&["destroy", name], false);
        let out = run_with(
            &["up", name, &nats_port.to_string(), &pg_port.to_string()],
            fast,
            pg_conf,
            Some((nodes, sync_always)),
        )?;
        let exports: Vec<(String, String)> = out
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let var = |key: &str| {
            exports
                .iter()
                .find_map(|(k, v)| (k == key).then(|| v.clone()))
                .with_context(|| format!("stack up printed no {key}"))
        };
        let root = std::env::var_os("SB_STACK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_dir().join(".stack"));
        Ok(Stack {
            name: name.into(),
            nats_url: var("SB_NATS_URL")?,
            database_url: var("SB_DATABASE_URL")?,
            exports,
            dir: root.join(name),
        })
    }

    /// A variable `stack up` printed, as it printed it.
    pub fn var(&self, name: &str) -> Option<String> {
        self.exports
            .iter()
            .find_map(|(k, v)| (k == name).then(|| v.clone()))
    }

    pub fn down(&self) {
        if let Err(e) = run(&["down", &self.name], false) {
            eprintln!("warning: {e:#}");
        }
    }

    /// Stop one server (`nats` or `pg`) and start it again on the same ports and data.
    pub fn restart(&self, server: &str) -> anyhow::Result<()> {
        run(&["restart", &self.name, server], false).map(|_| ())
    }

    /// SIGKILL one server (`nats`: every NATS node; `nats-<i>`: node i of a cluster; or `pg`:
    /// the postmaster and every backend) and start it again on the same ports and data, so it
    /// comes back by crash recovery.
    pub fn crash(&self, server: &str) -> anyhow::Result<()> {
        run(&["crash", &self.name, server], false).map(|_| ())
    }

    /// A new, empty database on this stack's Postgres; returns its URL.
    pub async fn fresh_database(&self, prefix: &str) -> anyhow::Result<String> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&self.database_url).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        let (base, _) = self
            .database_url
            .rsplit_once('/')
            .context("database url has a path")?;
        Ok(format!("{base}/{name}"))
    }

    pub fn nats_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("nats/nats.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Postgres's folder (`PG_DIR` in the stack's `ports` file).
    fn postgres_dir(&self) -> Option<PathBuf> {
        let ports = std::fs::read_to_string(self.dir.join("ports")).ok()?;
        let pg_dir = ports.lines().find_map(|l| l.strip_prefix("PG_DIR="))?;
        Some(PathBuf::from(pg_dir))
    }

    /// The Postgres server's log.
    pub fn postgres_log(&self) -> Option<PathBuf> {
        Some(self.postgres_dir()?.join("postgres.log"))
    }

    /// The postmaster's pid (its children are the backends).
    pub fn postgres_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.postgres_dir()?.join("data/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}
