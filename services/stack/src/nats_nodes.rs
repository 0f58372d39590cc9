//! A stack's NATS servers as processes: one, or the nodes of a JetStream cluster
//! ([`crate::nats_cluster`]). Starting them (every node spawned before any is waited for: a
//! cluster node's JetStream needs its peers), checking, stopping and crashing them, all at once
//! or one node.
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::commands::Stack;
use crate::credentials;
use crate::layout::NatsNodeFiles;
use crate::nats::{ConfInput, PRODUCT_ACCOUNT, render_conf, render_node_conf, settings_line};
use crate::nats_cluster::{ClusterNode, NodePorts, meta_leader, node_ports};
use crate::pins::NATS_VERSION;
use crate::sys::{self, command};
use crate::{Error, Result, log, warn};

/// One NATS server of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsNode {
    /// 1-based.
    pub index: u16,
    /// How many the stack has (1: a single server, no cluster).
    pub of: u16,
    pub files: NatsNodeFiles,
    /// `None` when the `ports` file has no NATS ports.
    pub ports: Option<NodePorts>,
}

impl NatsNode {
    /// How messages name it: `NATS` (a single server, as always) or `NATS node 2`.
    pub fn label(&self) -> String {
        if self.clustered() {
            format!("NATS node {}", self.index)
        } else {
            "NATS".into()
        }
    }

    pub fn clustered(&self) -> bool {
        self.of > 1
    }

    /// The ports it listens on (a single server has no route port).
    fn listens_on(&self) -> Vec<u16> {
        self.ports.map_or_else(Vec::new, |p| {
            if self.clustered() {
                vec![p.client, p.monitor, p.route]
            } else {
                vec![p.client, p.monitor]
            }
        })
    }
}

/// Node `node`'s monitoring `path` (e.g. `/healthz?js-enabled-only=true`) answers 2xx/3xx.
fn monitor_answers(node: &NatsNode, path: &str) -> bool {
    node.ports.is_some_and(|p| {
        crate::http::answers(
            &format!("http://127.0.0.1:{}{path}", p.monitor),
            Duration::from_secs(2),
        )
    })
}

impl Stack {
    /// Node `index` (1-based) of the stack's NATS, as the `ports` file describes it.
    pub fn nats_node(&self, index: u16) -> NatsNode {
        let of = self.state.nats_nodes();
        let ports = match (self.state.nats_port, self.state.nats_monitor_port) {
            (Some(p), Some(m)) => node_ports(p, m, index),
            _ => None,
        };
        NatsNode {
            index,
            of,
            files: self.paths.nats_node(index),
            ports,
        }
    }

    /// Every node (one for a single server).
    pub fn nats_nodes(&self) -> Vec<NatsNode> {
        (1..=self.state.nats_nodes())
            .map(|i| self.nats_node(i))
            .collect()
    }

    /// Node `index` as `restart`/`crash nats-<i>` name it: an error naming the size past it.
    pub fn checked_nats_node(&self, index: u16) -> Result<NatsNode> {
        let of = self.state.nats_nodes();
        if index == 0 || index > of {
            let name = &self.paths.name;
            return Err(Error::Usage(if of == 1 {
                format!(
                    "stack '{name}' runs a single NATS server (no cluster), so there is no nats-{index}; nats or nats-1 is that server"
                )
            } else {
                format!(
                    "stack '{name}' runs a NATS cluster of {of} nodes (nats-1 to nats-{of}); there is no nats-{index}"
                )
            }));
        }
        Ok(self.nats_node(index))
    }

    fn ports_of(&self, node: &NatsNode) -> Result<NodePorts> {
        node.ports.ok_or_else(|| {
            Error::failed(format!(
                "stack '{}' has no NATS ports in {}",
                self.paths.name,
                self.paths.ports.display()
            ))
        })
    }

    /// The pid in the node's pid file, if it holds one.
    pub fn node_pid(&self, node: &NatsNode) -> Option<i32> {
        let text = std::fs::read_to_string(&node.files.pid).ok()?;
        let text = text.trim_end_matches('\n');
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok()
    }

    /// Alive, and started with this node's config file.
    fn node_pid_is_ours(&self, node: &NatsNode, pid: i32) -> bool {
        // A command line that cannot be read: trust the pid file.
        sys::pid_alive(pid) && sys::cmdline_has(pid, &node.files.conf).unwrap_or(true)
    }

