//! An engine CLI's command for one turn (from its template) and its answer (the reply and the
//! engine session id, read from its JSON output). The run itself goes through a supervisor
//! process (`supervisor.rs`), so it outlives a runner crash.
use std::path::Path;
use std::time::Duration;

use crate::config::{EngineConfig, PromptVia};
use crate::rundir::{Exit, Spec};

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
    #[error("recording the run in its folder: {0}")]
    State(#[source] std::io::Error),
}

impl EngineError {
    /// What a caller of the runner is told: how the engine failed, without what it printed
    /// (its stderr may hold keys, paths or the person's data; the caller may pass the error
    /// on to the person or the API's client). The rest stays in the runner's log.
    pub fn public(&self) -> String {
        match self {
            EngineError::Spawn(_) => "could not start the engine".into(),
            EngineError::Exit { status, .. } => format!("the engine exited with {status}"),
            EngineError::NoAnswer { what, path, .. } => {
                format!("the engine's output has no JSON with {what} at {path}")
            }
            EngineError::Prompt(_) | EngineError::State(_) => {
                "the runner could not record the run in its folder".into()
            }
            EngineError::NoCommand | EngineError::Timeout(_) | EngineError::OutputTooLarge(_) => {
                self.to_string()
            }
        }
    }
}

pub struct Run<'a> {
    pub engine: &'a EngineConfig,
    pub agent: &'a str,
    pub session_id: &'a str,
    pub prompt: &'a str,
    pub workspace: Option<&'a str>,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    /// Where the prompt file is (`{prompt_file}`, or the engine's stdin).
    pub prompt_file: &'a Path,
    pub key: &'a str,
    /// The turn's token and the API's URL, when dispatch sent them.
    pub turn_token: Option<&'a str>,
    pub api_url: Option<&'a str>,
}

/// The environment variable the engine finds its turn token in.
pub const TURN_TOKEN_ENV: &str = "SWITCHBOARD_TURN_TOKEN";
/// The environment variable the engine finds the API's URL in.
pub const API_URL_ENV: &str = "SWITCHBOARD_API_URL";

#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub text: String,
    pub session_id: String,
    pub tool_calls_count: i64,
    /// The tools it called, by name (see [`tool_names`]).
    pub tool_names: Vec<String>,
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

/// SIGKILL to a whole process group (never to "every process", which -1 would be).
pub fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals the group; no memory is touched.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
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

/// What the supervisor runs for `run`.
pub fn spec(run: &Run<'_>, created_at_ms: u64) -> Result<Spec, EngineError> {
    let e = run.engine;
    let fill = |arg: &str| {
        arg.replace("{session_id}", run.session_id)
            .replace("{agent}", run.agent)
            .replace("{workspace}", run.workspace.unwrap_or(""))
            .replace("{prompt_file}", &run.prompt_file.to_string_lossy())
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
    if argv.is_empty() {
        return Err(EngineError::NoCommand);
    }
    let cwd = e
        .cwd
        .as_deref()
        .or(run.workspace.map(Path::new))
        .filter(|d| d.is_dir())
        .map(Path::to_path_buf);
    Ok(Spec {
        key: run.key.to_string(),
        agent: run.agent.to_string(),
        session_id: run.session_id.to_string(),
        argv,
        env: e.env.clone(),
        cwd,
        stdin_prompt: e.prompt_via == PromptVia::Stdin,
        timeout_s: run.timeout.as_secs(),
        max_output_bytes: run.max_output_bytes,
        text_path: e.text_path.clone(),
        session_id_path: e.session_id_path.clone(),
        tool_calls_path: e.tool_calls_path.clone(),
        tool_names_path: e.tool_names_path.clone(),
        created_at_ms,
        rerun: false,
        turn_env: [(TURN_TOKEN_ENV, run.turn_token), (API_URL_ENV, run.api_url)]
            .into_iter()
            .filter_map(|(name, value)| {
                value
                    .filter(|v| !v.is_empty())
                    .map(|v| (name.to_string(), v.to_string()))
            })
            .collect(),
    })
}

/// The end of `s`, for an error message.
fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let t: Vec<char> = s.chars().rev().take(500).collect();
    t.into_iter().rev().collect()
}

