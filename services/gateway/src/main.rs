//! `switchboard-gateway`: the channel gateway (HTTP).
use switchboard_gateway::{GatewayState, router};
use switchboard_kit::startup::worker_main;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    worker_main("gateway", |app| {
        let state = GatewayState::new(app.config.clone(), app.runtime());
        let routes = router(state).merge(switchboard_kit::admin::router(app.readiness()));
        let app = app.clone();
        Ok(vec![Box::pin(async move {
            let addr = app.config.gateway.http_addr.clone();
            app.serve_http(&addr, routes).await?.await
        })])
    })
    .await
}
