//! The operating system, from /proc and libc (no procps needed): processes (alive, children,
//! start times, signals), listening ports, locks, private files, logs.
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::error::IoContext as _;
use crate::{Error, Result};

/// The caller's libpq environment, which must not change what our tools connect to.
const PG_ENV: [&str; 12] = [
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGPASSFILE",
    "PGSSLMODE",
    "PGDATA",
    "PGCONNECT_TIMEOUT",
];

/// A command for `program` without the caller's libpq variables. Every process this tool
/// starts is made here. (Rust opens every file close-on-exec: no server inherits a lock.)
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in PG_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// Our stderr, for a child's stdout (what it says is not for `eval`).
pub fn to_stderr() -> Stdio {
    std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_or_else(|_| Stdio::inherit(), Stdio::from)
}

/// The program's path if it is on PATH (`command -v`).
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// New files 0644 and folders 0755 unless made private (the Postgres user must reach them).
pub fn set_umask() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o022) };
}

/// The signal that interrupted us (0: none), once [`catch_interrupts`] has been called.
static INTERRUPT: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_interrupt(signal: libc::c_int) {
    INTERRUPT.store(signal, Ordering::SeqCst);
}

/// From now on SIGINT, SIGTERM and SIGHUP do not end the process but are noted, for
/// [`interrupted`]: `up` stops what it started before it exits (the script's `trap ... EXIT`).
/// A child started later gets the default handling back (exec resets caught signals).
pub fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores into an atomic (async-signal-safe).
        unsafe { libc::signal(signal, note_interrupt as *const () as libc::sighandler_t) };
    }
}

/// The signal that arrived since [`catch_interrupts`], if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPT.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// An error if a signal arrived since [`catch_interrupts`].
pub fn check_interrupted() -> Result<()> {
    interrupted().map_or(Ok(()), |s| Err(Error::Interrupted(s)))
}

/// Send `signal` to `pid`; false if it could not be sent (gone, or not ours).
pub fn kill(pid: i32, signal: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    pid > 0 && unsafe { libc::kill(pid, signal) } == 0
}

/// The process exists, is ours to signal, and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    if !kill(pid, 0) {
        return false;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let state = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|s| s.split_whitespace().next());
    state != Some("Z")
}

/// The fields of /proc/PID/stat after the command name (which may hold spaces): the state
/// first (field 3).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(") ")? + 2..];
    Some(rest.split(' ').map(str::to_string).collect())
}

/// When `pid` started (clock ticks since boot, /proc/PID/stat field 22), to tell it from a
/// later process given the same pid: pid_max is 32768 here, and a machine busy compiling hands
/// a killed backend's pid to a new process within seconds (seen: chaos-small failing with "pid
/// still alive 10s after SIGKILL" while the pid was someone else's).
pub fn start_time(pid: i32) -> Option<String> {
    stat_fields(pid)?.get(19).cloned()
}

/// `pid` is alive (not a zombie) and is still the process that started at `start`.
pub fn same_alive(pid: i32, start: Option<&str>) -> bool {
    pid_alive(pid) && start_time(pid).as_deref() == start
}

/// The pids whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            stat_fields(pid)
                .and_then(|f| f.get(1)?.parse::<i32>().ok())
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

/// The first line of /proc/PID/status's `State:`, e.g. `D (disk sleep)`, for messages.
pub fn state_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether one of `pid`'s arguments is exactly `arg`; `None` when its command line cannot be
/// read.
pub fn cmdline_has(pid: i32, arg: &Path) -> Option<bool> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let arg = arg.as_os_str().as_encoded_bytes();
    Some(cmdline.split(|&b| b == 0).any(|a| a == arg))
}

