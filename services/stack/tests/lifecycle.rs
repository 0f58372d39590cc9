//! A stack's life as a user sees it, on a throwaway name and ports of its own: `up` prints URLs
//! that connect (and nothing connects without them), `status` says ready and shows no password,
//! `env` prints what `up` printed, a crashed Postgres and a restarted NATS come back, `rotate`
//! makes the old passwords useless and the new ones work, `down` stops it, `destroy` removes it.
//!
//! It uses the binaries' cache of `SB_STACK_DIR` (default `<repo>/.stack`): `make test` has
//! filled it; on a fresh machine the first `up` downloads them.
use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const NAME: &str = "stack-lifecycle-it";
// Below Linux's ephemeral range (32768+) and apart from every other stack of the repository
// (run 14222, bench 16222, chaos 18222, test 24222 and their Postgres and monitoring ports).
const NATS_PORT: u16 = 26422;
const MONITOR_PORT: u16 = 26522;
const PG_PORT: u16 = 27632;

fn stack(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stack"));
    cmd.args(args).env("SB_STACK_FAST", "1");
    for var in [
        "SB_STACK_PG_CONF",
        "SB_NATS_MONITOR_PORT",
        "SB_STACK_NATS_PREFIXES",
        "SB_STACK_ANALYTICS_PREFIX",
        "SB_STACK_NATS_CLUSTER",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().expect("run the stack tool")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The command succeeded; its stdout.
fn ok(args: &[&str]) -> String {
    let out = stack(args);
    assert!(
        out.status.success(),
        "stack {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn exports(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .map(|l| {
            let (k, v) = l
                .strip_prefix("export ")
                .and_then(|l| l.split_once('='))
                .unwrap_or_else(|| panic!("not an export line on stdout: {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn stack_dir() -> PathBuf {
    let root = std::env::var_os("SB_STACK_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // The tool prints its state folder resolved (no `..`), so this is resolved too.
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .canonicalize()
                .expect("the repository root")
                .join(".stack")
        });
    root.join(NAME)
}

fn ports_value(key: &str) -> String {
    let ports = std::fs::read_to_string(stack_dir().join("ports")).expect("the ports file");
    ports
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in ports"))
        .to_string()
}

/// NATS' answer to a client logging in as `user` (anonymously without one): PONG when let in.
fn nats_login(user: Option<(&str, &str)>) -> String {
    let stream = TcpStream::connect(("127.0.0.1", NATS_PORT)).expect("connect to NATS");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    assert!(info.starts_with("INFO "), "{info}");
    let auth = user
        .map(|(u, p)| format!(r#","user":"{u}","pass":"{p}""#))
        .unwrap_or_default();
    let mut writer = stream;
    write!(
        writer,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"protocol\":1{auth}}}\r\nPING\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    reader.read_line(&mut answer).unwrap();
    answer.trim().to_string()
}

fn url_password(url: &str) -> (String, String) {
    let rest = url.split_once("://").unwrap().1;
    let (userinfo, _) = rest.split_once('@').expect("credentials in the URL");
    let (u, p) = userinfo.split_once(':').unwrap();
    (u.to_string(), p.to_string())
}

/// `psql <url> -c 'SELECT current_user'` with the stack's own psql: the user, or the error.
fn pg_login(url: &str) -> Result<String, String> {
    let psql = Path::new(&ports_value("PG_INSTALL")).join("pgserver/pginstall/bin/psql");
    let out = Command::new(psql)
        .arg(url)
        .args(["-X", "-q", "-t", "-A", "-w", "-c", "SELECT current_user"])
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGPASSFILE")
        .output()
        .expect("run psql");
    if out.status.success() {
        Ok(text(&out.stdout).trim().to_string())
    } else {
        Err(text(&out.stderr))
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn pid_in(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Destroys the stack however the test ends.
struct Destroy;

impl Drop for Destroy {
    fn drop(&mut self) {
        let _ = stack(&["destroy", NAME]);
    }
}

#[test]
fn a_stack_goes_up_crashes_restarts_rotates_and_goes_away() {
    let _ = stack(&["destroy", NAME]);
    let _destroy = Destroy;
    let (nats, pg, mon) = (
        NATS_PORT.to_string(),
        PG_PORT.to_string(),
        MONITOR_PORT.to_string(),
    );

    // up: export lines only on stdout, URLs that connect.
    let up = ok(&["up", NAME, &nats, &pg, &mon]);
    let env = exports(&up);
    let nats_url = &env["SB_NATS_URL"];
    let db_url = &env["SB_DATABASE_URL"];
    assert!(
        nats_url.ends_with(&format!("@127.0.0.1:{NATS_PORT}")),
        "{nats_url}"
    );
    assert!(
        db_url.ends_with(&format!("@127.0.0.1:{PG_PORT}/switchboard")),
        "{db_url}"
    );
    assert!(
        Path::new(&env["SB_EMBEDDING__MODEL_DIR"])
            .join("config.json")
            .is_file()
    );
    let (nats_user, nats_password) = url_password(nats_url);
    let (_, pg_password) = url_password(db_url);
    assert_eq!(nats_user, "switchboard");
    assert_eq!(nats_password.len(), 32);
    assert_eq!(nats_login(Some((&nats_user, &nats_password))), "PONG");
    assert!(nats_login(None).contains("Authorization Violation"));
    assert_eq!(pg_login(db_url).as_deref(), Ok("switchboard"));

    // The secrets are the owner's only.
    let creds = PathBuf::from(&env["SB_STACK_CREDENTIALS_DIR"]);
    assert_eq!(creds, stack_dir().join("credentials"));
    assert_eq!(mode(&creds), 0o700);
    for file in ["secrets", "pgpass", "env"] {
        assert_eq!(mode(&creds.join(file)), 0o600, "{file}");
    }
    assert_eq!(mode(&stack_dir().join("nats/nats.conf")), 0o600);
    assert_eq!(std::fs::read_to_string(creds.join("env")).unwrap(), up);

    // status: ready (exit 0), the URLs without their passwords; env: what up printed.
    let status = stack(&["status", NAME]);
    let shown = text(&status.stdout);
    assert_eq!(status.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("running, healthy") && shown.contains("running, ready"),
        "{shown}"
    );
    assert!(shown.contains("nats://switchboard:***@"), "{shown}");
    assert!(!shown.contains(&nats_password) && !shown.contains(&pg_password));
    assert_eq!(ok(&["env", NAME]), up);
    // A second up finds it running and prints the same.
    assert_eq!(ok(&["up", NAME, &nats, &pg, &mon]), up);

    // crash pg: a new postmaster, by crash recovery, with the same data and password.
    let postmaster = Path::new(&ports_value("PG_DIR")).join("data/postmaster.pid");
    let before = pid_in(&postmaster);
    ok(&["crash", NAME, "pg"]);
    assert_ne!(pid_in(&postmaster), before);
    assert_eq!(stack(&["status", NAME]).status.code(), Some(0));
    assert_eq!(pg_login(db_url).as_deref(), Ok("switchboard"));

    // restart nats: a new server, the same credentials.
    let nats_pid = stack_dir().join("nats/nats.pid");
    let before = pid_in(&nats_pid);
    ok(&["restart", NAME, "nats"]);
    assert_ne!(pid_in(&nats_pid), before);
    assert_eq!(nats_login(Some((&nats_user, &nats_password))), "PONG");

    // rotate: the old passwords are refused, the printed new ones let in.
    let rotated = exports(&ok(&["rotate", NAME]));
    let (_, new_nats_password) = url_password(&rotated["SB_NATS_URL"]);
    assert_ne!(new_nats_password, nats_password);
    assert!(nats_login(Some((&nats_user, &nats_password))).contains("Authorization Violation"));
    assert_eq!(nats_login(Some((&nats_user, &new_nats_password))), "PONG");
    let refused = pg_login(db_url).unwrap_err();
    assert!(
        refused.contains("password authentication failed"),
        "{refused}"
    );
    assert_eq!(
        pg_login(&rotated["SB_DATABASE_URL"]).as_deref(),
        Ok("switchboard")
    );
    assert_eq!(exports(&ok(&["env", NAME])), rotated);

    // down: stopped, data kept; destroy: gone.
    ok(&["down", NAME]);
    let status = stack(&["status", NAME]);
    assert_eq!(status.status.code(), Some(3));
    assert!(text(&status.stdout).contains("stopped"));
    assert!(TcpStream::connect(("127.0.0.1", NATS_PORT)).is_err());
    ok(&["destroy", NAME]);
    assert!(!stack_dir().exists());
    let status = stack(&["status", NAME]);
    assert_eq!(status.status.code(), Some(3));
    assert!(text(&status.stdout).contains("not created"));
}

#[test]
fn wrong_arguments_exit_2_and_bad_values_1() {
    assert_eq!(stack(&["up", NAME, "26999"]).status.code(), Some(2));
    assert_eq!(stack(&["crash", NAME, "redis"]).status.code(), Some(2));
    let bad = stack(&["up", "no/such", "26998", "27998"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("stack: ERROR: invalid stack name 'no/such'"));
    assert!(bad.stdout.is_empty());
    let bad = stack(&["up", "x", "26998", "80"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("pg_port must be a number between 1024 and 65535, got '80'")
    );
    let never = stack(&["env", "stack-never-made-it"]);
    assert_eq!(never.status.code(), Some(1));
    assert!(text(&never.stderr).contains("has never been brought up"));
}

/// As the script's `trap ... EXIT` did: an `up` interrupted while it starts the servers stops
/// what it started and exits 128 + the signal.
#[test]
fn an_interrupted_up_stops_what_it_started() {
    const NAME: &str = "stack-interrupted-it";
    let _ = stack(&["destroy", NAME]);
    struct Destroy;
    impl Drop for Destroy {
        fn drop(&mut self) {
            let _ = stack(&["destroy", NAME]);
        }
    }
    let _destroy = Destroy;
    let dir = stack_dir().with_file_name(NAME);
    let up = Command::new(env!("CARGO_BIN_EXE_stack"))
        .args(["up", NAME, "26432", "27642", "26532"])
        .env("SB_STACK_FAST", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start stack up");
    // NATS has been started (its pid file is written right after): interrupt.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !dir.join("nats/nats.pid").is_file() {
        assert!(std::time::Instant::now() < deadline, "NATS never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let nats_pid: i32 = loop {
        if let Ok(pid) = pid_in(&dir.join("nats/nats.pid")).parse() {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(up.id() as i32, libc::SIGINT) };
    let out = up.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no export lines: {}",
        text(&out.stdout)
    );
    assert!(
        stderr.contains("stopping the NATS this 'up' started"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stack: ERROR: interrupted (signal 2)"),
        "{stderr}"
    );
    assert!(
        !Path::new(&format!("/proc/{nats_pid}")).exists() || {
            // Gone, or a zombie of nobody's until init reaps it.
            let status =
                std::fs::read_to_string(format!("/proc/{nats_pid}/status")).unwrap_or_default();
            status.contains("State:\tZ")
        }
    );
    let status = stack(&["status", NAME]);
    assert_eq!(status.status.code(), Some(3));
    let shown = text(&status.stdout);
    assert!(!shown.contains("running"), "{shown}");
}
