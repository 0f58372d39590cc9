//! `switchboard-session`: the session worker.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchboard_kit::startup::worker_main("session", |app| Ok(vec![switchboard_session::task(app)]))
        .await
}
