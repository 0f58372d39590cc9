//! `switchboard people import|link|unlink|merge|links`: the directory from a CSV file, and the
//! links that make several ids one person, with their audit trail. `--json` for scripts.
use anyhow::{Context as _, bail};
use clap::Subcommand;
use switchboard_identify::links::{IdentityLinks, LinkAction, Outcome, Request};
use switchboard_kit::Config;

#[derive(Subcommand)]
pub enum PeopleCommand {
    /// Add or update people from a CSV file (columns: person_id, person_type, name, role,
    /// phone, email) and report the rows added, updated, unchanged and refused. Exits with 1
    /// when a row was refused (the others are imported).
    Import {
        /// The CSV file, with a header row.
        path: std::path::PathBuf,
        /// `{"added", "updated", "unchanged", "refused": [{"line", "reason"}]}`.
        #[arg(long)]
        json: bool,
    },
    /// Treat messages from person `from` as person `to`'s from now on (they share `to`'s
    /// session). Refused for a person linked to itself, a cycle, or a `from` already linked.
    Link(LinkArgs),
    /// Remove the link `from → to`: new messages from `from` are its own again.
    Unlink(LinkArgs),
    /// Link `from` to `to` and move `from`'s contact points (and the address its id names) to
    /// `to`. Unlinking afterwards does not move them back.
    Merge(LinkArgs),
    /// The links in force and the audit trail of every link, unlink and merge, newest first.
    Links {
        /// Only those from or to this person.
        #[arg(long)]
        person: Option<String>,
        /// At most this many audit entries.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// `{"links": [...], "audit": [...]}`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct LinkArgs {
    /// The person id whose messages are redirected (`phone:+14155550100`, `user:ana`, …).
    from: String,
    /// The canonical person id.
    to: String,
    /// Why (kept in the audit trail).
    #[arg(long)]
    reason: String,
    /// Who does it (default: the OS user).
    #[arg(long)]
    by: Option<String>,
    /// `{"changed": bool, "entry": {...}}` (the audit entry recorded, if any).
    #[arg(long)]
    json: bool,
}

pub async fn run(config: Config, command: PeopleCommand) -> anyhow::Result<()> {
    let (action, args) = match command {
        PeopleCommand::Import { path, json } => return import(config, path, json).await,
        PeopleCommand::Links {
            person,
            limit,
            json,
        } => return links(config, person, limit, json).await,
        PeopleCommand::Link(args) => (LinkAction::Link, args),
        PeopleCommand::Unlink(args) => (LinkAction::Unlink, args),
        PeopleCommand::Merge(args) => (LinkAction::Merge, args),
    };
    let actor = args.by.clone().unwrap_or_else(switchboard::os_user);
    let store = store(&config).await?;
    let request = Request {
        from: &args.from,
        to: &args.to,
        actor: &actor,
        reason: &args.reason,
    };
    match store.apply(action, request).await? {
        Outcome::Recorded(a) => {
            if args.json {
                println!("{}", serde_json::json!({ "changed": true, "entry": a }));
                return Ok(());
            }
            let verb = match a.action {
                LinkAction::Link => "linked",
                LinkAction::Unlink => "unlinked",
                LinkAction::Merge => "merged",
            };
            println!(
                "{verb} {} → {} (by {}: {})",
                a.from_person_id, a.to_person_id, a.actor, a.reason
            );
            if !a.moved.is_empty() {
                println!("moved to {}: {}", a.to_person_id, a.moved.join(", "));
            }
        }
        Outcome::Unchanged if args.json => {
            println!("{}", serde_json::json!({ "changed": false, "entry": null }));
        }
        Outcome::Unchanged => println!(
            "{} → {}: already so; nothing changed, nothing recorded",
            args.from, args.to
        ),
    }
    Ok(())
}

async fn store(config: &Config) -> anyhow::Result<IdentityLinks> {
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    switchboard_kit::db::migrate(&db).await?;
    Ok(IdentityLinks::new(db, config.identity.clone()))
}

async fn links(
    config: Config,
    person: Option<String>,
    limit: i64,
    json: bool,
) -> anyhow::Result<()> {
    let store = store(&config).await?;
    let links = store.links(person.as_deref()).await?;
    let audit = store.audit(person.as_deref(), limit).await?;
    if json {
        let body = serde_json::json!({ "links": links, "audit": audit });
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    println!("links ({}):", links.len());
    for l in links {
        println!(
            "  {} → {}  ({} by {} at {}: {})",
            l.from_person_id,
            l.to_person_id,
            l.action.as_str(),
            l.linked_by,
            l.created_at.to_rfc3339(),
            l.reason
        );
    }
    println!("audit, newest first:");
    for a in audit {
        let moved = if a.moved.is_empty() {
            String::new()
        } else {
            format!(" [moved {}]", a.moved.join(", "))
        };
        println!(
            "  {}  {:<6} {} → {}  by {}: {}{moved}",
            a.at.to_rfc3339(),
            a.action.as_str(),
            a.from_person_id,
            a.to_person_id,
            a.actor,
            a.reason
        );
    }
    Ok(())
}

async fn import(config: Config, path: std::path::PathBuf, json: bool) -> anyhow::Result<()> {
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let rows = switchboard::people::read_rows(file, &config.identity.default_region)
        .with_context(|| format!("reading {}", path.display()))?;
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    switchboard_kit::db::migrate(&db).await?;
    // Drawn only when stderr is a terminal.
    let bar = indicatif::ProgressBar::new(rows.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rows {elapsed}")
            .expect("a valid template"),
    );
    let report = switchboard::people::import(&db, rows, || bar.inc(1)).await?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {} added, {} updated, {} unchanged, {} refused",
            path.display(),
            report.added,
            report.updated,
            report.unchanged,
            report.refused.len()
        );
        for r in &report.refused {
            println!("  line {}: {}", r.line, r.reason);
        }
    }
    if !report.refused.is_empty() {
        bail!("{} rows refused", report.refused.len());
    }
    Ok(())
}
