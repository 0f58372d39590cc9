//! `switchboard-runner supervise <run folder>`: the small process between a runner and an
//! engine, so the engine outlives a runner crash and its end is still recorded.
//!
//! The runner starts it in its own session and process group (setsid), with the run's lock as
//! its stdin (so the lock is never free while the run goes on, not even between the runner's
//! spawn and this process's first instruction). It records its pid and start time, starts the
//! engine in its group (dying with it: PR_SET_PDEATHSIG), copies the engine's output to files
//! up to the cap, kills the engine at the timeout, records the exit status atomically, then
//! kills its whole group (whatever the engine left behind, and itself).
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::rundir::{self, Exit, RunDir, Started};

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("the run folder has no readable spec.json: {0}")]
    NoSpec(String),
    #[error("recording the run: {0}")]
    Record(#[source] std::io::Error),
    #[error("this process has no readable /proc/self/stat")]
    NoStat,
}

/// Keep up to `cap` bytes of `from` in `to`, drain (and drop) the rest; whether it was cut.
fn copy_capped(mut from: impl Read, mut to: File, cap: usize) -> bool {
    let mut kept = 0usize;
    let mut cut = false;
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept).min(n);
                if room > 0 && to.write_all(&buf[..room]).is_err() {
                    cut = true;
                }
                kept += room;
                cut |= n > room;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = to.sync_all();
    cut
}

/// Run the run in `dir` to its end; what to exit with (normally it is killed with its group).
pub fn supervise(dir: &Path) -> Result<i32, SuperviseError> {
    let run = RunDir::at(dir.to_path_buf());
    let spec = run
        .spec()
        .ok_or_else(|| SuperviseError::NoSpec(dir.display().to_string()))?;
    let me = std::process::id() as i32;
    let (_, _, start_ticks) = rundir::proc_stat(me).ok_or(SuperviseError::NoStat)?;
    let started = Started {
        pid: me,
        start_ticks,
        started_at_ms: rundir::now_ms(),
    };
    run.write_started(&started)
        .map_err(SuperviseError::Record)?;

    let exit = |status: String, success: bool, timed_out: bool, stdout_cut: bool| Exit {
        status,
        success,
        timed_out,
        stdout_cut,
        spawn_error: None,
        finished_at_ms: rundir::now_ms(),
    };
    let spawned = (|| {
        let (program, args) = spec
            .argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("the engine has no command"))?;
        let stdout = rundir::private_file(&run.file("stdout"))?;
        let stderr = rundir::private_file(&run.file("stderr"))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(&spec.env)
            .env("SB_IDEMPOTENCY_KEY", &spec.key)
            .stdin(if spec.stdin_prompt {
                Stdio::from(File::open(run.file("prompt"))?)
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        // SAFETY: only async-signal-safe calls between fork and exec. The engine dies with
        // this supervisor, so no engine runs that nothing will record the end of.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != me {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok::<_, std::io::Error>((child, stdout, stderr))
    })();
    let (mut child, stdout, stderr) = match spawned {
        Ok(s) => s,
        Err(e) => {
            let mut failed = exit(String::new(), false, false, false);
            failed.spawn_error = Some(e.to_string());
            run.write_exit(&failed).map_err(SuperviseError::Record)?;
            return Ok(1);
        }
    };
    let cap = spec.max_output_bytes;
    let (done_tx, done) = mpsc::channel::<(bool, bool)>();
    for (pipe, file, is_stdout) in [
        (
            Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
            stdout,
            true,
        ),
        (Box::new(child.stderr.take().expect("piped")), stderr, false),
    ] {
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let cut = copy_capped(pipe, file, cap);
            let _ = done_tx.send((is_stdout, cut));
        });
    }
    drop(done_tx);

    // Done when the engine has exited and both its outputs are closed (something it left
    // running may hold them: then at the timeout), as the runner always waited.
    let deadline = Duration::from_secs(spec.timeout_s);
    let begun = std::time::Instant::now();
    let mut status = None;
    let mut outputs_open = 2;
    let mut stdout_cut = false;
    let ended = loop {
        if status.is_none() {
            status = child.try_wait().map_err(SuperviseError::Record)?;
        }
        if let (Some(s), 0) = (status, outputs_open) {
            break exit(s.to_string(), s.success(), false, stdout_cut);
        }
        if begun.elapsed() >= deadline {
            break exit(String::from("killed at the timeout"), false, true, false);
        }
        if outputs_open == 0 {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match done.recv_timeout(Duration::from_millis(20)) {
            Ok((is_stdout, cut)) => {
                outputs_open -= 1;
                stdout_cut |= is_stdout && cut;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => outputs_open = 0,
        }
    };
    run.write_exit(&ended).map_err(SuperviseError::Record)?;
    // Anything the engine left behind in the group goes with it, and so does this process.
    crate::engine::kill_group(me);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_drained_and_dropped() {
        let dir = std::env::temp_dir().join(format!("sb-cap-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let cut = copy_capped(&[b'x'; 20_000][..], File::create(&out).unwrap(), 4096);
        assert!(cut);
        assert_eq!(std::fs::read(&out).unwrap().len(), 4096);
        let cut = copy_capped(&b"small"[..], File::create(&out).unwrap(), 4096);
        assert!(!cut);
        assert_eq!(std::fs::read(&out).unwrap(), b"small");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
