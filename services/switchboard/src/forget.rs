//! `switchboard forget <person> [--json]`: erase a person completely (see
//! `switchboard_memory::forget`) and print what was removed per kind.
use switchboard_kit::Config;
use switchboard_kit::startup::App;
use switchboard_memory::forget::{ForgetError, forget};

pub async fn run(config: Config, person: &str, json: bool) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    let forgotten = match forget(&app.db, &app.js, &app.topology, person).await {
        Ok(f) => f,
        Err(e @ ForgetError::Unknown(_)) => anyhow::bail!("{e}"),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("forgetting {person:?}"))),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&forgotten)?);
        return Ok(());
    }
    println!(
        "forgot {} at {}: {} removed",
        forgotten.person_id,
        forgotten.forgotten_at.to_rfc3339(),
        forgotten.total()
    );
    for (kind, n) in forgotten.removed.iter().filter(|(_, n)| **n > 0) {
        println!("  {kind:<22} {n:>8}");
    }
    Ok(())
}
