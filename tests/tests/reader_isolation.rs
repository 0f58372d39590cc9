//! An event reader and the `analytics` user only read, whatever reply subject they give.
//!
//! A JetStream request's reply subject is the client's choice, and the server answers there on
//! the consumer's (or stream's) behalf: in the product's account, a reader's pull request with
//! reply `sb.identified` had its events delivered into the work stream, where the session stage
//! took them. Readers and analytics now live in accounts of their own (services/stack/src/
//! nats.rs), so such a request answers into the requester's own account. And a stage that gets
//! a message of a type it does not read dead-letters it with the cause, never silently.
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use async_nats::{HeaderMap, Subject};
use futures::StreamExt as _;
use prost::Name as _;
use switchboard_e2e::{TestApp, spawn_app};
use switchboard_kit::Topology;
use switchboard_kit::proto::{MessageLogged, MessageReceived};
use switchboard_kit::runtime::HEADER_TYPE;
use switchboard_stack::readers::EVENTS_API_PREFIX;

const WAIT: Duration = Duration::from_secs(30);

async fn last_sequence(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .unwrap_or_else(|e| panic!("stream {stream}: {e}"))
        .cached_info()
        .state
        .last_sequence
}

/// The product's work subjects of `topology`, as reply subjects an attacker would give.
fn work_subjects(topology: &Topology) -> Vec<String> {
    vec![
        topology.identified(),
        topology.turn(&uuid::Uuid::new_v4()),
        topology.reply(),
        topology.inbound("sms"),
    ]
}

/// Whatever arrives, as the product user, on `topology`'s work subjects.
async fn watch_work_subjects(
    app: &TestApp,
    topology: &Topology,
) -> tokio::sync::mpsc::UnboundedReceiver<Subject> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let p = topology.prefix();
    for subject in [
        format!("{p}.identified"),
        format!("{p}.turn.>"),
        format!("{p}.reply"),
        format!("{p}.in.>"),
    ] {
        let mut sub = app.js.client().subscribe(subject).await.unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let _ = tx.send(m.subject);
            }
        });
    }
    app.js.client().flush().await.unwrap();
    rx
}

fn drained(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Subject>) -> Vec<Subject> {
    let mut got = Vec::new();
    while let Ok(s) = rx.try_recv() {
        got.push(s);
    }
    got
}

#[tokio::test]
async fn a_readers_pull_request_stores_nothing_in_the_product_whatever_its_reply_subject() {
    let app = spawn_app().await;
    for (phone, text) in [("+14155550901", "hello"), ("+14155550902", "hi there")] {
        assert_eq!(app.send_sms(phone, text).await.status(), 200);
    }
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;

    let name = format!("inj-{}", app.config.subject_prefix);
    let reader = app.cli_json(&["readers", "add", &name, "--json"]).await;
    assert_eq!(reader["api_prefix"], EVENTS_API_PREFIX, "{reader}");
    let client = async_nats::ConnectOptions::new()
        .user_and_password(
            reader["user"].as_str().unwrap().into(),
            reader["password"].as_str().unwrap().into(),
        )
        .custom_inbox_prefix(reader["inbox_prefix"].as_str().unwrap())
        .connect(reader["nats_url"].as_str().unwrap())
        .await
        .expect("the reader connects");
    let (stream, consumer_name) = (
        reader["stream"].as_str().unwrap().to_string(),
        reader["consumer"].as_str().unwrap().to_string(),
    );

    let work = app.topology.work_stream();
    let events = app.topology.events_stream();
    let (work_before, events_before) = (
        last_sequence(&app.js, &work).await,
        last_sequence(&app.js, &events).await,
    );
    let letters_before = app.dead_letters("session").await.len();
    let mut landed = watch_work_subjects(&app, &app.topology).await;

    // The attack: fetch requests, in both the plain and the prefixed form, answered to the
    // work subjects (and to the events stream's own subjects).
    let mut replies = work_subjects(&app.topology);
    replies.push(app.topology.event("message.logged"));
    for next in [
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer_name}"),
        format!("{EVENTS_API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer_name}"),
    ] {
        for reply in &replies {
            client
                .publish_with_reply(
                    next.clone(),
                    reply.clone(),
                    r#"{"batch":2,"no_wait":true}"#.into(),
                )
                .await
                .unwrap();
        }
    }
    client.flush().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.settle().await;

    assert_eq!(
        drained(&mut landed),
        Vec::<Subject>::new(),
        "a reader's request delivered onto work subjects"
    );
    assert_eq!(
        last_sequence(&app.js, &work).await,
        work_before,
        "the work stream stored what a reader's request delivered"
    );
    assert_eq!(
        last_sequence(&app.js, &events).await,
        events_before,
        "the events stream stored what a reader's request delivered"
    );
    assert_eq!(
        app.dead_letters("session").await.len(),
        letters_before,
        "the session stage was given a reader's deliveries"
    );

    // The reader still reads and acknowledges, through its API prefix: up to a marker event
    // published after the attack (the attack's own deliveries wait out their ack wait).
    let marker = app.topology.event("isolation.marker");
    app.js
        .publish(marker.clone(), "marker".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let js = jetstream::with_prefix(client, EVENTS_API_PREFIX);
    let consumer: consumer::PullConsumer = js
        .get_consumer_from_stream(&consumer_name, &stream)
        .await
        .expect("the reader's consumer, through its API prefix");
    let deadline = Instant::now() + WAIT;
    'read: loop {
        assert!(Instant::now() < deadline, "the marker never came");
        let mut batch = consumer
            .fetch()
            .max_messages(20)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("a fetch");
        while let Some(m) = batch.next().await {
            let m = m.expect("a delivered event");
            m.double_ack().await.expect("the reader acks");
            if m.subject.as_str() == marker {
                break 'read;
            }
        }
    }
    app.cli_ok(&["readers", "remove", &name]).await;
    app.shutdown().await;
}