/// The engine's answer from how it ended and what it printed.
pub fn answer(
    spec: &Spec,
    exit: &Exit,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<RunOutcome, EngineError> {
    if let Some(e) = &exit.spawn_error {
        return Err(EngineError::Spawn(std::io::Error::other(e.clone())));
    }
    if exit.timed_out {
        return Err(EngineError::Timeout(spec.timeout_s));
    }
    if !exit.success {
        return Err(EngineError::Exit {
            status: exit.status.clone(),
            stderr: tail(stderr),
        });
    }
    if exit.stdout_cut {
        return Err(EngineError::OutputTooLarge(spec.max_output_bytes));
    }
    let stdout = String::from_utf8_lossy(stdout);
    let json = last_json(&stdout).ok_or_else(|| EngineError::NoAnswer {
        what: "an answer",
        path: spec.text_path.clone(),
        tail: tail(stdout.as_bytes()),
    })?;
    let text = json
        .pointer(&spec.text_path)
        .and_then(|v| v.as_str())
        .ok_or_else(|| EngineError::NoAnswer {
            what: "the reply text",
            path: spec.text_path.clone(),
            tail: tail(stdout.as_bytes()),
        })?
        .to_string();
    let session_id = if spec.session_id_path.is_empty() {
        spec.session_id.clone()
    } else {
        json.pointer(&spec.session_id_path)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(&spec.session_id)
            .to_string()
    };
    let tool_calls_count = if spec.tool_calls_path.is_empty() {
        0
    } else {
        json.pointer(&spec.tool_calls_path)
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    };
    let tool_names = if spec.tool_names_path.is_empty() {
        Vec::new()
    } else {
        json.pointer(&spec.tool_names_path)
            .map(tool_names)
            .unwrap_or_default()
    };
    Ok(RunOutcome {
        text,
        session_id,
        tool_calls_count,
        tool_names,
    })
}

/// The most tool names one answer keeps, and the longest name.
pub const MAX_TOOL_NAMES: usize = 32;
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// The tool names an engine reported: an array's strings, without control characters, trimmed,
/// each cut at [`MAX_TOOL_NAME_CHARS`], once each, at most [`MAX_TOOL_NAMES`]; anything else in
/// it is left out. The engine's output is the agent's, so it is bounded like any input.
pub fn tool_names(reported: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in reported.as_array().into_iter().flatten() {
        let Some(name) = name.as_str() else { continue };
        let name: String = name
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
            .trim()
            .chars()
            .take(MAX_TOOL_NAME_CHARS)
            .collect();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
        if names.len() == MAX_TOOL_NAMES {
            break;
        }
    }
    names
}

/// The demo engine's answer (`switchboard-runner demo-engine`): JSON with the session id it was
/// given and a text quoting the prompt's last non-empty line (the person's message, in the
/// prompts Switchboard builds), at most 200 characters of it.
pub fn demo_answer(session_id: &str, prompt: &str) -> String {
    // Switchboard fences the person's text (`<<<MSG-…` … `MSG-…>>>`, the last fence being the
    // newest message); a bare prompt is taken by its last line.
    let fenced = prompt.rfind("<<<MSG-").and_then(|start| {
        let after = &prompt[start + 3..];
        let (marker, body) = after.split_once('\n')?;
        body.rfind(&format!("\n{marker}>>>"))
            .map(|end| &body[..end])
    });
    let said: String = fenced
        .map(str::trim)
        .or_else(|| prompt.lines().rev().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    serde_json::json!({
        "text": format!("(demo engine) You said: {said}"),
        "session_id": session_id,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_kept_as_names_once_each_and_bounded() {
        let reported = serde_json::json!([
            "read",
            " exec ",
            "read",
            7,
            "",
            "we\u{7}b",
            "x".repeat(100),
            null
        ]);
        assert_eq!(
            tool_names(&reported),
            vec![
                "read".to_string(),
                "exec".into(),
                "web".into(),
                "x".repeat(MAX_TOOL_NAME_CHARS)
            ]
        );
        let many: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
        assert_eq!(tool_names(&serde_json::json!(many)).len(), MAX_TOOL_NAMES);
        assert!(tool_names(&serde_json::json!({"read": 1})).is_empty());
    }

    #[test]
    fn the_demo_engine_answers_as_an_engine_does_with_the_session_it_was_given() {
        let prompt = "Context: a summary\n\nReggie, are you there?\n\n";
        let v: serde_json::Value = serde_json::from_str(&demo_answer("s-1", prompt)).unwrap();
        assert_eq!(v["session_id"], "s-1");
        assert_eq!(v["text"], "(demo engine) You said: Reggie, are you there?");
        let long = "x".repeat(500);
        let v: serde_json::Value = serde_json::from_str(&demo_answer("s", &long)).unwrap();
        assert!(v["text"].as_str().unwrap().len() < 300);
    }

    #[test]
    fn the_demo_engine_quotes_the_fenced_message_of_a_switchboard_prompt() {
        // As dispatch writes it: instructions, then the person's text between its fence lines
        // (the compose try-it answered "You said: MSG-…>>>" before).
        let prompt = "You are reggie.\nMessage from the person:\n<<<MSG-0123456789abcdef\n\
                      hello from the image\nMSG-0123456789abcdef>>>\n";
        let v: serde_json::Value = serde_json::from_str(&demo_answer("s", prompt)).unwrap();
        assert_eq!(v["text"], "(demo engine) You said: hello from the image");
    }

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
