//! A reply goes out once, even when a deliverer dies holding it.
use std::time::Duration;

use switchboard_channels::Channels;
use switchboard_deliver::{DeliverStage, DeliveryLedger};
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::proto::Reply;
use switchboard_kit::{Attempt, StageError};

/// The first reply of a new session, to `recipient` by SMS.
fn sms_reply(recipient: &str, text: &str) -> Reply {
    Reply {
        id: uuid::Uuid::now_v7().to_string(),
        session_id: uuid::Uuid::now_v7().to_string(),
        seq: 1,
        text: text.into(),
        channel: "sms".into(),
        provider: "twilio".into(),
        recipient: recipient.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_reply_held_by_a_dead_deliverer_is_sent_once_its_lease_ends() {
    // No stages in-process: this test drives the deliver handler itself.
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    let reply = Reply {
        correlation_id: "c-1".into(),
        ..sms_reply("+14155550501", "you will get this once")
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
        Channels::product().senders(&app.config),
        app.topology.clone(),
    );
    let delivery = Attempt {
        subject: app.topology.reply(),
        delivered: 2,
        stream_sequence: 1,
        correlation_id: "c-1".into(),
        ..Default::default()
    };
    // The redelivered reply waits for the lease rather than burning its deliveries.
    let wait = match stage.deliver_one(reply.clone(), &delivery).await {
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
        .deliver_one(reply.clone(), &delivery)
        .await
        .expect("sent after the lease");
    stage
        .deliver_one(reply, &delivery)
        .await
        .expect("a redelivery after sending is a no-op");
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, "you will get this once");
    app.shutdown().await;
}

#[tokio::test]
async fn replies_of_one_session_go_out_in_turn_order() {
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    let session = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO switchboard.sessions (id, person_type, person_id, agent_identity, agent_name,
            engine_type, channel, scope_key, next_seq, last_seq, memory_key)
         VALUES ($1, 'external', 'phone:+14155550601', 'reggie', 'reggie_oc', 'openclaw', 'sms',
            'external:phone:+14155550601', 3, 2, 'reggie:external:phone:+14155550601')",
    )
    .bind(session)
    .execute(&app.db)
    .await
    .unwrap();
    let mut replies = Vec::new();
    for seq in 1..=2i64 {
        let id = uuid::Uuid::now_v7();
        sqlx::query(
            "INSERT INTO switchboard.turns (session_id, seq, inbound_id, channel, provider_message_id,
                status, reply_id, reply_text)
             VALUES ($1, $2, $3, 'sms', $4, 'done', $5, $6)",
        )
        .bind(session)
        .bind(seq)
        .bind(uuid::Uuid::now_v7())
        .bind(format!("SMorder{seq}"))
        .bind(id)
        .bind(format!("reply {seq}"))
        .execute(&app.db)
        .await
        .unwrap();
        replies.push(Reply {
            id: id.to_string(),
            session_id: session.to_string(),
            seq,
            text: format!("reply {seq}"),
            channel: "sms".into(),
            provider: "twilio".into(),
            recipient: "+14155550601".into(),
            ..Default::default()
        });
    }
    let stage = std::sync::Arc::new(DeliverStage::new(
        DeliveryLedger::new(app.db.clone(), Duration::from_secs(45)),
        Channels::product().senders(&app.config),
        app.topology.clone(),
    ));
    let delivery = Attempt {
        subject: app.topology.reply(),
        delivered: 1,
        stream_sequence: 1,
        correlation_id: String::new(),
        ..Default::default()
    };
    // The second reply reaches a deliverer first: it waits for the first.
    let second = {
        let (stage, reply, delivery) = (stage.clone(), replies[1].clone(), delivery.clone());
        tokio::spawn(async move { stage.deliver_one(reply, &delivery).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        app.twilio.sent().is_empty(),
        "reply 2 must not overtake reply 1"
    );
    stage
        .deliver_one(replies[0].clone(), &delivery)
        .await
        .unwrap();
    second.await.unwrap().unwrap();
    let bodies: Vec<String> = app.twilio.sent().into_iter().map(|s| s.body).collect();
    assert_eq!(bodies, vec!["reply 1", "reply 2"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_sent_part_recorded_twice_after_a_lost_database_answer_counts_once() {
    // A deliverer records a part, the database commits but its answer is lost (Postgres
    // restarting), and the deliverer writes the same record again.
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    let reply = sms_reply("+14155550502", "three parts");
    let id: uuid::Uuid = reply.id.parse().unwrap();
    let ledger = DeliveryLedger::new(app.db.clone(), Duration::from_secs(45));
    ledger.claim(&reply, id, 3).await.unwrap();
    for _ in 0..2 {
        ledger.part_sent(id, "SM-part-1", 0, false).await.unwrap();
    }
    ledger.part_sent(id, "SM-part-2", 1, false).await.unwrap();
    let (parts_sent, ids): (i32, Vec<String>) = sqlx::query_as(
        "SELECT parts_sent, provider_message_ids FROM switchboard.deliveries WHERE reply_id = $1",
    )
    .bind(id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(parts_sent, 2, "the next attempt resumes at the third part");
    assert_eq!(ids, vec!["SM-part-1", "SM-part-2"]);
}

#[tokio::test]
async fn a_reply_the_provider_keeps_refusing_is_recorded_failed_announced_and_does_not_hold_up_the_next()
 {
    let app = switchboard_e2e::spawn_app_configured(|c| c.runtime.max_deliver = 2).await;
    let person = "+14155550503";
    // Twilio is down for both attempts at the first reply.
    app.twilio.fail_next(2);
    app.send_sms(person, "first").await;
    let letters = app
        .wait_for_dead_letters("deliver", Duration::from_secs(30))
        .await;
    assert_eq!(letters.len(), 1, "the reply is dead-lettered");
    let status: String = sqlx::query_scalar("SELECT status FROM switchboard.deliveries")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "failed", "the ledger says so");
    let events = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&app.topology.event("delivery.failed"))
        .await;
    assert!(events.is_ok(), "delivery.failed is announced");
    // The session's next reply goes out.
    app.send_sms(person, "second").await;
    let sent = app.wait_for_sms(1, Duration::from_secs(30)).await;
    assert_eq!(sent[0].body, "echo: second");
    app.shutdown().await;
}