    pub fn node_running(&self, node: &NatsNode) -> bool {
        self.node_pid(node)
            .is_some_and(|pid| self.node_pid_is_ours(node, pid))
    }

    /// Any node runs.
    pub fn nats_running(&self) -> bool {
        self.nats_nodes().iter().any(|n| self.node_running(n))
    }

    /// It answers its health check with JetStream enabled; a cluster node must also know the
    /// JetStream meta leader and be current with it, so that streams can be made (at R3) as
    /// soon as `up` returns.
    pub fn node_healthy(&self, node: &NatsNode) -> bool {
        monitor_answers(node, "/healthz?js-enabled-only=true")
            && (!node.clustered() || monitor_answers(node, "/healthz?js-meta-only=true"))
    }

    /// Every node is healthy.
    pub fn nats_healthy(&self) -> bool {
        self.nats_nodes().iter().all(|n| self.node_healthy(n))
    }

    /// The config every running node runs with has the current credentials and prefixes.
    pub fn nats_creds_current(&self) -> bool {
        let Ok(fingerprint) = credentials::fingerprint(&self.paths.cred_file) else {
            return false;
        };
        let line = settings_line(
            &fingerprint,
            &self.state.nats_prefixes,
            &self.state.analytics_prefix,
        );
        self.nats_nodes()
            .iter()
            .filter(|n| self.node_running(n))
            .all(|n| {
                std::fs::read_to_string(&n.files.conf)
                    .is_ok_and(|conf| conf.lines().any(|l| l == line))
            })
    }

    fn write_node_conf(&self, node: &NatsNode, ports: NodePorts) -> Result<()> {
        sys::mkdir_p(&self.paths.nats_dir)?;
        sys::chmod(&self.paths.nats_dir, 0o700)?; // the configs hold the passwords
        let credentials = self
            .creds
            .as_ref()
            .ok_or_else(|| Error::failed("write_nats_conf: no credentials loaded"))?;
        let fingerprint = credentials::fingerprint(&self.paths.cred_file)?;
        let readers = crate::readers::load(&self.readers_file())?;
        let input = ConfInput {
            name: &self.paths.name,
            nats_port: ports.client,
            monitor_port: ports.monitor,
            pid_file: &node.files.pid,
            store_dir: &node.files.store_dir,
            cred_dir: &self.paths.cred_dir,
            credentials,
            fingerprint: &fingerprint,
            prefixes: &self.state.nats_prefixes,
            analytics: &self.state.analytics_prefix,
            sync_always: self.state.nats_sync_always,
            readers: &readers,
        };
        let conf = if node.clustered() {
            let route_ports = self
                .nats_nodes()
                .iter()
                .map(|n| self.ports_of(n).map(|p| p.route))
                .collect::<Result<Vec<u16>>>()?;
            render_node_conf(
                &input,
                &ClusterNode {
                    node: node.index,
                    route_ports,
                },
            )?
        } else {
            render_conf(&input)?
        };
        sys::private_write(&node.files.conf, &conf)
    }

    /// The event readers' list (`crate::readers`), beside the configs.
    pub fn readers_file(&self) -> std::path::PathBuf {
        self.paths.nats_dir.join("readers")
    }

    /// Rewrite every node's config and have each running node reload it (SIGHUP: clients stay
    /// connected); how many reloaded.
    ///
    /// Each node reloads twice: nats-server 2.15 leaves the service imports of an account that
    /// a reload adds unanswered (a new reader's fetch gets "no responders") until the next
    /// reload, which resolves them against the exports now in place.
    pub fn reload_nats_confs(&self) -> Result<usize> {
        let mut reloaded = 0;
        for node in self.nats_nodes() {
            let ports = self.ports_of(&node)?;
            self.write_node_conf(&node, ports)?;
            if let Some(pid) = self
                .node_pid(&node)
                .filter(|p| self.node_pid_is_ours(&node, *p))
            {
                for _ in 0..2 {
                    self.reload_node(&node, pid)?;
                }
                reloaded += 1;
            }
        }
        Ok(reloaded)
    }