/// SIGKILL a process and all its children at the same instant. The parent is stopped first so
/// that it forks no child between the listing and the kill. Waits (bounded) until all are dead.
/// `Ok(true)` when the parent is gone, `Ok(false)` when it is left as a zombie nobody has
/// reaped yet; an error when one of them is still alive 30 s after the SIGKILL.
pub fn kill_tree_now(pid: i32) -> Result<bool> {
    let parent_start = start_time(pid);
    kill(pid, libc::SIGSTOP);
    let mut procs: Vec<(i32, Option<String>)> = children_of(pid)
        .into_iter()
        .map(|p| (p, Some(start_time(p).unwrap_or_else(|| "gone".into()))))
        .collect();
    procs.push((pid, Some(start_time(pid).unwrap_or_else(|| "gone".into()))));
    for (p, _) in &procs {
        kill(*p, libc::SIGKILL);
    }
    // 30 s: tearing down a backend's memory is slow under load.
    wait_until(Duration::from_secs(30), || {
        !procs.iter().any(|(p, s)| same_alive(*p, s.as_deref()))
    });
    if let Some((p, _)) = procs.iter().find(|(p, s)| same_alive(*p, s.as_deref())) {
        return Err(Error::failed(format!(
            "pid {p} still alive 30s after SIGKILL (state {})",
            state_of(*p)
        )));
    }
    // 5 s for the reaper.
    Ok(wait_until(Duration::from_secs(5), || {
        start_time(pid) != parent_start
    }))
}

/// Poll `done` every 100 ms until it holds (true) or `limit` has passed (false).
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// True if a socket listens on `port` (any local address), read from the kernel's socket
/// tables rather than by connecting: a probe connection can be answered by whatever races it
/// (clients reconnecting to a server that was just killed, SYN cookies under load).
pub fn port_in_use(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .any(|f| std::fs::read_to_string(f).is_ok_and(|table| listens_on(&table, port)))
}

/// Whether a /proc/net/tcp table lists a socket in LISTEN (state 0A) on `port`.
fn listens_on(table: &str, port: u16) -> bool {
    let suffix = format!(":{port:04X}");
    table.lines().skip(1).any(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        cols.len() > 3 && cols[1].ends_with(&suffix) && cols[3] == "0A"
    })
}

/// After a SIGKILL the kernel can list the dead server's listening sockets for a moment after
/// its process is gone (seen under load, chaos-small): wait up to 10 s for them to go rather
/// than fail the restart with "already in use".
pub fn wait_ports_released(ports: &[u16]) {
    wait_until(Duration::from_secs(10), || {
        !ports.iter().any(|&p| port_in_use(p))
    });
}

/// An exclusive lock on a file (flock), held until dropped. At most 10 minutes of waiting.
pub struct Lock {
    _file: File,
}

impl Lock {
    pub fn acquire(path: &Path) -> Result<Lock> {
        let file = File::create(path).io_ctx("opening the lock", path)?;
        let locked = wait_until(Duration::from_secs(600), || {
            // SAFETY: flock on a descriptor we own.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
        });
        if !locked {
            return Err(Error::failed(format!(
                "timed out waiting for lock {}",
                path.display()
            )));
        }
        Ok(Lock { _file: file })
    }
}

/// Write `content` to `path`, never readable by others: a 0600 temp file beside it, renamed.
pub fn private_write(path: &Path, content: &str) -> Result<()> {
    let tmp = tmp_path(path);
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .io_ctx("writing", &tmp)?;
    f.write_all(content.as_bytes()).io_ctx("writing", &tmp)?;
    drop(f);
    chmod(&tmp, 0o600)?;
    std::fs::rename(&tmp, path).io_ctx("writing", path)
}

/// `<path>.tmp.<pid>`: a temporary name beside `path`, this process's own.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    PathBuf::from(name)
}

pub fn chmod(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).io_ctx("chmod", path)
}

pub fn mkdir_p(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).io_ctx("creating", path)
}

/// Create an empty file (or keep an existing one).
pub fn touch(path: &Path) -> Result<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
        .io_ctx("creating", path)
}

