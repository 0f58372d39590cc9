//! `switchboard dlq list|show|replay`: the dead letters, found by stage, time and error; one
//! read whole (its payload decoded); replayed one by one or in bulk, with a progress bar.
use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchboard_kit::Config;
use switchboard_kit::dlq::{self, DeadLetterView, DlqFilter, StoredDeadLetter};
use switchboard_kit::startup::App;

use crate::proto_json::{ProtoJson, base64};

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Dead letters, oldest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// A JSON array, one object per dead letter (without the payload: see `show`).
        #[arg(long)]
        json: bool,
    },
    /// One dead letter whole: why, where from, how often tried, and its payload decoded.
    Show {
        seq: u64,
        #[arg(long)]
        json: bool,
    },
    /// Publish dead letters' payloads again on their original subjects (each then leaves the
    /// dead-letter stream): the ones named, or with `--all` every one the filters match.
    Replay {
        /// Dead letters by sequence (as `list` shows them).
        seqs: Vec<u64>,
        /// Every dead letter that matches the filters (all of them without one).
        #[arg(long, conflicts_with = "seqs")]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Say what would be replayed, replay nothing.
        #[arg(long)]
        dry_run: bool,
        /// `{"replayed": [...], "failed": [...]}` instead of lines and a progress bar.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Only this stage's.
    #[arg(long)]
    stage: Option<String>,
    /// Only those given up on at or after this RFC 3339 time.
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Only those whose error contains this text (case-insensitive).
    #[arg(long)]
    error: Option<String>,
}

impl FilterArgs {
    fn given(&self) -> bool {
        self.stage.is_some() || self.since.is_some() || self.error.is_some()
    }

    fn filter(&self) -> DlqFilter {
        DlqFilter {
            stage: self.stage.clone(),
            since_ms: self.since.map(|t| t.timestamp_millis()),
            error_contains: self.error.clone(),
        }
    }
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("an RFC 3339 time ({e})"))
}

fn when(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".into(), |t| t.to_rfc3339())
}

pub async fn run(config: Config, command: DlqCommand) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    match command {
        DlqCommand::List {
            filter,
            limit,
            json,
        } => {
            let letters =
                dlq::list_matching(&app.js, &app.topology, &filter.filter(), limit).await?;
            if json {
                let views: Vec<DeadLetterView> = letters.iter().map(DeadLetterView::from).collect();
                println!("{}", serde_json::to_string_pretty(&views)?);
                return Ok(());
            }
            if letters.is_empty() {
                println!("no dead letters");
            }
            for d in &letters {
                let v = DeadLetterView::from(d);
                println!(
                    "#{}  {}  stage={}  subject={}  deliveries={}  type={}\n     error: {}",
                    v.seq,
                    when(v.failed_at),
                    v.stage,
                    v.subject,
                    v.deliveries,
                    if v.message_type.is_empty() {
                        "?"
                    } else {
                        v.message_type
                    },
                    v.error
                );
            }
            Ok(())
        }
        DlqCommand::Show { seq, json } => {
            let d = dlq::get(&app.js, &app.topology, seq).await?;
            let decoder = ProtoJson::new()?;
            let payload = decoder.decode(&d.letter.message_type, &d.letter.payload);
            let mut body = serde_json::to_value(DeadLetterView::from(&d))?;
            match payload {
                Some(data) => body["payload"] = data,
                None => {
                    body["payload"] = serde_json::Value::Null;
                    body["payload_base64"] = base64(&d.letter.payload).into();
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&body)?);
            } else {
                let v = DeadLetterView::from(&d);
                println!("dead letter #{}", v.seq);
                println!("stage       {}", v.stage);
                println!("subject     {}", v.subject);
                println!("type        {}", v.message_type);
                println!("failed at   {}", when(v.failed_at));
                println!("deliveries  {}", v.deliveries);
                println!("correlation {}", v.correlation_id);
                println!("error       {}", v.error);
                println!(
                    "payload     {}",
                    serde_json::to_string_pretty(&body["payload"])?
                );
            }
            Ok(())
        }
        DlqCommand::Replay {
            seqs,
            all,
            filter,
            dry_run,
            json,
        } => {
            let chosen: Vec<StoredDeadLetter> = if all {
                dlq::list_matching(&app.js, &app.topology, &filter.filter(), usize::MAX).await?
            } else if seqs.is_empty() {
                bail!("name the dead letters to replay (their seq, as `dlq list` shows), or --all");
            } else if filter.given() {
                bail!("--stage, --since and --error choose with --all, not beside named letters");
            } else {
                let mut chosen = Vec::new();
                for seq in seqs {
                    chosen.push(dlq::get(&app.js, &app.topology, seq).await?);
                }
                chosen
            };
            replay(&app, chosen, dry_run, json).await
        }
    }
}

#[derive(Serialize)]
struct Replayed {
    seq: u64,
    stage: String,
    subject: String,
}

#[derive(Serialize)]
struct NotReplayed {
    seq: u64,
    error: String,
}

async fn replay(
    app: &App,
    chosen: Vec<StoredDeadLetter>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    if dry_run {
        let views: Vec<DeadLetterView> = chosen.iter().map(DeadLetterView::from).collect();
        if json {
            println!("{}", serde_json::json!({ "would_replay": views }));
        } else {
            for v in &views {
                println!(
                    "would replay #{} to {} (stage {})",
                    v.seq, v.subject, v.stage
                );
            }
            println!(
                "{} dead letter(s); nothing replayed (--dry-run)",
                views.len()
            );
        }
        return Ok(());
    }
    // A bar on a terminal only: a script reading the output gets lines, not redraws.
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(chosen.len() as u64).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} replayed {elapsed}")
                .expect("a valid template"),
        )
    };
    let (mut replayed, mut failed) = (Vec::new(), Vec::new());
    for d in chosen {
        match dlq::replay(&app.js, &app.topology, d.seq).await {
            Ok(letter) => {
                if !json {
                    say(
                        &bar,
                        format!(
                            "replayed #{} to {} (stage {})",
                            d.seq, letter.subject, letter.stage
                        ),
                    );
                }
                replayed.push(Replayed {
                    seq: d.seq,
                    stage: letter.stage,
                    subject: letter.subject,
                });
            }
            Err(e) => {
                if !json {
                    say(&bar, format!("could not replay #{}: {e}", d.seq));
                }
                failed.push(NotReplayed {
                    seq: d.seq,
                    error: e.to_string(),
                });
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if json {
        println!(
            "{}",
            serde_json::json!({ "replayed": replayed, "failed": failed })
        );
    } else {
        println!("{} replayed, {} failed", replayed.len(), failed.len());
    }
    if !failed.is_empty() {
        bail!("{} dead letter(s) could not be replayed", failed.len());
    }
    Ok(())
}

/// A line above the bar, or on standard output where there is no bar (not a terminal).
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}
