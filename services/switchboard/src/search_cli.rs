//! `switchboard search <q>` and `switchboard analytics categories`: the same queries as
//! `GET /api/v1/search` and `GET /api/v1/analytics/categories`, straight against the database,
//! as a table or (`--json`) as the API answers.
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Subcommand};
use switchboard_kit::Config;
use switchboard_memory::analytics::{AnalyticsQuery, categories};
use switchboard_memory::search::{DEFAULT_LIMIT, SearchQuery, search};

#[derive(Args)]
pub struct SearchArgs {
    /// What to search for (words or a question).
    pub query: String,
    /// Only this person's messages.
    #[arg(long)]
    pub person: Option<String>,
    /// Only this agent's (engine variant's) messages, e.g. reggie_oc.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only this agent identity's messages (every engine variant of it), e.g. reggie.
    #[arg(long)]
    pub identity: Option<String>,
    #[arg(long)]
    pub channel: Option<String>,
    /// Messages at or after this RFC 3339 time or YYYY-MM-DD day (UTC).
    #[arg(long, value_parser = parse_time)]
    pub from: Option<DateTime<Utc>>,
    /// Messages before this RFC 3339 time or YYYY-MM-DD day (UTC).
    #[arg(long, value_parser = parse_time)]
    pub to: Option<DateTime<Utc>>,
    /// Hits at most (1 to 100).
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    pub limit: i64,
    /// Print the answer as JSON (as the API gives it).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum AnalyticsCommand {
    /// Exchanges per label per day, each person's top labels, exchanges per channel.
    Categories {
        #[arg(long, value_parser = parse_time)]
        from: Option<DateTime<Utc>>,
        #[arg(long, value_parser = parse_time)]
        to: Option<DateTime<Utc>>,
        /// Only this agent's (engine variant's) exchanges.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        person: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

fn parse_time(v: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(v, "%Y-%m-%d")
        .map(|d| d.and_time(chrono::NaiveTime::MIN).and_utc())
        .map_err(|_| format!("{v:?} is not an RFC 3339 time or a YYYY-MM-DD day"))
}

pub async fn search_command(config: Config, a: SearchArgs) -> anyhow::Result<()> {
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    let embedder = switchboard_memory::embed::from_config(&config.embedding);
    let q = SearchQuery {
        text: a.query,
        person: a.person,
        agent: a.agent,
        identity: a.identity,
        channel: a.channel,
        from: a.from,
        to: a.to,
        limit: a.limit,
        exclude: Vec::new(),
        exclude_kinds: Vec::new(),
        inbound_before: None,
        probes: config.embedding.ivfflat_probes,
    };
    let results = search(&db, embedder.as_deref(), &config.embedding.model, &q).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "query": q.text,
                "hits": results.hits,
                "model": results.model,
                "index_lag_s": results.index_lag.seconds,
                "messages_waiting": results.index_lag.messages_waiting,
                "note": results.note(),
            }))?
        );
        return Ok(());
    }
    if results.hits.is_empty() {
        println!("no messages found for {:?}", q.text);
    }
    for h in &results.hits {
        let text: String = h.text.chars().take(100).collect();
        println!(
            "{:.4}  {}  {:<8} {:<28} {:<12} {:<6} {}  {}",
            h.score,
            h.at.format("%Y-%m-%d %H:%M"),
            h.direction,
            h.person_id,
            h.agent,
            h.channel,
            h.session_id,
            text.replace('\n', " ")
        );
    }
    println!(
        "index lag: {:.0} s ({} messages waiting, model {})",
        results.index_lag.seconds, results.index_lag.messages_waiting, results.model
    );
    if let Some(note) = results.note() {
        println!("note: {note}");
    }
    Ok(())
}

pub async fn analytics_command(config: Config, command: AnalyticsCommand) -> anyhow::Result<()> {
    let AnalyticsCommand::Categories {
        from,
        to,
        agent,
        person,
        json,
    } = command;
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    let counts = categories(
        &db,
        &AnalyticsQuery {
            from,
            to,
            agent,
            person,
        },
    )
    .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&counts)?);
        return Ok(());
    }
    println!("exchanges per label per day");
    for d in &counts.per_day {
        println!("  {}  {:<20} {:>6}", d.day, d.label, d.exchanges);
    }
    println!("top labels per person");
    for p in &counts.per_person {
        let top: Vec<String> = p
            .top_labels
            .iter()
            .map(|l| format!("{} {}", l.label, l.exchanges))
            .collect();
        println!(
            "  {:<28} {:>6}  {}",
            p.person_id,
            p.exchanges,
            top.join(", ")
        );
    }
    println!("exchanges per channel");
    for c in &counts.per_channel {
        println!("  {:<12} {:>6}", c.channel, c.exchanges);
    }
    Ok(())
}
