//! `switchboard status [--json]`: [`switchboard_kit::ops_status`] as tables or one JSON
//! document.
use switchboard_kit::Registration;
use switchboard_kit::config::Config;
use switchboard_kit::ops_status::status;
use switchboard_kit::startup::App;

/// `switchboard status`: the tables, or the JSON document with `--json`.
pub async fn run(config: Config, stages: &[Registration], json: bool) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    let s = status(&app.js, &app.db, &app.topology, &app.config.runtime, stages).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!(
        "{:<14} {:<10} {:<14} {:>8} {:>8} {:>11} {:>8} {:>12}",
        "stage", "worker", "stream", "pending", "in_hand", "redelivered", "pulling", "dead_letters"
    );
    for st in &s.stages {
        let [pending, in_hand, redelivered, pulling] = match &st.consumer {
            Some(c) => [
                c.pending,
                c.in_hand as u64,
                c.redelivered as u64,
                c.pulling as u64,
            ]
            .map(|n| n.to_string()),
            None => ["-"; 4].map(String::from),
        };
        println!(
            "{:<14} {:<10} {:<14} {:>8} {:>8} {:>11} {:>8} {:>12}",
            st.stage, st.worker, st.stream, pending, in_hand, redelivered, pulling, st.dead_letters
        );
    }
    println!();
    for st in &s.streams {
        println!(
            "stream {:<20} {:>10} messages {:>14} bytes",
            st.name, st.messages, st.bytes
        );
    }
    println!("dispatchers alive: {}", s.dispatchers_alive);
    if s.waiting_for_runner.is_empty() {
        println!("sessions waiting for a runner: none");
    }
    for (agent, n) in &s.waiting_for_runner {
        println!("sessions waiting for {agent}'s runner: {n}");
    }
    Ok(())
}
