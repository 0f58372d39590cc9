//! A reply goes out once, even when a deliverer dies holding it.
use std::time::Duration;

use switchboard_deliver::{DeliverStage, DeliveryLedger, TwilioSender};
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::proto::Reply;
use switchboard_kit::{Delivery, Stage, StageError};

#[tokio::test]
async fn a_reply_held_by_a_dead_deliverer_is_sent_once_its_lease_ends() {
    // No stages in-process: this test drives the deliver handler itself.
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    let reply = Reply {
        id: uuid::Uuid::now_v7().to_string(),
        session_id: uuid::Uuid::now_v7().to_string(),
        seq: 1,
        text: "you will get this once".into(),
        channel: "sms".into(),
        provider: "twilio".into(),
        recipient: "+14155550501".into(),
        correlation_id: "c-1".into(),
        ..Default::default()
    };
    let lease = Duration::from_secs(2);
    // A deliverer takes the reply and dies before sending anything.
    let dead = DeliveryLedger::new(app.db.clone(), lease);
    let id: uuid::Uuid = reply.id.parse().unwrap();
    assert!(matches!(
        dead.claim(&reply, id, 1).await.unwrap(),
        switchboard_deliver::Claim::Send { parts_sent: 0, .. }
    ));

    let stage = DeliverStage::new(
        DeliveryLedger::new(app.db.clone(), lease),
        TwilioSender::new(app.config.twilio.clone()),
        app.topology.clone(),
    );
    let delivery = Delivery {
        subject: app.topology.reply(),
        delivered: 2,
        stream_sequence: 1,
        correlation_id: "c-1".into(),
    };
    // The redelivered reply waits for the lease rather than burning its deliveries.
    let wait = match stage.handle(reply.clone(), &delivery).await {
        Err(StageError::Defer(d, _)) => d,
        other => panic!("expected to wait for the lease, got {other:?}"),
    };
    assert!(
        wait > Duration::from_millis(1000) && wait <= lease + Duration::from_millis(500),
        "{wait:?}"
    );
    assert!(app.twilio.sent().is_empty());

    tokio::time::sleep(wait).await;
    stage
        .handle(reply.clone(), &delivery)
        .await
        .expect("sent after the lease");
    stage
        .handle(reply, &delivery)
        .await
        .expect("a redelivery after sending is a no-op");
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, "you will get this once");
    app.shutdown().await;
}
