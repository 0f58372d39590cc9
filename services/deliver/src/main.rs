//! `switchboard-deliver`: the outbound delivery worker.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchboard_kit::startup::worker_main("deliver", |app| Ok(vec![switchboard_deliver::task(app)]))
        .await
}
