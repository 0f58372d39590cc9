//! `switchboard readers add|list|remove`: analytics readers that keep their place in the public
//! event stream. A reader is a durable pull consumer on the events stream plus a NATS user that
//! may only fetch from and acknowledge on it (and read its state), so an analytics client
//! resumes where it stopped without the right to create consumers (docs/events.md).
//!
//! Next to the embedded stack the user is added to the stack's NATS config and the server
//! reloads it; elsewhere the command prints the user's entry for your own nats.conf.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::jetstream::{self, consumer, stream::Stream};
use clap::Subcommand;
use futures::StreamExt as _;
use switchboard_kit::Config;
use switchboard_kit::topology::Topology;
use switchboard_stack::nats::PRODUCT_ACCOUNT;
use switchboard_stack::readers::{EVENTS_API_PREFIX, Reader, config_for_your_own, is_name};

use crate::tail::Start;

/// Consumers and users of readers are named `reader-<name>`.
const PREFIX: &str = "reader-";
/// Cost of the stored password hash; nats-server checks it on each connect (~50 ms).
const BCRYPT_COST: u32 = 10;

#[derive(Subcommand)]
pub enum ReadersCommand {
    /// Make a reader: a durable consumer on the events stream and a NATS user allowed only to
    /// fetch and ack on it. Its password is printed once.
    Add {
        /// Letters, digits, '_' and '-'; the consumer and the user are `reader-<name>`.
        name: String,
        /// Where its position starts: `all` (the default: every event the stream still keeps),
        /// `now`, an RFC 3339 time or a stream sequence.
        #[arg(long, default_value = "all", value_parser = crate::tail::parse_from)]
        from: Start,
        /// Only these events (repeatable): `message.logged`, `exchange.categorised`, …
        #[arg(long = "event")]
        events: Vec<String>,
        /// `{"user", "password", "stream", "consumer", "nats_url", "inbox_prefix", "api_prefix",
        /// ...}`.
        #[arg(long)]
        json: bool,
    },
    /// The readers: each one's position, what it has yet to read and whether its user is set up.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove a reader: its consumer (and with it its position) and its NATS user.
    Remove {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

/// A reader as `list` shows it.
#[derive(Debug, serde::Serialize)]
struct ReaderInfo {
    name: String,
    user: String,
    stream: String,
    consumer: String,
    filter_subjects: Vec<String>,
    /// Events it has yet to fetch.
    pending: u64,
    /// Fetched, not yet acknowledged.
    ack_pending: usize,
    /// The stream sequence below which everything is acknowledged.
    acked_through: u64,
    /// Its NATS user is in the embedded stack's config (null: not managed here).
    user_configured: Option<bool>,
}

pub async fn run(config: Config, command: ReadersCommand) -> anyhow::Result<()> {
    let nats = switchboard_kit::endpoint::nats_connect(
        &config.nats_url,
        async_nats::ConnectOptions::new().name("switchboard-readers"),
    )
    .await?;
    let js = jetstream::new(nats);
    let topology = Topology::new(&config.subject_prefix, config.runtime.turn_partitions);
    let stream_name = topology.events_stream();
    let stream = js.get_stream(&stream_name).await.with_context(|| {
        format!("the events stream {stream_name} (run `switchboard streams apply` or start the product first)")
    })?;
    let stack = match config.readers.local_stack.as_deref() {
        Some(dir) => Some(LocalStack::new(dir)?),
        None => None,
    };
    match command {
        ReadersCommand::Add {
            name,
            from,
            events,
            json,
        } => {
            let prefix = format!("{}.events.", config.subject_prefix);
            let filters = events.iter().map(|e| format!("{prefix}{e}")).collect();
            add(&config, &stream, stack.as_ref(), &name, from, filters, json).await
        }
        ReadersCommand::List { json } => {
            let configured = match &stack {
                Some(s) => Some(s.readers()?),
                None => None,
            };
            let mut infos = Vec::new();
            let mut names = stream.consumer_names();
            while let Some(consumer) = names.next().await {
                let consumer = consumer?;
                let Some(name) = consumer.strip_prefix(PREFIX) else {
                    continue;
                };
                let info = stream.consumer_info(&consumer).await?;
                infos.push(ReaderInfo {
                    name: name.to_string(),
                    user: consumer.clone(),
                    stream: stream_name.clone(),
                    filter_subjects: filters_of(&info.config),
                    pending: info.num_pending,
                    ack_pending: info.num_ack_pending,
                    acked_through: info.ack_floor.stream_sequence,
                    user_configured: configured
                        .as_ref()
                        .map(|c| c.iter().any(|r| r.user == consumer)),
                    consumer,
                });
            }
            infos.sort_by(|a, b| a.name.cmp(&b.name));
            if json {
                println!("{}", serde_json::to_string_pretty(&infos)?);
            } else if infos.is_empty() {
                eprintln!("no readers on {stream_name}");
            } else {
                println!("NAME\tPENDING\tACK_PENDING\tACKED_THROUGH\tUSER\tEVENTS");
                for i in &infos {
                    let user = match i.user_configured {
                        Some(true) => "configured",
                        Some(false) => "MISSING",
                        None => "-",
                    };
                    let events = if i.filter_subjects.is_empty() {
                        "all".to_string()
                    } else {
                        i.filter_subjects.join(",")
                    };
                    println!(
                        "{}\t{}\t{}\t{}\t{user}\t{events}",
                        i.name, i.pending, i.ack_pending, i.acked_through
                    );
                }
            }
            Ok(())
        }
        ReadersCommand::Remove { name, json } => {
            check_name(&name)?;
            let user = format!("{PREFIX}{name}");
            let had_consumer = match stream.delete_consumer(&user).await {
                Ok(_) => true,
                Err(e) if e.to_string().contains("not found") => false,
                Err(e) => return Err(e).context("deleting the reader's consumer"),
            };
            let had_user = match &stack {
                Some(s) => {
                    let mut found = false;
                    s.update(|readers| {
                        let before = readers.len();
                        readers.retain(|r| r.user != user);
                        found = readers.len() != before;
                        Ok(())
                    })?;
                    Some(found)
                }
                None => None,
            };
            if !had_consumer && had_user != Some(true) {
                bail!("no reader '{name}' on {stream_name}");
            }
            if json {
                let body = serde_json::json!({
                    "name": name, "user": user, "consumer_removed": had_consumer,
                    "user_removed": had_user,
                });
                println!("{body}");
            } else {
                eprintln!("reader '{name}' removed: its consumer and its position are gone");
                if had_user.is_none() {
                    eprintln!(
                        "remove the account \"READER_{user}\" (and its exports) from your \
                         nats.conf and reload the servers (nats-server --signal reload)"
                    );
                }
            }
            Ok(())
        }
    }
}

fn check_name(name: &str) -> anyhow::Result<()> {
    if !is_name(name) || name.len() > 48 {
        bail!("reader name '{name}': use letters, digits, '_' and '-' (at most 48)");
    }
    Ok(())
}

fn filters_of(c: &consumer::Config) -> Vec<String> {
    let mut all = c.filter_subjects.clone();
    if !c.filter_subject.is_empty() {
        all.push(c.filter_subject.clone());
    }
    all
}

async fn add(
    config: &Config,
    stream: &Stream,
    stack: Option<&LocalStack>,
    name: &str,
    from: Start,
    filter_subjects: Vec<String>,
    json: bool,
) -> anyhow::Result<()> {
    check_name(name)?;
    let user = format!("{PREFIX}{name}");
    let stream_name = stream.cached_info().config.name.clone();
    if stream.consumer_info(&user).await.is_ok() {
        bail!("reader '{name}' exists on {stream_name}; `switchboard readers remove {name}` first");
    }
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(user.clone()),
            description: Some(format!("switchboard reader {name}")),
            deliver_policy: from.deliver_policy(),
            ack_policy: consumer::AckPolicy::Explicit,
            filter_subjects: filter_subjects.clone(),
            ..Default::default()
        })
        .await
        .context("creating the reader's consumer")?;
    let password = hex::encode(rand::random::<[u8; 24]>());
    let reader = Reader {
        user: user.clone(),
        password_hash: bcrypt::hash(&password, BCRYPT_COST)?,
        stream: stream_name.clone(),
        consumer: user.clone(),
    };
    let target = switchboard_kit::endpoint::nats_target(&config.nats_url)?;
    let nats_url = target.servers.join(",");
    let configured = match stack {
        Some(s) => {
            let made = s.update(|readers| {
                if readers.iter().any(|r| r.user == user) {
                    return Err(switchboard_stack::Error::Invalid(format!(
                        "the stack already has a NATS user {user}"
                    )));
                }
                readers.push(reader.clone());
                Ok(())
            });
            let checked = match made {
                Ok(()) => wait_until_it_connects(&nats_url, &reader, &password).await,
                Err(e) => Err(e),
            };
            if let Err(e) = checked {
                // No reader half made: the consumer goes with the user that failed.
                let _ = stream.delete_consumer(&user).await;
                return Err(e);
            }
            true
        }
        None => false,
    };
    if json {
        let body = serde_json::json!({
            "user": user,
            "password": password,
            "stream": stream_name,
            "consumer": user,
            "nats_url": nats_url,
            "inbox_prefix": reader.inbox_prefix(),
            "api_prefix": EVENTS_API_PREFIX,
            "filter_subjects": filter_subjects,
            "user_configured": configured,
        });
        println!("{body}");
    } else {
        eprintln!(
            "reader '{name}': consumer {user} on {stream_name}. Connect as user {user} with \
             inbox prefix {} and JetStream API prefix {EVENTS_API_PREFIX} (the password is shown \
             once; store it now):",
            reader.inbox_prefix()
        );
        println!("{password}");
    }
    if !configured {
        eprintln!(
            "add this reader's account and the exports it imports to your nats.conf and reload \
             the servers twice (nats-server --signal reload; a reload leaves a new account's \
             imports unresolved until the next); deploy/README.md shows where:\n{}",
            config_for_your_own(&reader, PRODUCT_ACCOUNT)
        );
    }
    Ok(())
}

