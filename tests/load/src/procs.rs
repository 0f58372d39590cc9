//! Worker processes (one binary per stage, each with its own configuration file) and what
//! `/proc` says about any process: CPU time, resident and peak memory.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::{Child, Command};

/// Where the `switchboard` binary is: next to this executable (a `bin` target), or one level up
/// (a test binary in `target/<profile>/deps`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.join("switchboard").exists() {
        return dir;
    }
    dir.parent().map(Path::to_path_buf).unwrap_or(dir)
}

pub struct Worker {
    /// `gateway` (`switchboard gateway`), `up` (everything in one process) or a worker
    /// (`switchboard worker <name>`): `identify`, `session`, `dispatch`, `log`, `deliver`.
    pub name: String,
    pub instance: usize,
    pub config: PathBuf,
    child: Option<Child>,
    /// SIGKILLs sent by the orchestrator.
    pub kills: u32,
    /// Times the process exited by itself (and was restarted).
    pub self_exits: u32,
    pub exit_notes: Vec<String>,
}

impl Worker {
    pub fn label(&self) -> String {
        format!("{}-{}", self.name, self.instance)
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }
}

/// A set of worker processes, restarted like an orchestrator would.
pub struct Workers {
    bin_dir: PathBuf,
    log_dir: PathBuf,
    pub list: Vec<Worker>,
}

impl Workers {
    pub fn new(log_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(log_dir)?;
        let bin_dir = bin_dir();
        let bin = bin_dir.join("switchboard");
        if !bin.exists() {
            bail!(
                "{} is missing: build it first (cargo build --workspace --bins)",
                bin.display()
            );
        }
        Ok(Self {
            bin_dir,
            log_dir: log_dir.to_path_buf(),
            list: Vec::new(),
        })
    }

    fn start(&self, name: &str, instance: usize, config: &Path) -> anyhow::Result<Child> {
        let log_path = self.log_dir.join(format!("{name}-{instance}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut cmd = Command::new(self.bin_dir.join("switchboard"));
        match name {
            // The gateway alone, or everything in one process.
            "gateway" | "up" => {
                cmd.arg(name);
            }
            _ => {
                cmd.args(["worker", name]);
            }
        }
        // The file is the whole configuration: drop SB_* overrides from the environment.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SB_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("SB_CONFIG", config)
            .env(
                "RUST_LOG",
                std::env::var("SB_LOAD_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        cmd.spawn()
            .with_context(|| format!("starting switchboard {name}"))
    }

    /// Start one more worker process; returns its index.
    pub fn spawn(&mut self, name: &str, config: &Path) -> anyhow::Result<usize> {
        let instance = self.list.iter().filter(|w| w.name == name).count();
        let child = self.start(name, instance, config)?;
        self.list.push(Worker {
            name: name.into(),
            instance,
            config: config.to_path_buf(),
            child: Some(child),
            kills: 0,
            self_exits: 0,
            exit_notes: Vec::new(),
        });
        Ok(self.list.len() - 1)
    }

    /// SIGKILL worker `i` and start it again right away.
    pub async fn kill_and_restart(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut c) = self.list[i].child.take() {
            let _ = c.kill().await;
        }
        self.list[i].kills += 1;
        let w = &self.list[i];
        let (name, instance, config) = (w.name.clone(), w.instance, w.config.clone());
        let child = self.start(&name, instance, &config)?;
        self.list[i].child = Some(child);
        Ok(())
    }

    /// Replace worker `i` as a rolling upgrade does: SIGTERM, wait for it to drain and exit
    /// (SIGKILL after `grace`), start the new one. Returns how long the old one took to exit
    /// and whether it exited by itself within `grace`.
    pub async fn terminate_and_restart(
        &mut self,
        i: usize,
        grace: Duration,
    ) -> anyhow::Result<(Duration, bool)> {
        let started = std::time::Instant::now();
        let mut clean = true;
        if let Some(mut c) = self.list[i].child.take() {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            if tokio::time::timeout(grace, c.wait()).await.is_err() {
                clean = false;
                let _ = c.kill().await;
            }
        }
        let drained = started.elapsed();
        let w = &self.list[i];
        let (name, instance, config) = (w.name.clone(), w.instance, w.config.clone());
        let child = self.start(&name, instance, &config)?;
        self.list[i].child = Some(child);
        Ok((drained, clean))
    }

    /// Restart every worker that exited on its own; returns their labels.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let mut restarted = Vec::new();
        for i in 0..self.list.len() {
            let exited = match self.list[i].child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(e.to_string()),
                None => Some("not running".into()),
            };
            if let Some(status) = exited {
                let w = &mut self.list[i];
                w.self_exits += 1;
                w.exit_notes.push(format!("{} at {:.1}s", status, secs()));
                restarted.push(w.label());
                let (name, instance, config) = (w.name.clone(), w.instance, w.config.clone());
                let child = self.start(&name, instance, &config)?;
                self.list[i].child = Some(child);
            }
        }
        Ok(restarted)
    }

    /// Processes that have exited and not been restarted.
    pub fn dead(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for w in &mut self.list {
            if let Some(c) = w.child.as_mut()
                && !matches!(c.try_wait(), Ok(None))
            {
                dead.push(w.label());
            }
        }
        dead
    }

    pub fn pids(&self) -> Vec<(String, u32)> {
        self.list
            .iter()
            .filter_map(|w| w.pid().map(|p| (w.label(), p)))
            .collect()
    }

    /// SIGTERM everything and wait (bounded), then SIGKILL what is left.
    pub async fn stop_all(&mut self) {
        for w in &self.list {
            if let Some(pid) = w.pid() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
        for w in &mut self.list {
            if let Some(mut c) = w.child.take()
                && tokio::time::timeout(Duration::from_secs(5), c.wait())
                    .await
                    .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}

fn secs() -> f64 {
    super::now_us() as f64 / 1e6
}

// ---- /proc -------------------------------------------------------------------------------

/// Clock ticks per second of `/proc/<pid>/stat` times.
pub fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

struct Stat {
    ppid: u32,
    /// utime + stime, seconds.
    cpu: f64,
    /// cutime + cstime (children that exited and were waited for), seconds.
    children_cpu: f64,
}

fn stat(pid: u32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let tck = clk_tck();
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        cpu: (n(11)? + n(12)?) / tck,
        children_cpu: (n(13)? + n(14)?) / tck,
    })
}

/// utime + stime of one process, in seconds.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    stat(pid).map(|s| s.cpu)
}

/// The pids whose parent is `ppid`.
pub fn children(ppid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|s| s.ppid == ppid))
        .collect()
}