    /// SIGHUP node `node` (pid `pid`) and wait (up to 10 s) until its monitoring port shows a
    /// later config load time: the server reloads asynchronously.
    fn reload_node(&self, node: &NatsNode, pid: i32) -> Result<()> {
        let loaded = || {
            node.ports.and_then(|p| {
                let varz = crate::http::get(
                    &format!("http://127.0.0.1:{}/varz", p.monitor),
                    Duration::from_secs(2),
                )
                .ok()?;
                config_load_time(&String::from_utf8_lossy(&varz))
            })
        };
        let before = loaded();
        if !sys::kill(pid, libc::SIGHUP) {
            return Err(Error::failed(format!(
                "could not signal {} (pid {pid}) to reload its config",
                node.label()
            )));
        }
        if before.is_some()
            && !sys::wait_until(Duration::from_secs(10), || {
                loaded().is_some_and(|t| Some(t) != before)
            })
        {
            return Err(Error::server(
                format!("{} did not reload its config within 10s", node.label()),
                &node.files.log,
            ));
        }
        Ok(())
    }

    /// Start nats-server for `node` detached (its own session, SIGHUP ignored: it outlives the
    /// caller), without waiting for it; its pid.
    fn spawn_node(&mut self, node: &NatsNode) -> Result<i32> {
        let ports = self.ports_of(node)?;
        let name = self.paths.name.clone();
        for p in node.listens_on() {
            if sys::port_in_use(p) {
                return Err(Error::failed(format!(
                    "127.0.0.1:{p} is already in use by another process (needed by {} for stack '{name}')",
                    node.label()
                )));
            }
        }
        self.write_node_conf(node, ports)?;
        if !node.clustered() && adopt_global_store(&node.files.store_dir)? {
            log!(
                "NATS: moved the streams of {} from the global account ($G) to account {PRODUCT_ACCOUNT} (its users now have accounts of their own)",
                node.files.store_dir.display()
            );
        }
        sys::remove_file(&node.files.pid);
        let log_path = &node.files.log;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| Error::io("writing", log_path, e))?;
        let which = if node.clustered() {
            format!(", node {} of {}", node.index, node.of)
        } else {
            String::new()
        };
        let _ = write!(
            log,
            "\n==== {}: starting nats-server{which} (stack up {name}) ====\n",
            sys::utc_timestamp()
        );
        self.started_nats.push(node.index);
        if node.clustered() {
            log!(
                "starting NATS {NATS_VERSION} node {} of {} on 127.0.0.1:{} (monitoring 127.0.0.1:{}, routes 127.0.0.1:{})",
                node.index,
                node.of,
                ports.client,
                ports.monitor,
                ports.route
            );
        } else {
            log!(
                "starting NATS {NATS_VERSION} on 127.0.0.1:{} (monitoring 127.0.0.1:{})",
                ports.client,
                ports.monitor
            );
        }
        let stderr = log
            .try_clone()
            .map_err(|e| Error::io("writing", log_path, e))?;
        let mut cmd = command(&self.cache.nats_bin);
        cmd.arg("-c")
            .arg(&node.files.conf)
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
        std::fs::write(&node.files.pid, format!("{pid}\n"))
            .map_err(|e| Error::io("writing", &node.files.pid, e))?;
        Ok(pid)
    }

    /// Start every node that is not running and wait until each is healthy.
    pub fn start_nats(&mut self) -> Result<()> {
        let stopped: Vec<NatsNode> = self
            .nats_nodes()
            .into_iter()
            .filter(|n| !self.node_running(n))
            .collect();
        self.start_nodes(&stopped)
    }

    /// Spawn `nodes`, all of them first (a cluster node cannot be healthy before a quorum of
    /// its peers runs), then wait until each is healthy. On a failure the ones it spawned are
    /// stopped again.
    pub fn start_nodes(&mut self, nodes: &[NatsNode]) -> Result<()> {
        let mut spawned: Vec<(NatsNode, i32)> = Vec::new();
        for node in nodes {
            match self.spawn_node(node) {
                Ok(pid) => spawned.push((node.clone(), pid)),
                Err(e) => {
                    self.stop_spawned(&spawned);
                    return Err(e);
                }
            }
        }
        self.wait_healthy(&spawned)
    }

    fn stop_spawned(&self, spawned: &[(NatsNode, i32)]) {
        let nodes: Vec<NatsNode> = spawned.iter().map(|(n, _)| n.clone()).collect();
        self.stop_nodes(&nodes);
    }

    /// Wait (`SB_STACK_TIMEOUT`) until every node just spawned answers its health check.
    fn wait_healthy(&self, spawned: &[(NatsNode, i32)]) -> Result<()> {
        let timeout_s = self.settings.timeout_s;
        let deadline = Instant::now() + Duration::from_secs(timeout_s);
        let mut waiting: Vec<&(NatsNode, i32)> = spawned.iter().collect();
        loop {
            waiting.retain(|(node, _)| !self.node_healthy(node));
            let Some(&(first, _)) = waiting.first() else {
                break;
            };
            sys::check_interrupted()?;
            for (node, pid) in &waiting {
                if sys::pid_alive(*pid) {
                    continue;
                }
                let other = self.node_pid(node);
                if other.is_none_or(|p| p == *pid || !sys::pid_alive(p)) {
                    sys::remove_file(&node.files.pid);
                    self.stop_spawned(spawned);
                    return Err(Error::server(
                        format!("{} exited during startup", node.label()),
                        &node.files.log,
                    ));
                }
            }
            if Instant::now() >= deadline {
                self.stop_spawned(spawned);
                let msg = if first.clustered() {
                    format!(
                        "{} was not healthy (JetStream enabled, current with a meta leader) within {timeout_s}s (stopped the nodes this command started)",
                        first.label()
                    )
                } else {
                    format!("NATS was not healthy within {timeout_s}s (stopped it again)")
                };
                return Err(Error::server(msg, &first.files.log));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for (node, pid) in spawned {
            let pid = self.node_pid(node).unwrap_or(*pid);
            if node.clustered() {
                let leader = node
                    .ports
                    .and_then(|p| {
                        crate::http::get(
                            &format!("http://127.0.0.1:{}/jsz", p.monitor),
                            Duration::from_secs(2),
                        )
                        .ok()
                    })
                    .and_then(|body| meta_leader(&String::from_utf8_lossy(&body)))
                    .unwrap_or_else(|| "known".into());
                log!(
                    "NATS node {} is ready (JetStream enabled, meta leader {leader}), pid {pid}",
                    node.index
                );
            } else {
                log!("NATS is ready (JetStream enabled), pid {pid}");
            }
        }
        Ok(())
    }

    /// SIGTERM the nodes (together: a cluster's nodes go down at once), SIGKILL what still
    /// runs 15 s later, and remove their pid files.
    pub fn stop_nodes(&self, nodes: &[NatsNode]) {
        let mut stopping: Vec<(&NatsNode, i32)> = Vec::new();
        for node in nodes {
            match self.node_pid(node) {
                Some(pid) if self.node_pid_is_ours(node, pid) => {
                    log!("stopping {} (pid {pid})", node.label());
                    sys::kill(pid, libc::SIGTERM);
                    stopping.push((node, pid));
                }
                _ => sys::remove_file(&node.files.pid),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for (node, pid) in stopping {
            let left = deadline.saturating_duration_since(Instant::now());
            if !sys::wait_until(left, || !sys::pid_alive(pid)) {
                warn!("{} did not stop within 15s; sending SIGKILL", node.label());
                sys::kill(pid, libc::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
            }
            sys::remove_file(&node.files.pid);
        }
    }

    /// Stop every node.
    pub fn stop_nats(&self) {
        self.stop_nodes(&self.nats_nodes());
    }

    /// After its SIGKILL: wait until the node's process is gone and its ports are free.
    fn kill_node(&self, node: &NatsNode, pid: i32, started: Option<&str>) -> Result<()> {
        let gone = sys::wait_until(Duration::from_secs(30), || !sys::same_alive(pid, started));
        if !gone {
            return Err(Error::failed(format!(
                "{} (pid {pid}) still alive 30s after SIGKILL",
                node.label()
            )));
        }
        sys::wait_ports_released(&node.listens_on());
        sys::remove_file(&node.files.pid);
        Ok(())
    }

    /// SIGKILL every node at once (as a power cut would) and start them all again on the same
    /// ports and data.
    pub fn crash_nats(&mut self) -> Result<()> {
        let nodes = self.nats_nodes();
        let mut had_pid = false;
        let mut killed = Vec::new();
        for node in &nodes {
            let Some(pid) = self.node_pid(node) else {
                continue;
            };
            had_pid = true;
            // A pid file left by a dead server: nothing to kill (its pid may be another's now).
            if self.node_pid_is_ours(node, pid) {
                let started = sys::start_time(pid);
                log!("SIGKILL {} (pid {pid})", node.label());
                sys::kill(pid, libc::SIGKILL);
                killed.push((node, pid, started));
            } else {
                sys::remove_file(&node.files.pid);
            }
        }
        if !had_pid {
            return Err(Error::failed(format!(
                "NATS of stack '{}' is not running",
                self.paths.name
            )));
        }
        for (node, pid, started) in &killed {
            self.kill_node(node, *pid, started.as_deref())?;
        }
        self.start_nodes(&nodes)
    }

    /// SIGKILL node `index` alone and start it again on the same ports and data; it rejoins
    /// the cluster (catching up from its peers).
    pub fn crash_nats_node(&mut self, index: u16) -> Result<()> {
        let node = self.checked_nats_node(index)?;
        let running = self
            .node_pid(&node)
            .filter(|pid| self.node_pid_is_ours(&node, *pid));
        let Some(pid) = running else {
            return Err(Error::failed(format!(
                "{} of stack '{}' is not running",
                node.label(),
                self.paths.name
            )));
        };
        log!("SIGKILL {} (pid {pid})", node.label());
        let started = sys::start_time(pid);
        sys::kill(pid, libc::SIGKILL);
        self.kill_node(&node, pid, started.as_deref())?;
        self.start_nodes(std::slice::from_ref(&node))
    }

    /// Stop node `index` and start it again on the same ports and data.
    pub fn restart_nats_node(&mut self, index: u16) -> Result<()> {
        let node = self.checked_nats_node(index)?;
        self.stop_nodes(std::slice::from_ref(&node));
        self.start_nodes(std::slice::from_ref(&node))
    }
}

/// The value of `"config_load_time"` in a server's /varz.
fn config_load_time(varz: &str) -> Option<String> {
    let after_key = &varz[varz.find("\"config_load_time\"")? + "\"config_load_time\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let value = value.strip_prefix('"')?;
    Some(value[..value.find('"')?].to_string())
}

/// A single server's streams made before its users had accounts (permissions v4 and older)
/// sit in the global account's folder, `<store_dir>/jetstream/$G`; the product's account
/// (`SWITCHBOARD`) finds them only in a folder of its own name. Moved there (NATS stopped),
/// so a stack keeps its streams; true when it moved them. A cluster's nodes also record their
/// streams' account in the replicated meta state, which a move cannot change: a cluster made
/// before is made again (`stack down` and remove its data, or `switchboard backup`/`restore`).
pub fn adopt_global_store(store_dir: &std::path::Path) -> Result<bool> {
    let jetstream = store_dir.join("jetstream");
    let global = jetstream.join("$G");
    let product = jetstream.join(PRODUCT_ACCOUNT);
    if !global.is_dir() || product.exists() {
        return Ok(false);
    }
    std::fs::rename(&global, &product).map_err(|e| Error::io("renaming", &global, e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_servers_global_streams_move_to_the_product_account_once() {
        let dir = std::env::temp_dir().join(format!("sb-adopt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Nothing yet: nothing moves.
        assert!(!adopt_global_store(&dir).unwrap());
        let stream = dir.join("jetstream/$G/streams/SB_WORK");
        std::fs::create_dir_all(&stream).unwrap();
        std::fs::write(stream.join("meta.inf"), "{}").unwrap();
        assert!(adopt_global_store(&dir).unwrap());
        assert!(
            dir.join("jetstream/SWITCHBOARD/streams/SB_WORK/meta.inf")
                .is_file()
        );
        assert!(!dir.join("jetstream/$G").exists());
        // A $G made later (a server started with an old config) never overwrites the account.
        std::fs::create_dir_all(dir.join("jetstream/$G/streams/OTHER")).unwrap();
        assert!(!adopt_global_store(&dir).unwrap());
        assert!(dir.join("jetstream/SWITCHBOARD/streams/SB_WORK").is_dir());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_config_load_time_is_read_from_varz() {
        let varz = "{\n  \"config_load_time\": \"2026-11-29T07:11:51.612879712Z\",\n  \"x\": 1}";
        assert_eq!(
            config_load_time(varz).as_deref(),
            Some("2026-11-29T07:11:51.612879712Z")
        );
        assert_eq!(config_load_time("{}"), None);
    }
}
