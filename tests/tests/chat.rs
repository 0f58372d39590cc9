//! The chat socket (`GET /ws/chat`): a person named by a JWT chats with an agent; replies come
//! back on their sockets, on whichever gateway replica holds them, and a client that was away
//! gets what it missed.
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::{ChatClient, TestApp, chat_token, spawn_app, spawn_app_configured};
use switchboard_kit::config::SessionScope;

const WAIT: Duration = Duration::from_secs(20);
const QUIET: Duration = Duration::from_millis(1_500);
/// An app whose sockets never catch up from the table within a test: a reply that arrives was
/// pushed.
async fn app_without_catch_up() -> TestApp {
    spawn_app_configured(|c| c.chat.catch_up_ms = 600_000).await
}

fn fixture(name: &str) -> String {
    format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

async fn sessions(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as("SELECT person_id, scope_key FROM switchboard.sessions ORDER BY created_at")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_chat_message_is_answered_on_the_socket_and_a_resend_is_the_same_turn() {
    let app = spawn_app().await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.say("c-1", "hello from the dashboard").await;
    let frames = chat.until("reply", WAIT).await;
    assert_eq!(frames[0]["type"], "accepted", "{frames:?}");
    assert_eq!(frames[0]["id"], "c-1");
    let reply = frames.last().unwrap();
    assert_eq!(reply["in_reply_to"], "c-1");
    assert_eq!(reply["agent"], "reggie_oc");
    assert_eq!(reply["text"], "echo: hello from the dashboard");

    // The widget lost the acknowledgement and sends the same message again.
    chat.say("c-1", "hello from the dashboard").await;
    let again = chat.next_frame(WAIT).await.unwrap();
    assert_eq!(again["type"], "accepted");
    assert!(
        chat.next_frame(QUIET).await.is_none(),
        "a resend is not answered twice"
    );
    app.settle().await;
    assert_eq!(app.runner.calls().len(), 1, "one turn for one client id");

    // The person is the token's subject, with full (user) standing.
    let prompt = &app.runner.calls()[0].prompt;
    assert!(prompt.contains("user:ana"), "{prompt}");
    assert_eq!(sessions(&app).await[0].0, "user:ana");
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn two_people_choosing_the_same_message_id_are_two_messages() {
    let app = spawn_app().await;
    let mut ana = ChatClient::as_user(&app.gateway_url, "ana").await;
    let mut ben = ChatClient::as_user(&app.gateway_url, "ben").await;
    ana.say("1", "ana here").await;
    ben.say("1", "ben here").await;
    assert_eq!(ana.reply(WAIT).await["text"], "echo: ana here");
    assert_eq!(ben.reply(WAIT).await["text"], "echo: ben here");
    app.shutdown().await;
}

#[tokio::test]
async fn bad_tokens_are_refused_before_the_socket_opens_with_the_reason() {
    let app = spawn_app().await;
    let now = chrono::Utc::now().timestamp();
    let refused = |query: String| {
        let url = app.gateway_url.clone();
        async move {
            match ChatClient::connect(&url, &query).await {
                Ok(_) => panic!("{query} was accepted"),
                Err(r) => r,
            }
        }
    };
    let expired = refused(format!(
        "token={}",
        chat_token("ana", json!({"exp": now - 120}))
    ))
    .await;
    assert_eq!(expired.status, 401);
    assert!(expired.body.contains("expired"), "{}", expired.body);

    let early = refused(format!(
        "token={}",
        chat_token("ana", json!({"nbf": now + 300}))
    ))
    .await;
    assert!(early.body.contains("not valid yet"), "{}", early.body);

    // alg "none": claims with no signature, naming an admin.
    use base64::Engine;
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT"})),
        b64(json!({"sub": "root", "role": "admin", "exp": now + 600}))
    );
    assert_eq!(refused(format!("token={unsigned}")).await.status, 401);

    let forged = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "ana", "exp": now + 600}),
        &jsonwebtoken::EncodingKey::from_secret(b"a guess"),
    )
    .unwrap();
    let forged = refused(format!("token={forged}")).await;
    assert!(forged.body.contains("signature"), "{}", forged.body);

    let missing = refused(String::new()).await;
    assert_eq!(missing.status, 401);
    assert!(
        missing.body.contains("token is required"),
        "{}",
        missing.body
    );

    let channel = refused(format!(
        "channel=fax&token={}",
        chat_token("ana", json!({}))
    ))
    .await;
    assert_eq!(channel.status, 400);

    app.assert_nothing_reached_the_pipeline().await;
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "sb_gateway_rejected_total{channel=\"chat\",reason=\"invalid_token\",provider=\"chat\"} 5"
        ),
        "refusals are counted:\n{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn rs256_tokens_verify_with_the_public_key_and_an_hs256_token_keyed_with_it_does_not() {
    let app = spawn_app_configured(|c| {
        c.chat.jwt_secret = Default::default();
        c.chat.jwt_public_key = fixture("chat-test-rsa-public.pem");
        c.chat.jwt_issuer = "https://login.example.com".into();
    })
    .await;
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"sub": "ana", "exp": now + 600, "iss": "https://login.example.com"});
    let private = std::fs::read(fixture("chat-test-rsa-private.pem")).unwrap();
    let rs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(&private).unwrap(),
    )
    .unwrap();
    let mut chat = ChatClient::connect(&app.gateway_url, &format!("token={rs256}"))
        .await
        .expect("an RS256 token from the configured key is accepted");
    chat.say("r-1", "signed by the login").await;
    assert_eq!(chat.reply(WAIT).await["text"], "echo: signed by the login");

    // Algorithm confusion: HS256 with the (public) key file as the shared secret.
    let public = std::fs::read(fixture("chat-test-rsa-public.pem")).unwrap();
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&public),
    )
    .unwrap();
    let refusal = ChatClient::connect(&app.gateway_url, &format!("token={confused}"))
        .await
        .err()
        .expect("refused");
    assert_eq!(refusal.status, 401);
    assert!(refusal.body.contains("algorithm"), "{}", refusal.body);

    // The issuer is checked.
    let other_issuer = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &json!({"sub": "ana", "exp": now + 600, "iss": "https://evil.example"}),
        &jsonwebtoken::EncodingKey::from_rsa_pem(&private).unwrap(),
    )
    .unwrap();
    let refusal = ChatClient::connect(&app.gateway_url, &format!("token={other_issuer}"))
        .await
        .err()
        .expect("refused");
    assert!(refusal.body.contains("issuer"), "{}", refusal.body);
    app.shutdown().await;
}

