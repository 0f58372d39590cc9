//! `switchboard-log`: the message log worker (inbound and outbound).
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchboard_kit::startup::worker_main("log", |app| {
        Ok(vec![
            switchboard_log::inbound_task(app),
            switchboard_log::outbound_task(app),
        ])
    })
    .await
}
