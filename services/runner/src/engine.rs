//! One run of an engine CLI: the command from its template, in its own process group (so the
//! timeout and a cancel kill it with everything it started), output capped, the reply and the
//! engine session id read from its JSON output.
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::config::{EngineConfig, PromptVia};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the engine has no command")]
    NoCommand,
    #[error("could not start the engine: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the engine ran past its {0} s timeout and was killed")]
    Timeout(u64),
    #[error("the engine exited with {status}: {stderr}")]
    Exit { status: String, stderr: String },
    #[error("the engine's output was cut at {0} bytes")]
    OutputTooLarge(usize),
    #[error("the engine's output has no JSON with {what} at {path}: {tail}")]
    NoAnswer {
        what: &'static str,
        path: String,
        tail: String,
    },
    #[error("writing the prompt: {0}")]
    Prompt(#[source] std::io::Error),
}

pub struct Run<'a> {
    pub engine: &'a EngineConfig,
    pub agent: &'a str,
    pub session_id: &'a str,
    pub prompt: &'a str,
    pub workspace: Option<&'a str>,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    /// Where prompt files are written.
    pub scratch: &'a Path,
    pub key: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub text: String,
    pub session_id: String,
    pub tool_calls_count: i64,
}

/// The identity's core memory (`coreMEM-<identity>.md`), when there is one, ahead of the prompt.
pub fn with_core_memory(dir: &Path, identity: &str, prompt: &str) -> String {
    if identity.is_empty() {
        return prompt.to_string();
    }
    match std::fs::read_to_string(dir.join(format!("coreMEM-{identity}.md"))) {
        Ok(memory) if !memory.trim().is_empty() => {
            format!("{}\n\n---\n\n{prompt}", memory.trim_end())
        }
        _ => prompt.to_string(),
    }
}

/// SIGKILL to a whole process group.
pub fn kill_group(pgid: i32) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals the group; no memory is touched.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// Read up to `cap` bytes, then drain (and drop) the rest; whether it was cut.
async fn capped(mut r: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut cut = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
        }
    }
    (kept, cut)
}

/// The last JSON document on stdout: engines print log lines around it.
pub fn last_json(stdout: &str) -> Option<serde_json::Value> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(stdout.trim()) {
        return Some(v);
    }
    // From each '{' that starts a line, backwards: the first that parses to the end.
    let starts: Vec<usize> = stdout
        .match_indices('{')
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || stdout.as_bytes()[i - 1] == b'\n')
        .collect();
    starts.iter().rev().find_map(|&i| {
        let mut de =
            serde_json::Deserializer::from_str(&stdout[i..]).into_iter::<serde_json::Value>();
        de.next()?.ok()
    })
}

