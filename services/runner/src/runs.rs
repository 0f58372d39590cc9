//! Runs in their folders, the runner's side: find what a key's folder holds, start a run
//! through a supervisor, watch one to its end (started here, or adopted from a runner that
//! died), and read its outcome from the folder.
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::RunResponse;
use crate::engine::{self, EngineError};
use crate::rundir::{self, Mark, RunDir, Settled, Spec};
use crate::store::Outcome;

/// How long past its timeout a run may go before the runner kills it itself (its supervisor
/// kills it at the timeout; this is for a supervisor that cannot).
const GRACE_MS: u64 = 5_000;
const POLL: Duration = Duration::from_millis(100);

/// What a key's run folder holds.
pub enum Found {
    /// No folder: the key never ran here (or its outcome is kept and the folder cleaned up).
    Absent,
    /// Its supervisor is alive: wait for it.
    Alive,
    /// Nothing runs it any more: its lock (now held by the caller) and how it ended.
    Dead(File, Settled),
}

pub fn find(run: &RunDir) -> std::io::Result<Found> {
    if !run.exists() {
        return Ok(Found::Absent);
    }
    Ok(match run.try_lock()? {
        None => Found::Alive,
        Some(lock) => Found::Dead(lock, run.settled()),
    })
}

/// Every run folder under `state_dir`.
pub fn all(state_dir: &Path) -> Vec<RunDir> {
    std::fs::read_dir(state_dir.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| RunDir::at(e.path()))
        .collect()
}

/// Start `spec` through `exe supervise <folder>` in its own session, handing it `lock` (as
/// its stdin) so the run is never unlocked while it goes on. The supervisor is reaped by a
/// task; nothing kills it when this runner dies. What it gives: word when the supervisor has
/// exited (so [`watch`] need not wait for its next look).
pub fn start(
    run: &RunDir,
    lock: File,
    spec: &Spec,
    prompt: &str,
    exe: &Path,
) -> Result<oneshot::Receiver<()>, EngineError> {
    rundir::private_file(&run.file("prompt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, prompt.as_bytes()))
        .map_err(EngineError::Prompt)?;
    run.write_spec(spec).map_err(EngineError::State)?;
    let log = rundir::private_file(&run.file("supervisor.log")).map_err(EngineError::State)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("supervise")
        .arg(run.path())
        // This turn's credentials reach the engine through the environment (inherited through
        // the supervisor), and only this turn's: none left over from the runner's own.
        .env_remove(engine::TURN_TOKEN_ENV)
        .env_remove(engine::API_URL_ENV)
        .envs(&spec.turn_env)
        .stdin(Stdio::from(lock))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    // SAFETY: setsid(2) is async-signal-safe. Its own session and group: a signal to the
    // runner's group (a terminal's ^C) does not reach it, and a kill of its group reaches all.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(EngineError::Spawn)?;
    let (exited, wake) = oneshot::channel();
    tokio::spawn(async move {
        let _ = child.wait().await;
        let _ = exited.send(());
    });
    Ok(wake)
}

/// Wait until nothing runs `run` any more; how it ended. Kills it when it is marked cancelled
/// (a cancel may come before its group exists) and when it runs past its timeout, counted
/// from its recorded start, with a margin.
pub async fn watch(
    run: &RunDir,
    timeout_s: u64,
    mut exited: Option<oneshot::Receiver<()>>,
) -> Settled {
    loop {
        if !run.is_alive() || run.exit().is_some() {
            // Ended (with an exit recorded, its supervisor is killing what is left of it).
            return run.settled();
        }
        if run.marked(Mark::Cancelled) {
            run.kill();
        } else if let Some(s) = run.started()
            && rundir::now_ms() > s.started_at_ms + timeout_s * 1_000 + GRACE_MS
        {
            if let Err(e) = run.mark(Mark::TimedOut) {
                tracing::warn!(error = %e, "could not record a run's timeout");
            }
            run.kill();
        }
        match exited.as_mut() {
            Some(wake) => tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = wake => exited = None,
            },
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// The outcome of a run that has ended, from its folder.
pub fn outcome(run: &RunDir, settled: &Settled, spec: &Spec) -> Outcome {
    let failed = |message: &str, detail: String| Outcome::failed("engine_failed", message, detail);
    let timeout = |s: u64| {
        Outcome::failed(
            "engine_timeout",
            format!("the engine ran past its {s} s timeout and was killed"),
            "",
        )
    };
    match settled {
        Settled::Cancelled => Outcome::Cancelled,
        Settled::TimedOut => timeout(spec.timeout_s),
        Settled::DiedUnfinished => failed(
            "the engine was killed with its supervisor before it finished",
            String::new(),
        ),
        Settled::NeverStarted => failed(
            "the engine's supervisor could not start it",
            std::fs::read_to_string(run.file("supervisor.log"))
                .unwrap_or_default()
                .trim()
                .to_string(),
        ),
        Settled::Exited(exit) => {
            let read = |name: &str| std::fs::read(run.file(name)).unwrap_or_default();
            match engine::answer(spec, exit, &read("stdout"), &read("stderr")) {
                Ok(answer) => Outcome::Answered(RunResponse {
                    text: answer.text,
                    session_id: answer.session_id,
                    processing_ms: exit.finished_at_ms.saturating_sub(spec.created_at_ms) as i64,
                    tool_calls_count: answer.tool_calls_count,
                    tool_names: answer.tool_names,
                    rerun: spec.rerun,
                }),
                Err(EngineError::Timeout(s)) => timeout(s),
                Err(e) => failed(&e.public(), e.to_string()),
            }
        }
    }
}

/// Remove run folders nothing runs that were last touched longer than `age` ago (a run that
/// died unfinished and whose turn was never retried); how many went.
pub fn prune(state_dir: &Path, age: Duration) -> usize {
    all(state_dir)
        .into_iter()
        .filter(|run| {
            let old = std::fs::metadata(run.path())
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|e| e > age);
            old && !run.is_alive() && run.remove().is_ok()
        })
        .count()
}