/// The stack's analytics user (prefix `sb`), as services/stack/src/nats.rs sets it up; `None`
/// when the tests run without the embedded stack.
async fn analytics_client() -> Option<async_nats::Client> {
    let dir = std::env::var_os("SB_STACK_CREDENTIALS_DIR")?;
    let secrets = std::fs::read_to_string(std::path::Path::new(&dir).join("secrets")).ok()?;
    let get = |key: &str| {
        secrets
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(String::from)
    };
    let url = std::env::var("SB_NATS_URL").ok()?;
    let server = switchboard_kit::endpoint::nats_target(&url)
        .ok()?
        .servers
        .join(",");
    let client = async_nats::ConnectOptions::new()
        .user_and_password(get("NATS_ANALYTICS_USER")?, get("NATS_ANALYTICS_PASSWORD")?)
        .custom_inbox_prefix("_INBOX_analytics")
        .connect(server)
        .await
        .expect("analytics connects");
    Some(client)
}

#[tokio::test]
async fn the_analytics_users_reads_answer_into_its_own_account_whatever_the_reply_subject() {
    let app = spawn_app().await;
    let Some(analytics) = analytics_client().await else {
        eprintln!("skipped: no embedded stack (SB_STACK_CREDENTIALS_DIR), no analytics user");
        return;
    };
    // The analytics prefix of a test stack is `sb`: its events stream, made as the product
    // makes it, with an event in it.
    let sb = Topology::new("sb", app.config.runtime.turn_partitions);
    let config = sb
        .stream_configs(&app.config.runtime)
        .into_iter()
        .find(|c| c.name == sb.events_stream())
        .expect("the events stream's config");
    app.js.get_or_create_stream(config).await.unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_TYPE, MessageReceived::full_name().as_str());
    let seq = app
        .js
        .publish_with_headers(sb.event("isolation.test"), headers, "event".into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let public = sb.events_stream();
    let mut landed = watch_work_subjects(&app, &sb).await;

    let get = format!(r#"{{"seq":{seq}}}"#);
    for api in ["$JS.API", EVENTS_API_PREFIX] {
        for reply in work_subjects(&sb) {
            for (subject, body) in [
                (format!("{api}.STREAM.MSG.GET.{public}"), get.clone()),
                (format!("{api}.DIRECT.GET.{public}"), get.clone()),
                (
                    format!("{api}.DIRECT.GET.{public}.{}", sb.event("isolation.test")),
                    String::new(),
                ),
            ] {
                analytics
                    .publish_with_reply(subject, reply.clone(), body.into())
                    .await
                    .unwrap();
            }
        }
    }
    analytics.flush().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        drained(&mut landed),
        Vec::<Subject>::new(),
        "the analytics user's requests were answered onto work subjects"
    );

    // What it is for still works, through its API prefix.
    let js = jetstream::with_prefix(analytics, EVENTS_API_PREFIX);
    let stream = js.get_stream_no_info(&public).await.unwrap();
    // (The product's events stream does not allow direct gets; DIRECT.GET is tried above for
    // a stream that would.)
    let by_get = stream.get_raw_message(seq).await.expect("STREAM.MSG.GET");
    assert_eq!(by_get.payload.as_ref(), b"event");
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_of_a_type_a_stage_does_not_read_is_dead_lettered_with_the_cause() {
    let app = spawn_app().await;
    // An event, published by the product's own user, on the session stage's subject: protobuf
    // would decode it as an (empty) identified message.
    let event = MessageLogged::default();
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_TYPE, MessageLogged::full_name().as_str());
    let payload = prost::Message::encode_to_vec(&event);
    app.js
        .publish_with_headers(app.topology.identified(), headers, payload.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();

    let letters = app.wait_for_dead_letters("session", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let reads = switchboard_kit::proto::IdentifiedMessage::full_name();
    assert_eq!(
        letters[0].error,
        format!(
            "a {} message on {}; this stage reads {reads}",
            MessageLogged::full_name(),
            app.topology.identified()
        )
    );
    assert_eq!(letters[0].message_type, MessageLogged::full_name());
    assert_eq!(letters[0].payload, payload);
    app.shutdown().await;
}
