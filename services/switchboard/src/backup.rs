//! `switchboard backup <dir>` and `switchboard restore <dir>`: the product's state in one
//! folder, and back into an empty deployment so its sessions carry on.
//!
//! A backup holds a snapshot of each of the product's JetStream streams (work, events, dead
//! letters, arrival counters; each with its consumers and their ack state) and a Postgres dump
//! (`pg_dump --format=custom`). It is taken with the workers stopped (it waits a while for
//! their consumers to go quiet and refuses otherwise): the server copies a stream's messages
//! before its consumers' acks, so a stage that published an output and acked its input between
//! the two would leave a copy with neither. The streams are taken before Postgres: anything
//! still moving then (a gateway left running) is in the streams' copy *and* has its effects in
//! the dump, and is handled again after a restore, idempotently (dedupe ids, the delivery
//! ledger, the session's turn records). Taken the other way round it would be in neither.
//!
//! `restore` wants an empty database and none of the streams (it refuses otherwise, naming
//! what is there); it restores Postgres, then the streams at the configuration's replica count.
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt as _;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use switchboard_kit::Config;
use switchboard_kit::snapshot::{restore_stream, snapshot_stream};
use switchboard_kit::startup::App;

const MANIFEST: &str = "manifest.json";
const POSTGRES_DUMP: &str = "postgres.dump";
const FORMAT: u32 = 1;

/// `manifest.json`: what the folder holds.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    taken_at: String,
    subject_prefix: String,
    streams: Vec<StreamEntry>,
    postgres: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct StreamEntry {
    name: String,
    /// The snapshot's bytes (`streams/<name>.tar.s2`) and its config and state
    /// (`streams/<name>.json`).
    snapshot: String,
    meta: String,
    messages: u64,
    bytes: u64,
}

/// The product's streams, as the topology declares them, and the arrivals bucket's (a
/// key-value bucket is the stream `KV_<bucket>`).
fn stream_names(app: &App) -> Vec<String> {
    let t = &app.topology;
    let mut names: Vec<String> = t
        .stream_configs(&app.config.runtime)
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.push(format!("KV_{}", t.arrivals_bucket()));
    names
}

pub async fn backup(
    config: Config,
    dir: &Path,
    pg_bin: Option<&Path>,
    quiet_wait: Duration,
    json: bool,
) -> anyhow::Result<()> {
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!(
            "{} is not empty: a backup goes into a new folder",
            dir.display()
        );
    }
    let app = App::connect(config.clone(), "cli").await?;
    wait_for_quiet_consumers(&app, &stream_names(&app), quiet_wait).await?;
    // Everyone's messages are in it: readable by its owner only.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir.join("streams"))
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let client = app.js.client();
    let mut streams = Vec::new();
    for name in stream_names(&app) {
        let snapshot = format!("streams/{name}.tar.s2");
        let meta_file = format!("streams/{name}.json");
        let mut out = private_file(&dir.join(&snapshot)).await?;
        let meta = snapshot_stream(&client, &name, &mut out).await?;
        std::fs::write(dir.join(&meta_file), serde_json::to_vec_pretty(&meta)?)?;
        let messages = meta["state"]["messages"].as_u64().unwrap_or(0);
        let bytes = out.metadata().await?.len();
        eprintln!("stream {name}: {messages} messages ({bytes} bytes of snapshot)");
        streams.push(StreamEntry {
            name,
            snapshot,
            meta: meta_file,
            messages,
            bytes,
        });
    }
    // After the streams (see the module's note).
    let dump = dir.join(POSTGRES_DUMP);
    postgres_tool(
        pg_bin,
        "pg_dump",
        Some(&config.database_url),
        &[
            "--format=custom".into(),
            "--no-owner".into(),
            "--no-privileges".into(),
            format!("--file={}", dump.display()),
        ],
    )?;
    std::fs::set_permissions(&dump, std::fs::Permissions::from_mode(0o600))?;
    eprintln!(
        "postgres: {} bytes of dump",
        std::fs::metadata(&dump)?.len()
    );
    let manifest = Manifest {
        format: FORMAT,
        taken_at: chrono::Utc::now().to_rfc3339(),
        subject_prefix: config.subject_prefix.clone(),
        streams,
        postgres: POSTGRES_DUMP.into(),
    };
    std::fs::write(dir.join(MANIFEST), serde_json::to_vec_pretty(&manifest)?)?;
    if json {
        let mut body = serde_json::to_value(&manifest)?;
        body["dir"] = dir.display().to_string().into();
        println!("{body}");
    } else {
        println!("backup written to {}", dir.display());
    }
    Ok(())
}

