//! `switchboard`: run everything in one process (`up`), one worker (`worker <name>`) or the
//! gateway (`gateway`); list the stages, manage streams, migrations, the directory and dead
//! letters, and act as Twilio to try the product (`sms send`).
use std::time::Duration;

use clap::{Parser, Subcommand};
use switchboard::stages;
use switchboard_kit::Config;
use switchboard_kit::startup::App;

mod api_keys_cli;
mod backup;
#[cfg(test)]
mod cli_reference_tests;
mod demo_outbox;
mod dlq_cli;
mod forget;
mod local_stack;
mod people_cli;
mod proto_json;
mod readers_cli;
mod reembed;
mod search_cli;
mod send_cli;
mod sessions_cli;
mod slack_cli;
mod sms_cli;
mod status;
mod tail;
mod takeover_cli;
mod telegram_cli;
mod topology_cli;
mod whatsapp_cli;

#[derive(Parser)]
#[command(name = "switchboard", version, about)]
struct Cli {
    /// Configuration file (default: $SB_CONFIG, else ./switchboard.toml).
    #[arg(long, global = true)]
    config: Option<std::path::PathBuf>,
    /// Log what a command does (info; -vv: debug). A command logs only warnings by default;
    /// `up`, `worker` and `gateway` log info. `RUST_LOG` wins over both.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway and every worker in one process.
    Up,
    /// Run one worker's stages in this process (scale a stage by running more of these).
    Worker {
        /// Stage names (`log-inbound`) or worker names (`log`: both log stages).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Run the gateway alone (scale it by running more behind a load balancer).
    Gateway,
    /// List the stages: what each reads and the knobs it runs with under this configuration.
    Stages {
        /// An array, one object per stage.
        #[arg(long)]
        json: bool,
    },
    /// How it is doing, from NATS and Postgres: per stage its backlog (pending), messages in
    /// hand, redeliveries, replicas pulling and dead letters; stream sizes; live dispatchers;
    /// sessions waiting for a runner. Exits 0 once both answered.
    Status {
        /// One JSON document (`stages`, `streams`, `dispatchers_alive`, `waiting_for_runner`).
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script: `source <(switchboard completions bash)` (or zsh, fish,
    /// elvish, powershell). Needs no configuration.
    Completions { shell: clap_complete::Shell },
    /// Apply database migrations.
    Migrate {
        /// `{"applied", "latest_version", "latest"}`.
        #[arg(long)]
        json: bool,
    },
    /// Streams and consumers.
    Streams {
        #[command(subcommand)]
        command: topology_cli::StreamsCommand,
    },
    /// Dead letters.
    Dlq {
        #[command(subcommand)]
        command: dlq_cli::DlqCommand,
    },
    /// The people directory.
    Directory {
        #[command(subcommand)]
        command: DirectoryCommand,
    },
    /// Import the directory from a CSV file; link, unlink and merge person ids.
    People {
        #[command(subcommand)]
        command: people_cli::PeopleCommand,
    },
    /// Act as Twilio or TextMagic: send an SMS webhook to the gateway.
    Sms {
        #[command(subcommand)]
        command: sms_cli::SmsCommand,
    },
    /// A Telegram bot: point its webhook at this gateway.
    Telegram {
        #[command(subcommand)]
        command: telegram_cli::TelegramCommand,
    },
    /// API keys for the REST API (stored hashed; a key is printed once, when made).
    ApiKeys {
        #[command(subcommand)]
        command: api_keys_cli::ApiKeysCommand,
    },
    /// The chat socket: make a token (HS256, from chat.jwt_secret) or chat as a user.
    Chat {
        #[command(subcommand)]
        command: ChatCommand,
    },
    /// Search the messages by meaning and by words (as GET /api/v1/search).
    Search(search_cli::SearchArgs),
    /// What the memory workers' labels add up to (as GET /api/v1/analytics/categories).
    Analytics {
        #[command(subcommand)]
        command: search_cli::AnalyticsCommand,
    },
    /// Send one message through any channel as its client would (signed SMS webhook, chat
    /// socket, REST API) and print the reply: for trying it end to end.
    Send(send_cli::SendArgs),
    /// Follow the public events as JSON lines (from now, a time or a stream sequence).
    Tail(tail::TailArgs),
    /// Analytics readers that keep their place in the event stream: a durable consumer and a
    /// NATS user allowed only to fetch and ack on it.
    Readers {
        #[command(subcommand)]
        command: readers_cli::ReadersCommand,
    },
    /// Sessions: list them, read one, start one over, export its conversation.
    Sessions {
        #[command(subcommand)]
        command: sessions_cli::SessionsCommand,
    },
    /// Erase a person completely (rows, workspaces, stream messages, dead letters) as a job,
    /// follow it until the forget worker has finished it, and print what was removed per kind;
    /// `person.forgotten` tells downstream consumers.
    Forget {
        person: String,
        #[arg(long)]
        json: bool,
        /// Print the job as it started (its id, status and status URL) without waiting.
        #[arg(long)]
        no_wait: bool,
        /// How long to follow the job (seconds) before giving up waiting (the job goes on).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Give every message a vector under the configured embedding model (after a model change;
    /// resumable, the old model's vectors stay).
    Reembed {
        /// Texts per embedding call (default: [embedding] batch).
        #[arg(long)]
        batch: Option<usize>,
        /// `{"embedded", "model", "missing"}`.
        #[arg(long)]
        json: bool,
    },
    /// Write the product's state to a new folder: a snapshot of each stream (messages and
    /// consumers), then a Postgres dump (pg_dump). See docs/operations.md.
    Backup {
        dir: std::path::PathBuf,
        /// The folder holding pg_dump and pg_restore (default: the PATH; the embedded stack
        /// exports its own as SB_PG_BIN).
        #[arg(long, env = "SB_PG_BIN")]
        pg_bin: Option<std::path::PathBuf>,
        /// Seconds to wait for the workers' consumers to go quiet before refusing.
        #[arg(long, default_value_t = 60)]
        quiet_wait_s: u64,
        /// The manifest (`format`, `taken_at`, `streams`, `postgres`) and `dir`.
        #[arg(long)]
        json: bool,
    },
    /// Restore a backup into an empty database and a NATS without the product's streams, then
    /// start the workers: the sessions carry on.
    Restore {
        dir: std::path::PathBuf,
        /// As for `backup`.
        #[arg(long, env = "SB_PG_BIN")]
        pg_bin: Option<std::path::PathBuf>,
        /// The backup's manifest, `dir` and `"restored": true`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ChatCommand {
    /// Print a chat token for `sub`, signed with chat.jwt_secret (for trying chat; in
    /// production your own login issues them).
    Token {
        #[arg(long)]
        sub: String,
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long, default_value = "")]
        role: String,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: i64,
        /// `{"token", "sub", "expires_at"}`.
        #[arg(long)]
        json: bool,
    },
    /// Connect as `sub`, send one message (with files, uploaded first), print the reply.
    Send {
        #[arg(long)]
        sub: String,
        #[arg(long, default_value = "")]
        text: String,
        /// A file to send with the message (repeatable): uploaded, then named by the message.
        #[arg(long = "file")]
        files: Vec<std::path::PathBuf>,
        #[arg(long, default_value = "")]
        agent: String,
        /// admin_chat or header_widget.
        #[arg(long, default_value = "admin_chat")]
        channel: String,
        /// Seconds to wait for the reply.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// The reply as `{"agent", "text", ...}`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DirectoryCommand {
    /// Add (or update) a person with a phone number.
    Add {
        #[arg(long)]
        id: String,
        #[arg(long = "type", default_value = "participant")]
        person_type: String,
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long, default_value = "")]
        role: String,
        #[arg(long)]
        phone: Option<String>,
        /// `{"id", "type", "phone"}` (the phone as stored, E.164).
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory as _;
        use std::io::Write as _;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "switchboard", &mut script);
        // A reader that stopped early (`| head`) is not an error.
        match std::io::stdout().write_all(&script) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
            _ => return Ok(()),
        }
    }
    let mut config = match &cli.config {
        Some(path) => Config::load_from(path)?,
        None => Config::load()?,
    };
    // Next to `make run`'s stack with nothing configured: its credentials, found by themselves.
    let local_stack = std::env::current_dir()
        .ok()
        .and_then(|cwd| local_stack::use_local_stack(&mut config, &cwd));
    // The service name the traces show: which worker (or the whole product) this process is.
    let service = match &cli.command {
        Command::Worker { names } => format!("switchboard-{}", names.join("+")),
        Command::Gateway => "switchboard-gateway".to_string(),
        _ => "switchboard".to_string(),
    };
    let levels = match (&cli.command, cli.verbose) {
        (Command::Up | Command::Worker { .. } | Command::Gateway, 0) => {
            switchboard_kit::telemetry::SERVICE_LOG_LEVELS
        }
        (_, 0) => switchboard_kit::telemetry::COMMAND_LOG_LEVELS,
        (_, 1) => switchboard_kit::telemetry::SERVICE_LOG_LEVELS,
        _ => "debug,sqlx=info,async_nats=info",
    };
    let _traces = switchboard_kit::telemetry::init_at(
        levels,
        config.log_format,
        &config.telemetry,
        &service,
    )?;
    if let Some(env) = local_stack {
        tracing::debug!(file = %env.display(), "using the embedded stack's credentials");
    }
    match cli.command {
        Command::Up => up(config).await,
        Command::Worker { names } => switchboard::run_worker(config, &names).await,
        Command::Gateway => switchboard::run_gateway(config).await,
        Command::Stages { json } => topology_cli::list_stages(&config, json),
        Command::Migrate { json } => {
            let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
            switchboard_kit::db::migrate(&db).await?;
            let latest = switchboard_kit::db::MIGRATOR.iter().last();
            if json {
                let body = serde_json::json!({
                    "applied": true,
                    "latest_version": latest.map(|m| m.version),
                    "latest": latest.map(|m| m.description.to_string()),
                });
                println!("{body}");
            } else {
                println!("migrations applied");
            }
            Ok(())
        }
        Command::Streams { command } => topology_cli::streams(config, command).await,
        Command::Dlq { command } => dlq_cli::run(config, command).await,
        Command::Directory { command } => directory(config, command).await,
        Command::People { command } => people_cli::run(config, command).await,
        Command::Sms { command } => sms_cli::run(config, command).await,
        Command::Telegram { command } => telegram_cli::run(config, command).await,
        Command::ApiKeys { command } => api_keys_cli::run(config, command).await,
        Command::Chat { command } => chat(config, command).await,
        Command::Search(args) => search_cli::search_command(config, args).await,
        Command::Analytics { command } => search_cli::analytics_command(config, command).await,
        Command::Tail(args) => tail::run(config, args).await,
        Command::Send(args) => send_cli::run(config, args).await,
        Command::Sessions { command } => sessions_cli::run(config, command).await,
        Command::Readers { command } => readers_cli::run(config, command).await,
        Command::Forget {
            person,
            json,
            no_wait,
            timeout,
        } => {
            let options = forget::Options {
                json,
                no_wait,
                timeout: std::time::Duration::from_secs(timeout),
            };
            forget::run(config, &person, options).await
        }
        Command::Status { json } => status::run(config, stages::ALL, json).await,
        Command::Completions { .. } => unreachable!("printed before the configuration is read"),
        Command::Reembed { batch, json } => reembed::run(config, batch, json).await,
        Command::Backup {
            dir,
            pg_bin,
            quiet_wait_s,
            json,
        } => {
            let wait = std::time::Duration::from_secs(quiet_wait_s);
            backup::backup(config, &dir, pg_bin.as_deref(), wait, json).await
        }
        Command::Restore { dir, pg_bin, json } => {
            backup::restore(config, &dir, pg_bin.as_deref(), json).await
        }
    }
}

