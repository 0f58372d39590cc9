//! `switchboard sessions list|show|reset|export|takeover|reply|handback`: the sessions API's
//! read model
//! ([`switchboard_kit::sessions`]) straight against the database, as tables for a person or
//! (`--json`) as the API answers, for a script.
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Subcommand;
use sqlx::PgPool;
use switchboard_kit::Config;
use switchboard_kit::sessions::{self, ResetRequest, SessionFilter, SessionView};
use switchboard_kit::status::SessionStatus;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum SessionsCommand {
    /// Sessions, newest first (as GET /api/v1/sessions); each filter given must hold.
    List {
        /// Only this person's (`phone:+14155550100`, `chat:ana`, `api:crm-7`).
        #[arg(long)]
        person: Option<String>,
        /// Only this agent's: an engine variant (reggie_oc) or an identity (reggie).
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, value_parser = parse_status)]
        status: Option<SessionStatus>,
        /// Only sessions that began on or used this channel (sms, chat, api, …).
        #[arg(long)]
        channel: Option<String>,
        /// Sessions at most (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=500))]
        limit: i64,
        /// The `next` a list printed: the page after it.
        #[arg(long)]
        after: Option<Uuid>,
        /// `{"sessions": [...], "next": ...}`, as the API answers.
        #[arg(long)]
        json: bool,
    },
    /// One session: who, which agent, its turns, its summary, its last messages and journal
    /// entries.
    Show {
        id: Uuid,
        /// How many of the last messages and journal entries to show.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(0..=500))]
        last: i64,
        /// The API's view of the session with `summary`, `messages` and `events` (the last ones).
        #[arg(long)]
        json: bool,
    },
    /// Start the session over: its next turn opens a fresh engine session (as POST
    /// /api/v1/sessions/{id}/reset; the journal records who asked).
    Reset {
        id: Uuid,
        #[arg(long)]
        json: bool,
    },
    /// Take the conversation over from the agent: its turns are held, you answer (as POST
    /// /api/v1/sessions/{id}/takeover; the journal records `cli:<login>`).
    Takeover {
        id: Uuid,
        #[arg(long)]
        json: bool,
    },
    /// Answer the person during a takeover, on the channel they last wrote on.
    Reply {
        id: Uuid,
        text: String,
        #[arg(long)]
        json: bool,
    },
    /// Give the conversation back to the agent; it answers what you left unanswered and is told
    /// what was said meanwhile.
    Handback {
        id: Uuid,
        #[arg(long)]
        json: bool,
    },
    /// The whole conversation as JSON lines, one message a line, oldest first (as GET
    /// /api/v1/sessions/{id}/export).
    Export {
        id: Uuid,
        /// Write to this file (default: standard output).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn parse_status(name: &str) -> Result<SessionStatus, String> {
    sessions::parse_status(name).ok_or_else(|| {
        let known: Vec<_> = sessions::STATUSES.iter().map(|s| s.as_str()).collect();
        format!("one of {}", known.join(", "))
    })
}

pub async fn run(config: Config, command: SessionsCommand) -> anyhow::Result<()> {
    use crate::takeover_cli::Step;
    let step = match &command {
        SessionsCommand::Takeover { id, json } => Some((*id, Step::Take, *json)),
        SessionsCommand::Reply { id, text, json } => Some((*id, Step::Reply(text.clone()), *json)),
        SessionsCommand::Handback { id, json } => Some((*id, Step::HandBack, *json)),
        _ => None,
    };
    if let Some((id, step, json)) = step {
        let app = switchboard_kit::startup::App::connect(config, "cli").await?;
        return crate::takeover_cli::run(&app, &asker(), id, step, json).await;
    }
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    match command {
        SessionsCommand::List {
            person,
            agent,
            status,
            channel,
            limit,
            after,
            json,
        } => {
            let filter = SessionFilter {
                person,
                agent,
                status,
                channel,
            };
            list(&db, &filter, after, limit, json).await
        }
        SessionsCommand::Show { id, last, json } => show(&db, id, last, json).await,
        SessionsCommand::Reset { id, json } => reset(&db, id, json).await,
        SessionsCommand::Export { id, output } => export(&db, id, output).await,
        SessionsCommand::Takeover { .. }
        | SessionsCommand::Reply { .. }
        | SessionsCommand::Handback { .. } => unreachable!("run above"),
    }
}

