//! `switchboard api-keys create|list|revoke`: keys for the REST API, stored hashed; a key is
//! printed once, when made. `--json` for a script that provisions keys.
use clap::Subcommand;
use switchboard_channels::api::{ApiKeyInfo, ApiKeys, Scope};
use switchboard_kit::Config;

#[derive(Subcommand)]
pub enum ApiKeysCommand {
    /// Make a key for `owner` and print it (once: only its hash is kept).
    Create {
        /// Who the key is for; messages sent with it come from the person `api:<owner>`.
        #[arg(long)]
        owner: String,
        /// What the key may do (repeatable): messages:write, messages:read, identity:read,
        /// identity:write, outbound:write, sessions:read, sessions:write, search:read,
        /// analytics:read, memory:read, memory:write, people:forget, ops:read, ops:write.
        /// Default: messages:write and messages:read (the others are only ever granted by
        /// name).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// `{"key", "id", "owner", "scopes", ...}` on standard output.
        #[arg(long)]
        json: bool,
    },
    /// List keys (never the keys themselves).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its id: it stops working at once.
    Revoke {
        id: uuid::Uuid,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(config: Config, command: ApiKeysCommand) -> anyhow::Result<()> {
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    switchboard_kit::db::migrate(&db).await?;
    let keys = ApiKeys::new(db);
    match command {
        ApiKeysCommand::Create {
            owner,
            scopes,
            json,
        } => {
            let scopes: Vec<Scope> = if scopes.is_empty() {
                Scope::DEFAULT.to_vec()
            } else {
                scopes
                    .iter()
                    .map(|s| s.parse().map_err(anyhow::Error::msg))
                    .collect::<anyhow::Result<_>>()?
            };
            let (key, info) = keys.create(&owner, &scopes).await?;
            if json {
                let mut body = serde_json::to_value(&info)?;
                body["key"] = key.into();
                println!("{body}");
            } else {
                eprintln!(
                    "API key {} for {} ({}). It is shown once; store it now:",
                    info.id,
                    info.owner,
                    info.scopes.join(", ")
                );
                println!("{key}");
            }
        }
        ApiKeysCommand::List { json } => {
            let all = keys.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                print_table(&all);
            }
        }
        ApiKeysCommand::Revoke { id, json } => {
            let k = keys.revoke(id).await?;
            if json {
                println!("{}", serde_json::to_value(&k)?);
            } else {
                println!("revoked API key {} of {}", k.id, k.owner);
            }
        }
    }
    Ok(())
}

fn print_table(keys: &[ApiKeyInfo]) {
    println!(
        "{:<36}  {:<20} {:<10} {:<30} {:<20} state",
        "id", "owner", "key", "scopes", "last used"
    );
    let when = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|| "never".into())
    };
    for k in keys {
        let state = match k.revoked_at {
            Some(t) => format!("revoked {}", t.format("%Y-%m-%d %H:%M")),
            None => "active".into(),
        };
        println!(
            "{:<36}  {:<20} {:<10} {:<30} {:<20} {}",
            k.id,
            k.owner,
            format!("{}…", k.key_prefix),
            k.scopes.join(","),
            when(k.last_used_at),
            state
        );
    }
}