/// `rm -rf`: the path and everything under it; nothing if it is not there.
pub fn remove_all(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).io_ctx("removing", path),
        _ => std::fs::remove_file(path).io_ctx("removing", path),
    }
}

/// `rm -f`.
pub fn remove_file(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Whether `path` was modified less than `age` ago (`find -mmin`).
pub fn modified_within(path: &Path, age: Duration) -> bool {
    path.metadata()
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().map_or(true, |e| e < age))
}

/// The last `n` lines of a file, each as `\n<prefix><line>` (empty if it cannot be read).
pub fn tail_lines(path: &Path, n: usize, prefix: &str) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("\n{prefix}{l}"))
        .collect()
}

/// Print the last `n` lines of a file on stderr, each with `prefix`.
pub fn eprint_tail(path: &Path, n: usize, prefix: &str) {
    let tail = tail_lines(path, n, prefix);
    if let Some(tail) = tail.strip_prefix('\n') {
        eprintln!("{tail}");
    }
}

/// Now, UTC, as `2026-01-31T23:59:59Z`.
pub fn utc_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (the proleptic Gregorian calendar;
/// Howard Hinnant's days-to-civil).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Run a command to its end with stdout sent to our stderr; an error naming `what` if it could
/// not start or failed.
pub fn run_to_stderr(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .stdout(to_stderr())
        .status()
        .map_err(|e| Error::failed(format!("{what}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::failed(format!("{what} ({status})")))
    }
}

/// Run a command quietly; whether it succeeded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run a command; its stdout and stderr together (`2>&1`), and whether it succeeded.
pub fn output(cmd: &mut Command) -> (bool, String) {
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_found_by_its_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5EDE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:62D0 0100007F:5EDE 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1";
        assert!(listens_on(table, 24286)); // 0x5EDE
        // Connected (01), not listening: a client of 0x62D0.
        assert!(!listens_on(table, 0x62D0));
        assert!(!listens_on(table, 0xDE));
        assert!(!listens_on("header only", 24286));
    }

    #[test]
    fn our_own_listener_is_seen_and_then_released() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(port_in_use(port));
        drop(l);
        wait_ports_released(&[port]);
        assert!(!port_in_use(port));
    }

    #[test]
    fn timestamps_are_utc_iso() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(utc_timestamp().len(), 20);
    }

    #[test]
    fn processes_are_seen_alive_with_their_start_time_and_children() {
        let me = std::process::id() as i32;
        assert!(pid_alive(me));
        let start = start_time(me);
        assert!(start.is_some());
        assert!(same_alive(me, start.as_deref()));
        assert!(!same_alive(me, Some("0")));
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(children_of(me).contains(&pid));
        // The child may still be between fork and exec (its cmdline the test binary's) under
        // load: wait, bounded, for the exec.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cmdline_has(pid, Path::new("30")) != Some(true)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(
            cmdline_has(pid, Path::new("30")),
            Some(true),
            "sleep's argument"
        );
        assert!(kill(pid, libc::SIGKILL));
        // Killed but not reaped: a zombie is not alive.
        assert!(wait_until(Duration::from_secs(5), || !pid_alive(pid)));
        child.wait().unwrap();
    }

    #[test]
    fn private_files_are_0600_and_tails_are_prefixed() {
        let dir = std::env::temp_dir().join(format!("stack-sys-{}", std::process::id()));
        mkdir_p(&dir).unwrap();
        let f = dir.join("secret");
        private_write(&f, "a\nb\nc\n").unwrap();
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(tail_lines(&f, 2, "  | "), "\n  | b\n  | c");
        assert_eq!(tail_lines(&dir.join("none"), 2, "  | "), "");
        assert!(modified_within(&f, Duration::from_secs(60)));
        assert!(!modified_within(&dir.join("none"), Duration::from_secs(60)));
        let _held = Lock::acquire(&dir.join("lock")).unwrap();
        remove_all(&dir).unwrap();
        assert!(!dir.exists());
    }
}