pub async fn restore(
    config: Config,
    dir: &Path,
    pg_bin: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    let manifest: Manifest = serde_json::from_slice(
        &std::fs::read(dir.join(MANIFEST))
            .with_context(|| format!("{} holds no backup ({MANIFEST})", dir.display()))?,
    )
    .with_context(|| format!("reading {MANIFEST}"))?;
    if manifest.format != FORMAT {
        bail!(
            "backup format {} is not one this version reads ({FORMAT})",
            manifest.format
        );
    }
    if manifest.subject_prefix != config.subject_prefix {
        bail!(
            "the backup is of subject prefix {:?}, the configuration's is {:?}: stream names \
             carry the prefix, so restore with the backup's",
            manifest.subject_prefix,
            config.subject_prefix
        );
    }
    let app = App::connect(config.clone(), "cli").await?;
    // Nothing is overwritten: an empty database and none of the streams, or nothing happens.
    let has_tables: bool =
        sqlx::query_scalar("SELECT to_regclass('switchboard.sessions') IS NOT NULL")
            .fetch_one(&app.db)
            .await?;
    if has_tables {
        bail!("the database already holds Switchboard's tables: restore into an empty database");
    }
    let mut present = Vec::new();
    for s in &manifest.streams {
        if app.js.get_stream(&s.name).await.is_ok() {
            present.push(s.name.clone());
        }
    }
    if !present.is_empty() {
        bail!(
            "these streams exist already: {} (delete them, or restore into another NATS)",
            present.join(", ")
        );
    }
    // Everything but the extensions' comments: an extension the database already has (made
    // by its administrator, e.g. in template1) is not ours to comment on, and pg_restore would
    // stop there.
    let dump = dir.join(&manifest.postgres).display().to_string();
    let contents = postgres_tool(pg_bin, "pg_restore", None, &["--list".into(), dump.clone()])?;
    let kept: String = contents
        .lines()
        .filter(|l| !l.contains("COMMENT - EXTENSION"))
        .map(|l| format!("{l}\n"))
        .collect();
    let list = dir.join("restore.list");
    std::fs::write(&list, kept)?;
    postgres_tool(
        pg_bin,
        "pg_restore",
        Some(&config.database_url),
        &[
            "--no-owner".into(),
            "--no-privileges".into(),
            "--exit-on-error".into(),
            "--single-transaction".into(),
            format!("--use-list={}", list.display()),
            dump,
        ],
    )?;
    let _ = std::fs::remove_file(&list);
    eprintln!("postgres: restored");
    let client = app.js.client();
    let replicas = config.runtime.stream_replicas;
    for s in &manifest.streams {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(&s.meta))?)?;
        let mut input = tokio::fs::File::open(dir.join(&s.snapshot)).await?;
        let undo = "the database and the streams restored so far stay: drop and make the \
                    database again and delete those streams before trying again";
        restore_stream(&client, &s.name, &meta, replicas, &mut input)
            .await
            .with_context(|| format!("restoring stream {} ({undo})", s.name))?;
        let restored = app
            .js
            .get_stream(&s.name)
            .await?
            .cached_info()
            .state
            .messages;
        if restored != s.messages {
            bail!(
                "stream {} came back with {restored} messages, the backup has {} ({undo})",
                s.name,
                s.messages
            );
        }
        eprintln!("stream {}: restored, {restored} messages", s.name);
    }
    if json {
        let mut body = serde_json::to_value(&manifest)?;
        body["dir"] = dir.display().to_string().into();
        body["restored"] = true.into();
        println!("{body}");
    } else {
        println!(
            "restored {} (taken {}); start the workers",
            dir.display(),
            manifest.taken_at
        );
    }
    Ok(())
}

/// A new file only its owner may read.
async fn private_file(path: &Path) -> std::io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .await
}

/// Wait up to `wait` (a stopped worker's last pull requests expire within `ack_wait`) until no
/// consumer of `streams` has a pull waiting or a message unacknowledged; refuse otherwise.
async fn wait_for_quiet_consumers(
    app: &App,
    streams: &[String],
    wait: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + wait;
    loop {
        let mut busy = Vec::new();
        for name in streams {
            let Ok(stream) = app.js.get_stream(name).await else {
                continue;
            };
            let mut consumers = stream.consumers();
            while let Some(info) = consumers.next().await {
                let info = info.with_context(|| format!("listing the consumers of {name}"))?;
                if info.num_waiting > 0 || info.num_ack_pending > 0 {
                    busy.push(format!(
                        "{} ({} pulls waiting, {} unacknowledged)",
                        info.name, info.num_waiting, info.num_ack_pending
                    ));
                }
            }
        }
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until {
            bail!(
                "workers are still running: {}. Stop every worker first: a message handled \
                 while the streams are copied could be missing from the backup",
                busy.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Run `pg_dump` or `pg_restore` (from `pg_bin`, else the PATH), against `database_url` when
/// given (its password passed in the environment rather than on a command line others can
/// read); what it printed.
fn postgres_tool(
    pg_bin: Option<&Path>,
    tool: &str,
    database_url: Option<&str>,
    args: &[String],
) -> anyhow::Result<String> {
    let program: PathBuf = pg_bin.map_or_else(|| PathBuf::from(tool), |d| d.join(tool));
    let mut command = std::process::Command::new(&program);
    command.args(args);
    if let Some(database_url) = database_url {
        let mut url = url::Url::parse(database_url).context("database_url is not a URL")?;
        let password = url
            .password()
            .map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let _ = url.set_password(None);
        command.arg(format!("--dbname={url}"));
        if !password.is_empty() {
            command.env("PGPASSWORD", password);
        }
    }
    let output = command.output().with_context(|| {
        format!(
            "running {} (install the PostgreSQL client, or pass --pg-bin)",
            program.display()
        )
    })?;
    if !output.status.success() {
        bail!(
            "{tool} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
