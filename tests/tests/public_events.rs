//! The public event stream (`{p}.events.<name>`, protobuf, replayable): what analytics reads.
//! One SMS turn tells it that the message was received (identify), that a session was created
//! for the person (session) and that the reply was delivered (deliver), each with the ids that
//! tie them to the log, the session and the provider.
use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt;
use switchboard_e2e::{TWILIO_NUMBER, spawn_app};
use switchboard_kit::proto::{MessageReceived, ReplyDelivered, SessionCreated};

const WAIT: Duration = Duration::from_secs(20);
const ME: &str = "+14155550611";

/// A public event as a subscriber sees it: its `Sb-Type` header and payload.
struct Event {
    message_type: String,
    payload: bytes::Bytes,
}

/// The one event on `subject` among `events`, decoded as `M` (its header must say so).
fn the_one<M: prost::Message + prost::Name + Default>(
    events: &HashMap<String, Vec<Event>>,
    subject: &str,
) -> M {
    let on = events.get(subject).map(Vec::as_slice).unwrap_or_default();
    assert_eq!(
        on.len(),
        1,
        "one event on {subject}; subjects seen: {:?}",
        events.keys()
    );
    assert_eq!(
        on[0].message_type,
        M::full_name(),
        "{subject}'s type header"
    );
    M::decode(on[0].payload.clone()).unwrap_or_else(|e| panic!("{subject}: {e}"))
}

#[tokio::test]
async fn an_sms_turn_tells_the_public_stream_it_was_received_its_session_created_and_reply_delivered()
 {
    let app = spawn_app().await;
    // Subscribed as analytics would: a consumer of its own on the events stream, from the start.
    let stream = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .expect("the events stream");
    let analytics = stream
        .create_consumer(consumer::pull::Config {
            filter_subject: app.topology.event(">"),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("a consumer on the events stream");

    let before = switchboard_kit::now_ms();
    assert_eq!(
        app.send_sms(ME, "when is my appointment?").await.status(),
        200
    );
    let sent = app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let after = switchboard_kit::now_ms();

    let mut events: HashMap<String, Vec<Event>> = HashMap::new();
    let mut messages = analytics.messages().await.expect("read events");
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(2), messages.next()).await
    {
        let message = message.expect("an event");
        message.ack().await.expect("ack");
        let message_type = message
            .headers
            .as_ref()
            .and_then(|h| h.get(switchboard_kit::runtime::HEADER_TYPE))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        events
            .entry(message.subject.to_string())
            .or_default()
            .push(Event {
                message_type,
                payload: message.payload.clone(),
            });
    }

    // What the product recorded of the turn, to tie the events to.
    let (session_id, inbound_id, reply_id): (uuid::Uuid, uuid::Uuid, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT session_id, inbound_id, reply_id FROM switchboard.turns")
            .fetch_one(&app.db)
            .await
            .expect("one turn");
    let rows = app.log_rows().await;
    let inbound = rows
        .iter()
        .find(|r| r.direction == "inbound")
        .expect("the message is logged");
    let in_range = |what: &str, ms: i64| {
        assert!(
            (before..=after).contains(&ms),
            "{what} {ms} is not between {before} and {after}"
        );
    };

    let received: MessageReceived = the_one(&events, &app.topology.event("message.received"));
    assert_eq!(received.message_id, inbound_id.to_string());
    assert_eq!(received.channel, "sms");
    assert_eq!(received.provider, "twilio");
    assert_eq!(received.correlation_id, inbound.correlation_id);
    in_range("received_at_ms", received.received_at_ms);

    let created: SessionCreated = the_one(&events, &app.topology.event("session.created"));
    assert_eq!(created.session_id, session_id.to_string());
    assert_eq!(created.session_id, inbound.session_id.to_string());
    assert_eq!(created.person_id, format!("phone:{ME}"));
    assert_eq!(created.person_id, inbound.person_id);
    assert_eq!(created.person_type, "external");
    assert_eq!(created.agent_name, app.runner.calls()[0].agent);
    assert_eq!(created.agent_identity, "reggie");
    assert_eq!(created.channel, "sms");
    in_range("created_at_ms", created.created_at_ms);
    assert!(created.created_at_ms >= received.received_at_ms);

    let delivered: ReplyDelivered = the_one(&events, &app.topology.event("reply.delivered"));
    assert_eq!(
        Some(delivered.reply_id.clone()),
        reply_id.map(|r| r.to_string())
    );
    assert_eq!(delivered.session_id, session_id.to_string());
    assert_eq!(delivered.channel, "sms");
    assert_eq!(delivered.provider, "twilio");
    assert_eq!(delivered.provider_message_ids, [sent[0].sid.clone()]);
    assert_eq!(delivered.correlation_id, inbound.correlation_id);
    in_range("delivered_at_ms", delivered.delivered_at_ms);
    assert!(delivered.delivered_at_ms >= created.created_at_ms);
    // What the provider was asked to send is the reply the log holds.
    assert_eq!(
        (sent[0].to.as_str(), sent[0].from.as_str()),
        (ME, TWILIO_NUMBER)
    );
    app.shutdown().await;
}