/// A staff member in the directory by phone and by chat login.
async fn staff_with_phone_and_login(app: &TestApp, phone: &str, sub: &str) {
    sqlx::query(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ('17', 'staff', 'Ana', 'nurse')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('phone', $1, '17'), ('chat_user', $2, '17')",
    )
    .bind(phone)
    .bind(sub)
    .execute(&app.db)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_person_texting_and_chatting_is_one_session() {
    let app = spawn_app().await;
    staff_with_phone_and_login(&app, "+14155550171", "ana@clinic").await;
    app.send_sms("+14155550171", "texting first").await;
    app.wait_for_sms(1, WAIT).await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana@clinic").await;
    chat.say("m-1", "now from the dashboard").await;
    assert_eq!(
        chat.reply(WAIT).await["text"],
        "echo: now from the dashboard"
    );
    app.settle().await;

    assert_eq!(
        sessions(&app).await,
        [("17".to_string(), "reggie_oc:person:staff:17".to_string())]
    );
    // The chat turn resumed the engine session the SMS turn started.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    // Each reply went back on the channel its message came from.
    assert_eq!(app.twilio.sent().len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn the_agent_knows_a_chatting_person_by_the_first_and_last_name_their_token_gives() {
    // Seed 000 3.1: the dashboard's tokens name their user in two claims, with no `name`.
    let app = spawn_app().await;
    let names = json!({"first_name": "Ana", "last_name": "Ortiz", "role": "nurse"});
    let token = chat_token("ana-2", names);
    let mut chat = ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .expect("the gateway accepts a valid token");
    chat.say("m-1", "who am I to you?").await;
    assert_eq!(chat.reply(WAIT).await["text"], "echo: who am I to you?");
    let calls = app.runner.calls();
    let line = "Current user: Ana Ortiz | id user:ana-2 | type user | role nurse";
    assert!(calls[0].prompt.contains(line), "{}", calls[0].prompt);
    app.shutdown().await;
}

#[tokio::test]
async fn under_channel_scope_the_same_person_texting_and_chatting_has_two_sessions() {
    let app = spawn_app_configured(|c| c.session.scope = SessionScope::Channel).await;
    staff_with_phone_and_login(&app, "+14155550172", "ana@clinic").await;
    app.send_sms("+14155550172", "texting first").await;
    app.wait_for_sms(1, WAIT).await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana@clinic").await;
    chat.say("m-1", "now from the dashboard").await;
    chat.reply(WAIT).await;
    app.settle().await;
    let keys: Vec<_> = sessions(&app).await.into_iter().map(|(_, k)| k).collect();
    assert_eq!(
        keys,
        [
            "reggie_oc:channel:sms:staff:17",
            "reggie_oc:channel:admin_chat:staff:17"
        ]
    );
    assert!(app.runner.calls().iter().all(|c| c.session_id.is_none()));
    app.shutdown().await;
}

/// The mailbox entry answering the client's message `id`, once the deliver stage wrote it:
/// its `seq` and whether a socket was handed it.
async fn in_mailbox(app: &TestApp, id: &str) -> (i64, bool) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let row: Option<(i64, bool)> = sqlx::query_as(
            "SELECT seq, pushed_at IS NOT NULL FROM switchboard.mailbox WHERE in_reply_to = $1",
        )
        .bind(id)
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if let Some(row) = row {
            return row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reply to {id} in the mailbox within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The runner's calls, once there are `n`.
async fn runner_called(app: &TestApp, n: usize) {
    let deadline = std::time::Instant::now() + WAIT;
    while app.runner.calls().len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "the runner got {} calls within {WAIT:?}, not {n}",
            app.runner.calls().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_reply_that_came_while_the_client_was_away_is_sent_when_it_reconnects() {
    // No periodic catch-up within the test: what a reconnecting socket gets without a new
    // announcement, it read from the mailbox when it connected.
    let app = app_without_catch_up().await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.say("a-1", "first").await;
    let first = chat.reply(WAIT).await;
    let seen = first["seq"].as_i64().unwrap();

    // The widget's tab closes right after sending; the agent answers only once it is gone.
    app.runner.set_hold(true);
    chat.say("a-2", "second").await;
    chat.until("accepted", WAIT).await;
    runner_called(&app, 2).await;
    chat.close().await;
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    let (stored, pushed) = in_mailbox(&app, "a-2").await;
    assert!(!pushed, "no socket was there to take it");

    // Back, saying which reply it saw last: it gets the one it missed, and only that one.
    let token = chat_token("ana", json!({}));
    let mut back = ChatClient::connect(&app.gateway_url, &format!("token={token}&since={seen}"))
        .await
        .unwrap();
    let missed = back.reply(WAIT).await;
    assert_eq!(missed["in_reply_to"], "a-2");
    assert_eq!(missed["text"], "echo: second");
    assert_eq!(missed["seq"].as_i64(), Some(stored), "the stored reply");
    assert!(back.next_frame(QUIET).await.is_none(), "sent once");
    back.close().await;

    // A new tab that says nothing gets nothing already handed to a socket...
    let mut fresh = ChatClient::as_user(&app.gateway_url, "ana").await;
    assert!(fresh.next_frame(QUIET).await.is_none());
    fresh.close().await;

    // ...but a reply no socket received is waiting for it.
    chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    app.runner.set_hold(true);
    chat.say("a-3", "third").await;
    chat.until("accepted", WAIT).await;
    runner_called(&app, 3).await;
    chat.close().await;
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    in_mailbox(&app, "a-3").await;
    let mut later = ChatClient::as_user(&app.gateway_url, "ana").await;
    assert_eq!(later.reply(WAIT).await["in_reply_to"], "a-3");
    assert!(later.next_frame(QUIET).await.is_none(), "sent once");
    app.shutdown().await;
}

#[tokio::test]
async fn a_reply_reaches_the_persons_sockets_on_every_gateway_replica() {
    let app = app_without_catch_up().await;
    let other_replica = app.second_gateway().await;
    let mut here = ChatClient::as_user(&app.gateway_url, "ana").await;
    let mut there = ChatClient::as_user(&other_replica, "ana").await;
    let mut someone_else = ChatClient::as_user(&other_replica, "ben").await;
    here.say("x-1", "which tab gets this?").await;
    assert_eq!(here.reply(WAIT).await["in_reply_to"], "x-1");
    assert_eq!(there.reply(WAIT).await["in_reply_to"], "x-1");
    assert!(
        someone_else.next_frame(QUIET).await.is_none(),
        "another person's socket gets nothing"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn with_two_gateway_processes_a_reply_reaches_the_socket_the_other_one_holds() {
    let app = app_without_catch_up().await;
    let (_process, other) = app.spawn_gateway_process().await;
    // The message goes in through the test's gateway; the only socket waiting for the reply is
    // held by the other process.
    let mut sender = ChatClient::as_user(&app.gateway_url, "ana").await;
    let mut elsewhere = ChatClient::as_user(&other, "ana").await;
    sender.say("p-1", "across processes").await;
    sender.until("accepted", WAIT).await;
    sender.close().await;
    let reply = elsewhere.reply(WAIT).await;
    assert_eq!(reply["in_reply_to"], "p-1");
    assert_eq!(reply["text"], "echo: across processes");
    app.shutdown().await;
}

#[tokio::test]
async fn a_live_socket_gets_a_reply_whose_announcement_its_gateway_missed() {
    // Catch-ups every 300 ms, so the table read shows within the test's patience.
    let app = spawn_app_configured(|c| c.chat.catch_up_ms = 300).await;
    let deaf = app.gateway_missing_announcements().await;
    // Connected (and its backlog read) before the message exists: only a read of the table
    // while the socket is open can bring the reply.
    let mut chat = ChatClient::as_user(&deaf, "ana").await;
    chat.say("l-1", "anyone there?").await;
    chat.until("accepted", WAIT).await;
    let reply = chat.reply(WAIT).await;
    assert_eq!(reply["in_reply_to"], "l-1");
    assert_eq!(reply["text"], "echo: anyone there?");
    // Once: later catch-ups read it again and do not push it again.
    assert!(chat.next_frame(QUIET).await.is_none());
    app.shutdown().await;
}

/// A chat reply to `address` on the admin chat, as the deliver stage gets it from dispatch.
fn chat_reply(address: &str, in_reply_to: &str, text: &str) -> switchboard_kit::proto::Reply {
    switchboard_kit::proto::Reply {
        id: uuid::Uuid::now_v7().to_string(),
        session_id: uuid::Uuid::now_v7().to_string(),
        seq: 1,
        text: text.into(),
        channel: "admin_chat".into(),
        provider: "chat".into(),
        recipient: address.into(),
        correlation_id: uuid::Uuid::now_v7().to_string(),
        provider_message_id: in_reply_to.into(),
        agent_name: "reggie_oc".into(),
        ..Default::default()
    }
}

/// A chat client as the widget (and the chaos load) keeps one: it remembers the highest `seq`
/// it saw and opens its socket again with `?since=` that seq when the socket drops.
struct Resuming {
    sub: String,
    last_seq: i64,
    seen: Vec<(i64, String)>,
}

impl Resuming {
    fn new(sub: &str) -> Self {
        Self {
            sub: sub.into(),
            last_seq: 0,
            seen: Vec::new(),
        }
    }

    async fn open(&mut self, gateway_url: &str) -> ChatClient {
        let token = chat_token(&self.sub, json!({}));
        let mut socket = ChatClient::connect(
            gateway_url,
            &format!("token={token}&since={}", self.last_seq),
        )
        .await
        .unwrap();
        // A frame is answered only once the backlog was sent: after this, what comes was
        // pushed while the socket was open.
        socket.send_frame(json!({"type": "hello"})).await;
        for frame in socket.until("error", WAIT).await {
            self.note(&frame);
        }
        socket
    }

    /// Read replies until the socket is quiet for `QUIET`.
    async fn read(&mut self, socket: &mut ChatClient) {
        while let Some(frame) = socket.next_frame(QUIET).await {
            self.note(&frame);
        }
    }

    fn note(&mut self, frame: &serde_json::Value) {
        if frame["type"] == "reply" {
            let seq = frame["seq"].as_i64().unwrap();
            self.last_seq = self.last_seq.max(seq);
            self.seen
                .push((seq, frame["in_reply_to"].as_str().unwrap().to_string()));
        }
    }

    fn in_reply_to(&self) -> Vec<&str> {
        self.seen.iter().map(|(_, id)| id.as_str()).collect()
    }
}

/// Store a reply's part the way a deliverer does that dies right after its INSERT commits,
/// before announcing it (or announces it while NATS is down): it is in the mailbox and no
/// gateway hears of it.
async fn stored_unannounced(app: &TestApp, reply: &switchboard_kit::proto::Reply) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO switchboard.mailbox
            (reply_id, part, channel, address, agent, correlation_id, in_reply_to, text)
         VALUES ($1::uuid, 0, $2, $3, $4, $5, $6, $7) RETURNING seq",
    )
    .bind(&reply.id)
    .bind(&reply.channel)
    .bind(&reply.recipient)
    .bind(&reply.agent_name)
    .bind(&reply.correlation_id)
    .bind(&reply.provider_message_id)
    .bind(&reply.text)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_reply_whose_announcement_was_lost_reaches_the_socket_before_any_later_one() {
    // No catch-up within the test: as in a chaos run, where the gateway is killed every few
    // seconds and a socket rarely lives to its first catch-up.
    let app = app_without_catch_up().await;
    let mut ana = Resuming::new("ana");
    let mut socket = ana.open(&app.gateway_url).await;

    // The first reply is stored and its announcement lost; the second one is announced.
    let first = chat_reply("ana", "m-1", "echo: first");
    let first_seq = stored_unannounced(&app, &first).await;
    let second = chat_reply("ana", "m-2", "echo: second");
    app.deliver_directly(&second).await;
    ana.read(&mut socket).await;

    // The gateway is killed; the client comes back saying the last seq it saw.
    socket.close().await;
    let mut again = ana.open(&app.gateway_url).await;
    ana.read(&mut again).await;
    assert_eq!(
        ana.in_reply_to(),
        ["m-1", "m-2"],
        "each reply once, in order (the first was seq {first_seq}); the client saw {:?}",
        ana.seen
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_reply_committed_after_a_later_one_for_the_same_person_is_not_skipped() {
    let app = app_without_catch_up().await;
    let mut ana = Resuming::new("ana");
    let mut socket = ana.open(&app.gateway_url).await;
    let first = chat_reply("ana", "o-1", "echo: first");
    let second = chat_reply("ana", "o-2", "echo: second");

    // The first reply's INSERT draws its seq and then stalls before it commits (a slow
    // connection, a deliverer paused by the scheduler).
    let stall = stall_mailbox_write(&app, &first).await;
    tokio::join!(app.deliver_directly(&first), async {
        wait_for_blocked_mailbox_insert(&app).await;
        // Meanwhile the second reply is delivered.
        tokio::join!(app.deliver_directly(&second), async {
            ana.read(&mut socket).await;
            // The gateway is killed; then the first reply's write goes through.
            socket.close().await;
            stall.rollback().await.unwrap();
        });
    });
    // The client comes back, saying the last seq it saw.
    let mut again = ana.open(&app.gateway_url).await;
    ana.read(&mut again).await;
    assert_eq!(
        ana.in_reply_to(),
        ["o-1", "o-2"],
        "each reply once, in order; the client saw {:?}",
        ana.seen
    );
    app.shutdown().await;
}

/// A chat reply is a write to the mailbox, not an HTTP send: a deliverer that dies while
/// writing it holds it for the mailbox's short lease, not the 45 s a provider's send needs,
/// and the reply is written once however the writes meet.
#[tokio::test]
async fn a_chat_reply_being_written_is_held_for_the_mailboxs_short_lease_and_written_once() {
    let app = app_without_catch_up().await;
    let mut ana = Resuming::new("ana");
    let mut socket = ana.open(&app.gateway_url).await;
    let reply = chat_reply("ana", "l-1", "echo: held briefly");
    let stall = stall_mailbox_write(&app, &reply).await;
    tokio::join!(app.deliver_directly(&reply), async {
        wait_for_blocked_mailbox_insert(&app).await;
        // Were the deliverer to die now, the reply would be taken over when this ends.
        let held_for: f64 = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM leased_until - now())::float8
               FROM switchboard.deliveries WHERE reply_id = $1::uuid",
        )
        .bind(&reply.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
        // 10 s, as the README says; an SMS provider's lease is 45 s.
        assert!(
            held_for > 0.0 && held_for <= 10.0,
            "a chat reply is held {held_for:.1} s"
        );
        stall.rollback().await.unwrap();
    });
    ana.read(&mut socket).await;
    assert_eq!(ana.in_reply_to(), ["l-1"], "{:?}", ana.seen);
    let entries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.mailbox WHERE reply_id = $1::uuid")
            .bind(&reply.id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(entries, 1);
    app.shutdown().await;
}

/// Make `reply`'s mailbox write stall until the transaction returned is rolled back:
/// deterministically, as another transaction holds an uncommitted row of the same part.
async fn stall_mailbox_write(
    app: &TestApp,
    reply: &switchboard_kit::proto::Reply,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut stall = app.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO switchboard.mailbox
            (reply_id, part, channel, address, agent, correlation_id, text)
         VALUES ($1::uuid, 0, 'admin_chat', 'elsewhere', '', '', '')",
    )
    .bind(&reply.id)
    .execute(&mut *stall)
    .await
    .unwrap();
    stall
}

/// Until a mailbox INSERT of this test's database waits on a lock.
async fn wait_for_blocked_mailbox_insert(app: &TestApp) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%INSERT INTO switchboard.mailbox%'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first reply's write never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_bad_frame_gets_an_error_frame_and_the_socket_stays_usable() {
    let app = spawn_app().await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.send_frame(json!({"type": "message", "id": "has space", "text": "x"}))
        .await;
    let e = chat.next_frame(WAIT).await.unwrap();
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("invalid_field"))
    );
    chat.send_frame(json!({"type": "message", "id": "k-1", "agent": "nobody", "text": "x"}))
        .await;
    let e = chat.next_frame(WAIT).await.unwrap();
    assert_eq!(e["code"], "unknown_agent");
    assert_eq!(e["id"], "k-1");
    chat.send_frame(json!({"type": "message", "id": "k-2", "agent": "reggie_fd", "text": "hi"}))
        .await;
    let reply = chat.reply(WAIT).await;
    assert_eq!(reply["agent"], "reggie_fd");
    app.shutdown().await;
}
