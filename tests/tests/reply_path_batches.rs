//! The reply path's stages over a backlog (issue 41): the session stage opens the turns of many
//! people together, in one transaction, while every rule of a single message still holds (a
//! sender's messages take their turns in the order they were written, a provider's retry keeps
//! its first turn, a message that cannot be routed is dead-lettered alone); the deliver stage
//! claims and records the replies of many people together, each sent once.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use prost::Message as _;
use switchboard_e2e::{AppOptions, TestApp, spawn_app_with};
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, Person};

const PEOPLE: usize = 20;
const WAIT: Duration = Duration::from_secs(30);

fn sender(n: usize) -> String {
    format!("+1415555{:04}", 4000 + n)
}

/// Person `n`'s message number `arrival`, as identify hands it on.
fn message(n: usize, arrival: u64, provider_id: &str, text: &str) -> IdentifiedMessage {
    let id = uuid::Uuid::now_v7().to_string();
    IdentifiedMessage {
        inbound: Some(InboundMessage {
            id: id.clone(),
            channel: "sms".into(),
            provider: "twilio".into(),
            sender: sender(n),
            text: text.into(),
            provider_message_id: provider_id.into(),
            correlation_id: id,
            arrival_epoch: 1,
            arrival_seq: arrival,
            received_at_ms: switchboard_kit::now_ms(),
            ..Default::default()
        }),
        person: Some(Person {
            person_id: format!("phone:{}", sender(n)),
            person_type: "external".into(),
            ..Default::default()
        }),
    }
}

