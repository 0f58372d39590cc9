//! `switchboard-dispatch`: the runner dispatch worker.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchboard_kit::startup::worker_main("dispatch", |app| {
        Ok(vec![switchboard_dispatch::task(app)])
    })
    .await
}