fn when(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

async fn list(
    db: &PgPool,
    filter: &SessionFilter,
    after: Option<Uuid>,
    limit: i64,
    json: bool,
) -> anyhow::Result<()> {
    let page = sessions::list_sessions(db, filter, after, limit).await?;
    if json {
        let body = serde_json::json!({"sessions": page.items, "next": page.next});
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    if page.items.is_empty() {
        println!("no sessions");
        return Ok(());
    }
    println!(
        "{:<36}  {:<28}  {:<16}  {:<10}  {:<16}  {:>5}  LAST MESSAGE",
        "SESSION", "PERSON", "AGENT", "STATUS", "CHANNELS", "TURNS"
    );
    for s in &page.items {
        println!(
            "{:<36}  {:<28}  {:<16}  {:<10}  {:<16}  {:>5}  {}",
            s.id,
            s.person.id,
            s.agent.name,
            s.status.as_str(),
            s.channels.join(","),
            s.turns.done,
            when(s.last_message_at),
        );
    }
    if let Some(next) = page.next {
        println!("more: --after {next}");
    }
    Ok(())
}

async fn found(db: &PgPool, id: Uuid) -> anyhow::Result<SessionView> {
    match sessions::find_session(db, id).await? {
        Some(s) => Ok(s),
        None => bail!("no session {id}"),
    }
}

async fn show(db: &PgPool, id: Uuid, last: i64, json: bool) -> anyhow::Result<()> {
    let session = found(db, id).await?;
    let summary = sessions::session_summary(db, &session).await?;
    let messages = sessions::last_messages(db, id, last).await?;
    let events = sessions::last_events(db, id, last).await?;
    if json {
        let mut body = serde_json::to_value(&session)?;
        body["summary"] = serde_json::to_value(&summary)?;
        body["messages"] = serde_json::to_value(&messages)?;
        body["events"] = serde_json::to_value(&events)?;
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let s = &session;
    println!("session   {} ({})", s.id, s.status.as_str());
    println!("person    {} ({})", s.person.id, s.person.person_type);
    println!(
        "agent     {} (identity {}, engine {})",
        s.agent.name, s.agent.identity, s.agent.engine
    );
    println!("channels  {}", s.channels.join(", "));
    println!(
        "turns     {} done of {} opened; engine session {}; {} reset(s){}",
        s.turns.done,
        s.turns.opened,
        s.engine_session_id.as_deref().unwrap_or("none yet"),
        s.resets,
        if s.pending_reset.is_some() {
            "; a reset waits for the next turn"
        } else {
            ""
        }
    );
    println!(
        "began     {}; last message {}",
        when(Some(s.created_at)),
        when(s.last_message_at)
    );
    match &summary {
        Some(m) => println!(
            "summary   version {} ({}, {} messages, {}): {}",
            m.version,
            m.method,
            m.messages_covered,
            when(Some(m.written_at)),
            m.text
        ),
        None => println!("summary   none yet"),
    }
    if last > 0 {
        println!("\nlast messages:");
        if messages.is_empty() {
            println!("  none");
        }
        for m in &messages {
            let arrow = if m.direction == "inbound" {
                "in "
            } else {
                "out"
            };
            println!(
                "  {}  {arrow}  {:<8}  {}",
                when(Some(m.at)),
                m.channel,
                m.text
            );
        }
        println!("\nlast journal entries:");
        if events.is_empty() {
            println!("  none");
        }
        for e in &events {
            let kind = serde_json::to_value(e.kind)?;
            println!(
                "  {}  {:<15}  {}  {}",
                when(Some(e.at)),
                kind.as_str().unwrap_or_default(),
                e.seq.map_or_else(|| "-".into(), |s| format!("turn {s}")),
                e.detail
            );
        }
    }
    Ok(())
}

/// Who asks, as the journal records it: `cli:<login>`.
fn asker() -> String {
    let login = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "operator".into());
    format!("cli:{login}")
}

async fn reset(db: &PgPool, id: Uuid, json: bool) -> anyhow::Result<()> {
    match sessions::request_reset(db, id, &asker()).await? {
        ResetRequest::Pending(at) => {
            if json {
                let body = serde_json::json!({
                    "session_id": id,
                    "pending_reset": "api",
                    "pending_reset_at": at,
                });
                println!("{body}");
            } else {
                println!("session {id}: its next turn starts a fresh engine session");
            }
            Ok(())
        }
        ResetRequest::NoSuchSession => bail!("no session {id}"),
        ResetRequest::Terminated => {
            bail!("session {id} is terminated: it takes no more turns")
        }
    }
}

/// Pages of this many messages, each written as it is read.
const EXPORT_BATCH: i64 = 500;

async fn export(db: &PgPool, id: Uuid, output: Option<PathBuf>) -> anyhow::Result<()> {
    if !sessions::session_exists(db, id).await? {
        bail!("no session {id}");
    }
    let mut out: Box<dyn std::io::Write> = match &output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let (mut after, mut written) = (None, 0usize);
    loop {
        let page = sessions::session_messages(db, id, after, EXPORT_BATCH).await?;
        for m in &page.items {
            serde_json::to_writer(&mut out, m)?;
            out.write_all(b"\n")?;
        }
        written += page.items.len();
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    out.flush()?;
    drop(out);
    if let Some(path) = output {
        eprintln!("{written} messages written to {}", path.display());
    }
    Ok(())
}