async fn publish(app: &TestApp, msg: &IdentifiedMessage) {
    app.js
        .publish(app.topology.identified(), msg.encode_to_vec().into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

#[tokio::test]
async fn a_backlog_of_many_people_opens_their_turns_together_and_each_senders_order_holds() {
    // The session stage starts late, so the backlog is there for it to take in one pull.
    let app = spawn_app_with(AppOptions::without(&["session", "dispatch"])).await;
    // Person 0's second message is first in the backlog, before their first.
    let second = message(0, 2, "SM-0-2", "and a second thing");
    publish(&app, &second).await;
    let mut firsts = Vec::new();
    for n in 0..PEOPLE {
        let first = message(n, 1, &format!("SM-{n}-1"), &format!("hello from {n}"));
        publish(&app, &first).await;
        firsts.push(first);
    }
    // Twilio sends person 1's message again (a new delivery of the same MessageSid).
    let retry = message(1, 1, "SM-1-1", "hello from 1");
    publish(&app, &retry).await;
    // A message for an agent nobody configured.
    let mut lost = message(PEOPLE, 1, "SM-lost", "anyone there?");
    lost.inbound.as_mut().unwrap().agent = "nobody".into();
    publish(&app, &lost).await;

    app.start_stage("session");
    let deadline = Instant::now() + WAIT;
    loop {
        let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.turns")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if turns > PEOPLE as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "{turns} turns opened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.settle().await;

    // One turn per message written, the retry none of its own.
    let rows: Vec<(String, i64, uuid::Uuid, String)> = sqlx::query_as(
        "SELECT s.person_id, t.seq, t.inbound_id, t.xmin::text
           FROM switchboard.turns t JOIN switchboard.sessions s ON s.id = t.session_id
          ORDER BY s.person_id, t.seq",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(rows.len(), PEOPLE + 1, "{rows:?}");
    let mut by_person: HashMap<&str, Vec<(i64, uuid::Uuid)>> = HashMap::new();
    for (person, seq, inbound, _) in &rows {
        by_person.entry(person).or_default().push((*seq, *inbound));
    }
    assert_eq!(by_person.len(), PEOPLE);
    for (n, first) in firsts.iter().enumerate() {
        let turns = &by_person[format!("phone:{}", sender(n)).as_str()];
        let id = |m: &IdentifiedMessage| m.inbound.as_ref().unwrap().id.parse().unwrap();
        let first_id: uuid::Uuid = id(first);
        // A retry racing its original (another batch of the same pull) may place the turn:
        // either way the message has one turn.
        let retried = n == 1 && turns[0] == (1, id(&retry));
        assert!(
            turns[0] == (1, first_id) || retried,
            "person {n}'s first turn is their first message: {turns:?}"
        );
        if n == 0 {
            assert_eq!(turns[1], (2, id(&second)), "then their second");
        } else {
            assert_eq!(turns.len(), 1, "person {n}: {turns:?}");
        }
    }
    // Each turn is in the journal once.
    let journalled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.session_events WHERE kind = 'message_in'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(journalled, PEOPLE as i64 + 1);
    // Opened together: turns share transactions (a pull of the backlog is one), where one at a
    // time every turn is its own. How many a pull brings depends on timing, so the bar is
    // "more than one", which one-at-a-time never reaches.
    let xmins: Vec<String> = rows.iter().map(|(_, _, _, x)| x.clone()).collect();
    let largest = largest_transaction(&xmins);
    assert!(
        largest >= 2,
        "the largest transaction wrote {largest} of {} turns",
        rows.len()
    );
    // The turns went on once each (the retry's is the first one's, same dedupe id).
    let turns = format!("{}.turn.>", app.topology.prefix());
    assert_eq!(app.stored_on(&turns).await, PEOPLE as u64 + 1);
    // The message nobody can answer is dead-lettered with its reason, alone.
    let dead = app.wait_for_dead_letters("session", WAIT).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].error.contains("nobody"), "{}", dead[0].error);
}

/// How many rows the largest single transaction wrote, by `xmin` (row versions written by one
/// transaction share it).
fn largest_transaction(xmins: &[String]) -> usize {
    let mut by_transaction: HashMap<&str, usize> = HashMap::new();
    for x in xmins {
        *by_transaction.entry(x).or_default() += 1;
    }
    by_transaction.values().max().copied().unwrap_or(0)
}

/// Each of the people texts "question <n>".
async fn ask_everyone(app: &TestApp) {
    for n in 0..PEOPLE {
        let asked = app.send_sms(&sender(n), &format!("question {n}")).await;
        assert_eq!(asked.status(), 200);
    }
}

/// Each person got exactly one SMS, the answer to their own question; what was sent.
fn each_answered_once(app: &TestApp) -> Vec<switchboard_e2e::SentSms> {
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), PEOPLE, "each person answered once: {sent:?}");
    for n in 0..PEOPLE {
        let to_them: Vec<_> = sent.iter().filter(|s| s.to == sender(n)).collect();
        assert_eq!(to_them.len(), 1, "person {n}: {to_them:?}");
        assert!(
            to_them[0].body.contains(&format!("question {n}")),
            "person {n} got another's answer: {:?}",
            to_them[0]
        );
    }
    sent
}

