//! Failpoints: a test kills a process at a named point of a step, to prove what survives a
//! crash exactly there (the window between two writes that no outside stall can reach). Set
//! `SWITCHBOARD_FAILPOINT=<name>` in a worker's environment; unset, as in production, each
//! point is one comparison. (Not an `SB_` variable: it is no setting of the product.)

/// The environment variable naming the failpoint a process dies at.
pub const ENV: &str = "SWITCHBOARD_FAILPOINT";

/// Abort the process here, as `kill -9` would (no drain, no flush of buffered acks), if this
/// process was started to die at `name`.
pub fn crash_at(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT.get_or_init(|| std::env::var(ENV).ok()).as_deref() == Some(name) {
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
}

/// Hold the task here for good if this process was started to stall at `name` (its failpoint
/// set to `<name>:stall`): whatever the process does instead of waiting out this step (a race
/// it must win, a deadline), a test sees it do, with no timing of its own.
pub async fn stall_at(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var(ENV).ok());
    if at.as_deref().and_then(|a| a.strip_suffix(":stall")) == Some(name) {
        eprintln!("failpoint {name}: stalling for good");
        std::future::pending::<()>().await;
    }
}

/// Whether the step at `name` should act as if its answer was lost, the first time it is
/// reached in a process started with its failpoint set to `<name>:lose` (a statement that
/// committed as the database went away, say): true once, then false, so the retry that
/// follows is the process's own.
pub fn lose_once_at(name: &str) -> bool {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    static LOST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let at = AT.get_or_init(|| std::env::var(ENV).ok());
    if at.as_deref().and_then(|a| a.strip_suffix(":lose")) != Some(name) {
        return false;
    }
    let first = !LOST.swap(true, std::sync::atomic::Ordering::Relaxed);
    if first {
        eprintln!("failpoint {name}: losing this answer");
    }
    first
}
