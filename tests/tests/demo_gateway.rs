//! The demo runner and outboxes are served by every gateway that has `demo.enabled` on (the
//! routes `switchboard up` and `switchboard gateway` both build, so deploy/compose.yaml's
//! gateway has them too), and by none that has it off, as in production.
use switchboard_e2e::{spawn_app, spawn_app_configured};

#[tokio::test]
async fn a_gateway_serves_the_demo_outbox_only_when_the_demo_is_on() {
    let on = spawn_app_configured(|c| c.demo.enabled = true).await;
    let resp = reqwest::get(format!("{}/demo/outbox", on.gateway_url))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    on.shutdown().await;

    let off = spawn_app().await;
    let resp = reqwest::get(format!("{}/demo/outbox", off.gateway_url))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "production serves no demo routes");
    off.shutdown().await;
}