#[tokio::test]
async fn a_backlog_of_replies_to_many_people_is_claimed_and_recorded_together_and_each_sent_once() {
    // The deliver stage starts late: the replies wait for it in the stream.
    let app = spawn_app_with(AppOptions::without(&["deliver"])).await;
    ask_everyone(&app).await;
    let replies = app.topology.reply();
    let deadline = Instant::now() + WAIT;
    while app.stored_on(&replies).await < PEOPLE as u64 {
        assert!(Instant::now() < deadline, "the replies were not written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.start_stage("deliver");
    app.wait_for_sms(PEOPLE, WAIT).await;
    app.settle().await;
    let sent = each_answered_once(&app);
    // The ledger holds each as sent, with the provider's id, recorded together.
    let rows: Vec<(String, Vec<String>, String)> = sqlx::query_as(
        "SELECT status, provider_message_ids, xmin::text FROM switchboard.deliveries",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(rows.len(), PEOPLE);
    for (status, ids, _) in &rows {
        assert_eq!(status, "sent");
        assert_eq!(ids.len(), 1);
        assert!(sent.iter().any(|s| s.sid == ids[0]), "{ids:?}");
    }
    let xmins: Vec<String> = rows.into_iter().map(|(_, _, x)| x).collect();
    let largest = largest_transaction(&xmins);
    assert!(
        largest >= 2,
        "the largest transaction recorded {largest} of {PEOPLE} sent replies (one at a time: 1)"
    );
}

#[tokio::test]
async fn answers_that_finish_together_are_committed_together_and_each_person_is_answered_once() {
    // The dispatcher starts late: the turns of many people wait for it in the stream, and
    // their calls finish at once.
    let app = spawn_app_with(AppOptions::without(&["dispatch"])).await;
    ask_everyone(&app).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let open: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.turns")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if open == PEOPLE as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} turns opened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.start_stage("dispatch");
    app.wait_for_sms(PEOPLE, WAIT).await;
    app.settle().await;
    each_answered_once(&app);
    // Each session moved to its turn and gave its call slot back; each turn holds its reply
    // and one journal entry says so.
    let rows: Vec<(String, i64, Option<String>, bool, String)> = sqlx::query_as(
        "SELECT t.status, s.last_seq, t.reply_text, s.running_call IS NULL, t.xmin::text
           FROM switchboard.turns t JOIN switchboard.sessions s ON s.id = t.session_id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(rows.len(), PEOPLE);
    for (status, cursor, reply, free, _) in &rows {
        assert_eq!((status.as_str(), *cursor, *free), ("done", 1, true));
        assert!(reply.as_deref().is_some_and(|r| r.contains("question")));
    }
    let replies: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.session_events WHERE kind = 'reply'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(replies, PEOPLE as i64);
    let xmins: Vec<String> = rows.into_iter().map(|(.., x)| x).collect();
    let largest = largest_transaction(&xmins);
    assert!(
        largest >= 2,
        "the largest commit stored {largest} of {PEOPLE} answers (one at a time: 1)"
    );
}

#[tokio::test]
async fn a_backlog_of_senders_is_identified_together_each_as_their_own_person() {
    // Identify starts late: the messages of people the directory knows, people linked to
    // another identity and strangers wait for it together.
    let app = spawn_app_with(AppOptions::without(&["identify"])).await;
    let mut expected = HashMap::new();
    for n in 0..PEOPLE {
        let phone = sender(n);
        let person = match n % 3 {
            0 => {
                let id = format!("staff-{n}");
                sqlx::query(
                    "INSERT INTO switchboard.people (person_id, person_type) VALUES ($1, 'staff')",
                )
                .bind(&id)
                .execute(&app.db)
                .await
                .unwrap();
                sqlx::query("INSERT INTO switchboard.contact_points (kind, address, person_id) VALUES ('phone', $1, $2)")
                    .bind(&phone)
                    .bind(&id)
                    .execute(&app.db)
                    .await
                    .unwrap();
                id
            }
            1 => {
                let id = format!("user:person-{n}");
                sqlx::query(
                    "INSERT INTO switchboard.identity_links (id, from_person_id, to_person_id, linked_by)
                     VALUES ($1, $2, $3, 'test')",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(format!("phone:{phone}"))
                .bind(&id)
                .execute(&app.db)
                .await
                .unwrap();
                id
            }
            _ => format!("phone:{phone}"),
        };
        expected.insert(format!("question {n}"), person);
        assert_eq!(
            app.send_sms(&phone, &format!("question {n}"))
                .await
                .status(),
            200
        );
    }
    app.start_stage("identify");
    app.wait_for_sms(PEOPLE, WAIT).await;
    app.settle().await;
    let logged: Vec<(String, String)> = sqlx::query_as(
        "SELECT message, person_id FROM switchboard.messages WHERE direction = 'inbound'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), PEOPLE, "{logged:?}");
    for (text, person) in &logged {
        assert_eq!(
            Some(person),
            expected.get(text),
            "{text} was taken as {person}"
        );
    }
    // And each reply went back to the phone that asked.
    for s in app.twilio.sent() {
        let n: usize = s
            .body
            .split("question ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse().ok())
            .expect("the reply quotes its question");
        assert_eq!(s.to, sender(n), "{s:?}");
    }
}