/// CPU seconds of a process and all its children, living or reaped (for Postgres: the
/// postmaster and its backends).
pub fn tree_cpu_secs(pid: u32) -> Option<f64> {
    let root = stat(pid)?;
    Some(root.cpu + root.children_cpu + children(pid).into_iter().filter_map(cpu_secs).sum::<f64>())
}

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Peak resident set (`VmHWM`), kB.
pub fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM")
}

/// Current resident set (`VmRSS`), kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS")
}

/// Proportional set size (shared pages divided among their users), kB: the honest way to add
/// up Postgres' processes, which share one buffer pool.
pub fn pss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// PSS of a process and its children, kB.
pub fn tree_pss_kb(pid: u32) -> u64 {
    pss_kb(pid).unwrap_or(0) + children(pid).into_iter().filter_map(pss_kb).sum::<u64>()
}

/// Peak memory seen by a [`MemorySampler`], MB.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryPeaks {
    /// Highest sum over the sample of workers (RSS) + NATS (RSS) + Postgres (PSS of all its
    /// processes): the whole stack's memory, without the harness.
    pub stack_mb: f64,
    pub workers_mb: f64,
    pub nats_mb: f64,
    pub postgres_mb: f64,
    /// The harness (load generator and fakes), for reference.
    pub harness_mb: f64,
    pub samples: usize,
}

/// Samples memory every half second until dropped or stopped.
pub struct MemorySampler {
    peaks: Arc<Mutex<MemoryPeaks>>,
    task: tokio::task::JoinHandle<()>,
}

impl MemorySampler {
    pub fn start(worker_pids: Vec<u32>, nats: Option<u32>, postgres: Option<u32>) -> Self {
        let peaks = Arc::new(Mutex::new(MemoryPeaks::default()));
        let p = peaks.clone();
        let task = tokio::spawn(async move {
            loop {
                let (workers, nats, pg, me) = tokio::task::spawn_blocking({
                    let worker_pids = worker_pids.clone();
                    move || {
                        let w: u64 = worker_pids.iter().filter_map(|p| rss_kb(*p)).sum();
                        let n = nats.and_then(rss_kb).unwrap_or(0);
                        let g = postgres.map(tree_pss_kb).unwrap_or(0);
                        let me = rss_kb(std::process::id()).unwrap_or(0);
                        (w, n, g, me)
                    }
                })
                .await
                .unwrap_or_default();
                {
                    let mb = |kb: u64| kb as f64 / 1024.0;
                    let mut pk = p.lock().unwrap();
                    pk.stack_mb = pk.stack_mb.max(mb(workers + nats + pg));
                    pk.workers_mb = pk.workers_mb.max(mb(workers));
                    pk.nats_mb = pk.nats_mb.max(mb(nats));
                    pk.postgres_mb = pk.postgres_mb.max(mb(pg));
                    pk.harness_mb = pk.harness_mb.max(mb(me));
                    pk.samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { peaks, task }
    }

    pub fn stop(self) -> MemoryPeaks {
        self.task.abort();
        self.peaks.lock().unwrap().clone()
    }
}

/// CPU seconds of each process of interest at one moment.
#[derive(Debug, Clone, Default)]
pub struct CpuSnapshot {
    pub workers: BTreeMap<String, f64>,
    pub nats: f64,
    pub postgres: f64,
    pub harness: f64,
}

impl CpuSnapshot {
    pub fn take(workers: &[(String, u32)], nats: Option<u32>, postgres: Option<u32>) -> Self {
        Self {
            workers: workers
                .iter()
                .map(|(l, p)| (l.clone(), cpu_secs(*p).unwrap_or(0.0)))
                .collect(),
            nats: nats.and_then(cpu_secs).unwrap_or(0.0),
            postgres: postgres.and_then(tree_cpu_secs).unwrap_or(0.0),
            harness: cpu_secs(std::process::id()).unwrap_or(0.0),
        }
    }

    /// What was spent between `self` and `later`.
    pub fn delta(&self, later: &CpuSnapshot) -> CpuSnapshot {
        CpuSnapshot {
            workers: later
                .workers
                .iter()
                .map(|(k, v)| (k.clone(), v - self.workers.get(k).copied().unwrap_or(0.0)))
                .collect(),
            nats: later.nats - self.nats,
            postgres: later.postgres - self.postgres,
            harness: later.harness - self.harness,
        }
    }

    pub fn workers_total(&self) -> f64 {
        self.workers.values().sum()
    }
}