async fn up(config: Config) -> anyhow::Result<()> {
    let _ = switchboard_kit::telemetry::metrics();
    let app = App::start(
        config.for_gateway(),
        "up",
        stages::ALL,
        switchboard_kit::startup::STARTUP_WAIT,
    )
    .await?;
    app.shutdown.trigger_on_signals();
    let (routes, follower) = switchboard::gateway_routes(&app)?;
    let all: Vec<_> = stages::ALL.iter().collect();
    let mut tasks = stages::tasks(&app, &all);
    tasks.push(follower);
    tasks.push(
        app.serve_http(&app.config.gateway.http_addr, routes)
            .await?,
    );
    tasks.push(switchboard::gateway_admin_task(&app).await?);
    tracing::info!(
        gateway = %app.config.gateway.http_addr,
        admin = %app.config.admin.http_addr,
        "switchboard is up: gateway and all workers in one process; the ops console is at \
         http://{}/console",
        app.config.admin.http_addr
    );
    app.run(tasks).await
}

async fn directory(config: Config, command: DirectoryCommand) -> anyhow::Result<()> {
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    switchboard_kit::db::migrate(&db).await?;
    match command {
        DirectoryCommand::Add {
            id,
            person_type,
            name,
            role,
            phone,
            json,
        } => {
            let mut tx = db.begin().await?;
            sqlx::query!(
                "INSERT INTO switchboard.people (person_id, person_type, name, role)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (person_id) DO UPDATE
                   SET person_type = EXCLUDED.person_type, name = EXCLUDED.name, role = EXCLUDED.role",
                id,
                person_type,
                name,
                role,
            )
            .execute(&mut *tx)
            .await?;
            let stored_phone = if let Some(phone) = phone {
                let e164 = switchboard_kit::address::normalize_phone(
                    &phone,
                    &config.identity.default_region,
                )?;
                sqlx::query!(
                    "INSERT INTO switchboard.contact_points (kind, address, person_id)
                     VALUES ('phone', $1, $2)
                     ON CONFLICT (kind, address) DO UPDATE SET person_id = EXCLUDED.person_id",
                    e164,
                    id,
                )
                .execute(&mut *tx)
                .await?;
                Some(e164)
            } else {
                None
            };
            tx.commit().await?;
            if json {
                let body =
                    serde_json::json!({"id": id, "type": person_type, "phone": stored_phone});
                println!("{body}");
            } else if let Some(e164) = stored_phone {
                println!("{id} ({person_type}) reachable at {e164}");
            } else {
                println!("{id} ({person_type}) saved");
            }
        }
    }
    Ok(())
}

async fn chat(config: Config, command: ChatCommand) -> anyhow::Result<()> {
    match command {
        ChatCommand::Token {
            sub,
            name,
            role,
            ttl,
            json,
        } => {
            let token = switchboard::chat::token(&config, &sub, &name, &role, ttl)?;
            if json {
                let expires_at = chrono::Utc::now() + chrono::Duration::seconds(ttl);
                let body = serde_json::json!({
                    "token": token, "sub": sub, "expires_at": expires_at.to_rfc3339(),
                });
                println!("{body}");
            } else {
                println!("{token}");
            }
            Ok(())
        }
        ChatCommand::Send {
            sub,
            text,
            files,
            agent,
            channel,
            wait,
            json,
        } => {
            let token = switchboard::chat::token(&config, &sub, "", "", 600)?;
            let mut uploads = Vec::with_capacity(files.len());
            for file in &files {
                uploads.push(switchboard::chat::upload(&config, &token, file).await?);
            }
            let reply = switchboard::chat::send(
                &config,
                &token,
                &channel,
                &agent,
                &text,
                &uploads,
                Duration::from_secs(wait),
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string(&reply)?);
            } else {
                println!("{}: {}", reply.agent, reply.text);
            }
            Ok(())
        }
    }
}
