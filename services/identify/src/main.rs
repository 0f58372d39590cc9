//! `switchboard-identify`: the identity resolution worker.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchboard_kit::startup::worker_main("identify", |app| {
        Ok(vec![switchboard_identify::task(app)])
    })
    .await
}
