//! Runs a runner did not start, or did not see to their end: adopting a run an earlier runner
//! left going (its supervisor outlived it), keeping the outcome of one that ended while no
//! runner watched, and deciding what a call for a key without a kept outcome does (join, keep,
//! start, or start again after a run that provably died unfinished).
use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::watch;

use crate::rundir::{RunDir, Settled};
use crate::runs::{self, Found};
use crate::store::Outcome;
use crate::{Runner, Running};

/// What a call for a key without a kept outcome does.
pub(crate) enum Plan {
    /// Wait for the run in progress (this runner's, or one it adopted).
    Join(watch::Receiver<Option<Outcome>>),
    /// Its run has ended but its outcome was not kept (the runner died first): keep it now.
    Settle(RunDir, Settled),
    /// Run the engine, holding the run's lock; `rerun` when an earlier run of it died
    /// unfinished.
    Start {
        run: RunDir,
        lock: File,
        rerun: bool,
        done: watch::Sender<Option<Outcome>>,
        cancelled: Arc<AtomicBool>,
    },
    Busy,
}

impl Runner {
    pub(crate) fn run_dir(&self, key: &str) -> RunDir {
        RunDir::for_key(&self.config.state_dir, key)
    }

    /// Track `run` under `key` (the map's lock held by the caller) and who waits for it.
    pub(crate) fn track(
        running: &mut HashMap<String, Running>,
        key: &str,
        run: RunDir,
    ) -> (watch::Sender<Option<Outcome>>, Arc<AtomicBool>) {
        let (tx, rx) = watch::channel(None);
        let cancelled = Arc::new(AtomicBool::new(false));
        running.insert(
            key.to_string(),
            Running {
                run,
                cancelled: cancelled.clone(),
                done: rx,
            },
        );
        (tx, cancelled)
    }

    /// Wait for a run this runner did not start (its supervisor outlived an earlier runner),
    /// as if it had: one adopter per key, later calls join it. The map's lock held by the
    /// caller.
    pub(crate) fn adopt(
        &self,
        running: &mut HashMap<String, Running>,
        key: &str,
        run: RunDir,
    ) -> watch::Receiver<Option<Outcome>> {
        let (tx, _) = Self::track(running, key, run.clone());
        let rx = tx.subscribe();
        let spec = run.spec();
        // Its engine session is busy until it ends (taken now if free: at start nothing holds
        // it; adopted on a later call, another run of the session may).
        let session = spec.as_ref().and_then(|s| {
            self.session_lock(&s.agent, &s.session_id)
                .try_lock_owned()
                .ok()
        });
        tracing::info!(key, "adopting a run an earlier runner left going");
        metrics::counter!("sb_runner_adoptions_total").increment(1);
        let runner = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let _session = session;
            let outcome = match &spec {
                Some(spec) => {
                    let settled = runs::watch(&run, spec.timeout_s, None).await;
                    runs::outcome(&run, &settled, spec)
                }
                None => {
                    Outcome::failed("engine_failed", "the run's folder has no readable spec", "")
                }
            };
            let agent = spec.map(|s| s.agent).unwrap_or_default();
            runner.keep(&key, &run, &agent, &outcome);
            let _ = tx.send(Some(outcome));
            runner.running.lock().unwrap().remove(&key);
        });
        rx
    }

    /// Keep the outcome of an ended run whose runner died before it could; the outcome.
    pub(crate) fn settle(&self, key: &str, run: &RunDir, settled: &Settled) -> Outcome {
        let spec = run.spec();
        let outcome = match &spec {
            Some(spec) => runs::outcome(run, settled, spec),
            None => Outcome::failed("engine_failed", "the run's folder has no readable spec", ""),
        };
        self.keep(
            key,
            run,
            &spec.map(|s| s.agent).unwrap_or_default(),
            &outcome,
        );
        outcome
    }

    /// Store a run's outcome, then clear its folder; count it.
    pub(crate) fn keep(&self, key: &str, run: &RunDir, agent: &str, outcome: &Outcome) {
        if let Outcome::Failed {
            code,
            message,
            detail,
        } = outcome
        {
            // The one place the detail is told (the caller gets `message` only).
            tracing::warn!(key, agent, code, detail, "run failed: {message}");
        }
        match self.store.put(key, outcome) {
            Ok(()) => {
                if let Err(e) = run.remove() {
                    tracing::warn!(error = %e, "could not remove a finished run's folder");
                }
            }
            Err(e) => tracing::error!(error = %e, "could not store a run's outcome"),
        }
        let label = match outcome {
            Outcome::Answered(_) => "answered",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed { code, .. } if code == "engine_timeout" => "timeout",
            Outcome::Failed { .. } => "failed",
        };
        metrics::counter!("sb_runner_runs_total", "agent" => agent.to_string(), "outcome" => label)
            .increment(1);
    }

    /// What a call for `key` (not in progress here, no kept outcome) does. The map's lock held.
    pub(crate) fn plan(
        &self,
        running: &mut HashMap<String, Running>,
        key: &str,
    ) -> std::io::Result<Plan> {
        let run = self.run_dir(key);
        let (lock, rerun) = match runs::find(&run)? {
            Found::Alive => return Ok(Plan::Join(self.adopt(running, key, run))),
            Found::Dead(lock, Settled::NeverStarted) => (lock, false),
            Found::Dead(lock, Settled::DiedUnfinished) => (lock, true),
            Found::Dead(_, settled) => return Ok(Plan::Settle(run, settled)),
            Found::Absent => {
                crate::rundir::private_dir(run.path())?;
                match run.try_lock()? {
                    Some(lock) => (lock, false),
                    None => return Ok(Plan::Join(self.adopt(running, key, run))),
                }
            }
        };
        if running.len() >= self.config.max_running {
            return Ok(Plan::Busy);
        }
        // What an earlier attempt left (its lock is ours now, so nothing of it runs).
        run.kill();
        run.clear()?;
        let (done, cancelled) = Self::track(running, key, run.clone());
        Ok(Plan::Start {
            run,
            lock,
            rerun,
            done,
            cancelled,
        })
    }

    /// Runs left going by an earlier runner on this state folder: adopt those still going,
    /// keep the outcome of those that ended. (One that died unfinished waits for its retry.)
    pub fn adopt_orphans(&self) {
        for run in runs::all(&self.config.state_dir) {
            let Some(key) = run.spec().map(|s| s.key) else {
                continue;
            };
            if matches!(self.store.get(&key), Ok(Some(_))) {
                if !run.is_alive() {
                    let _ = run.remove();
                }
                continue;
            }
            let mut running = self.running.lock().unwrap();
            if running.contains_key(&key) {
                continue;
            }
            match runs::find(&run) {
                Ok(Found::Alive) => {
                    self.adopt(&mut running, &key, run);
                }
                Ok(Found::Dead(_, Settled::NeverStarted | Settled::DiedUnfinished))
                | Ok(Found::Absent) => {}
                Ok(Found::Dead(_, settled)) => {
                    drop(running);
                    self.settle(&key, &run, &settled);
                }
                Err(e) => tracing::warn!(error = %e, key, "could not read a run's folder"),
            }
        }
    }
}