/// The server reloads its config asynchronously after SIGHUP: the reader's credentials are
/// handed out only once they work.
async fn wait_until_it_connects(url: &str, reader: &Reader, password: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let options = async_nats::ConnectOptions::new()
            .user_and_password(reader.user.clone(), password.to_string())
            .custom_inbox_prefix(reader.inbox_prefix())
            .max_reconnects(Some(1));
        let tried = tokio::time::timeout(Duration::from_secs(3), async {
            let client = options.connect(url).await?;
            // In its own account the reader reaches its consumer under the API prefix.
            let js = jetstream::with_prefix(client, EVENTS_API_PREFIX);
            let stream = js.get_stream_no_info(&reader.stream).await?;
            stream.consumer_info(&reader.consumer).await?;
            anyhow::Ok(())
        })
        .await;
        match tried {
            Ok(Ok(())) => return Ok(()),
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Err(e)) => return Err(e.context("the new reader could not connect")),
            Err(_) => bail!("the new reader could not connect within 10 s"),
        }
    }
}

/// The embedded stack whose NATS config holds the readers' users.
struct LocalStack {
    settings: switchboard_stack::layout::Settings,
    name: String,
}

impl LocalStack {
    fn new(dir: &Path) -> anyhow::Result<LocalStack> {
        let root: PathBuf = dir.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let root_text = root.to_string_lossy().into_owned();
        let settings = switchboard_stack::layout::Settings::from_lookup(|k| {
            (k == "SB_STACK_DIR").then(|| root_text.clone())
        })
        .with_context(|| format!("readers.local_stack {}", dir.display()))?;
        Ok(LocalStack { settings, name })
    }

    fn readers(&self) -> anyhow::Result<Vec<Reader>> {
        Ok(switchboard_stack::commands::readers(
            &self.settings,
            &self.name,
        )?)
    }

    fn update(
        &self,
        change: impl FnOnce(&mut Vec<Reader>) -> switchboard_stack::Result<()>,
    ) -> anyhow::Result<()> {
        switchboard_stack::commands::update_readers(&self.settings, &self.name, change)
            .with_context(|| format!("updating the NATS users of stack '{}'", self.name))?;
        Ok(())
    }
}