pub async fn run(run: &Run<'_>, pgid: &Arc<Mutex<Option<i32>>>) -> Result<RunOutcome, EngineError> {
    let e = run.engine;
    let prompt_file = run
        .scratch
        .join("prompts")
        .join(format!("{}.txt", uuid::Uuid::new_v4().simple()));
    if e.prompt_via == PromptVia::File {
        std::fs::create_dir_all(prompt_file.parent().expect("a folder"))
            .map_err(EngineError::Prompt)?;
        std::fs::write(&prompt_file, run.prompt).map_err(EngineError::Prompt)?;
    }
    let fill = |arg: &str| {
        arg.replace("{session_id}", run.session_id)
            .replace("{agent}", run.agent)
            .replace("{workspace}", run.workspace.unwrap_or(""))
            .replace("{prompt_file}", &prompt_file.to_string_lossy())
            .replace(
                "{prompt}",
                if e.prompt_via == PromptVia::Arg {
                    run.prompt
                } else {
                    ""
                },
            )
    };
    let argv: Vec<String> = e.command.iter().map(|a| fill(a)).collect();
    let (program, args) = argv.split_first().ok_or(EngineError::NoCommand)?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .envs(&e.env)
        .env("SB_IDEMPOTENCY_KEY", run.key)
        .stdin(if e.prompt_via == PromptVia::Stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so the timeout and a cancel reach everything it starts.
        .process_group(0);
    if let Some(dir) = e
        .cwd
        .as_deref()
        .or(run.workspace.map(Path::new))
        .filter(|d| d.is_dir())
    {
        cmd.current_dir(dir);
    }
    // SAFETY: only async-signal-safe calls between fork and exec: the child dies with the
    // runner, so a run interrupted by a runner crash is not still going when the turn retries.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(EngineError::Spawn)?;
    let group = child.id().map(|id| id as i32);
    *pgid.lock().unwrap() = group;
    if e.prompt_via == PromptVia::Stdin
        && let Some(mut stdin) = child.stdin.take()
    {
        let prompt = run.prompt.as_bytes().to_vec();
        tokio::spawn(async move {
            let _ = stdin.write_all(&prompt).await;
        });
    }
    let out = capped(child.stdout.take().expect("piped"), run.max_output_bytes);
    let err = capped(child.stderr.take().expect("piped"), run.max_output_bytes);
    let waited = tokio::time::timeout(run.timeout, async {
        let ((stdout, out_cut), (stderr, _), status) = tokio::join!(out, err, child.wait());
        (stdout, out_cut, stderr, status)
    })
    .await;
    let _ = std::fs::remove_file(&prompt_file);
    let Ok((stdout, out_cut, stderr, status)) = waited else {
        if let Some(g) = group {
            kill_group(g);
        }
        return Err(EngineError::Timeout(run.timeout.as_secs()));
    };
    // Anything it left behind in its group goes with it.
    if let Some(g) = group {
        kill_group(g);
    }
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let t: String = s
            .chars()
            .rev()
            .take(500)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        t
    };
    let status = status.map_err(EngineError::Spawn)?;
    if !status.success() {
        return Err(EngineError::Exit {
            status: status.to_string(),
            stderr: tail(&stderr),
        });
    }
    if out_cut {
        return Err(EngineError::OutputTooLarge(run.max_output_bytes));
    }
    let stdout = String::from_utf8_lossy(&stdout);
    let json = last_json(&stdout).ok_or_else(|| EngineError::NoAnswer {
        what: "an answer",
        path: e.text_path.clone(),
        tail: tail(stdout.as_bytes()),
    })?;
    let text = json
        .pointer(&e.text_path)
        .and_then(|v| v.as_str())
        .ok_or_else(|| EngineError::NoAnswer {
            what: "the reply text",
            path: e.text_path.clone(),
            tail: tail(stdout.as_bytes()),
        })?
        .to_string();
    let session_id = if e.session_id_path.is_empty() {
        run.session_id.to_string()
    } else {
        json.pointer(&e.session_id_path)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(run.session_id)
            .to_string()
    };
    let tool_calls_count = if e.tool_calls_path.is_empty() {
        0
    } else {
        json.pointer(&e.tool_calls_path)
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    };
    Ok(RunOutcome {
        text,
        session_id,
        tool_calls_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_json_document_is_found_among_log_lines() {
        let out = "starting\n{\"not\": \"this\"}\nlog: done\n{\"payloads\":[{\"text\":\"hi\"}]}\n";
        let v = last_json(out).unwrap();
        assert_eq!(v.pointer("/payloads/0/text").unwrap(), "hi");
        assert!(last_json("no json here").is_none());
    }

    #[test]
    fn core_memory_goes_first_when_there_is_one() {
        let dir = std::env::temp_dir().join(format!("sb-core-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("coreMEM-reggie.md"), "Reggie keeps it short.\n").unwrap();
        assert_eq!(
            with_core_memory(&dir, "reggie", "hello"),
            "Reggie keeps it short.\n\n---\n\nhello"
        );
        assert_eq!(with_core_memory(&dir, "other", "hello"), "hello");
    }
}
