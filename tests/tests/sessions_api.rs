//! The sessions API (`/api/v1/sessions…`): an operator with a `sessions:read` key finds a
//! person's sessions and reads their conversations and journals; one with `sessions:write`
//! asks for a reset. Conversations are had through the product (SMS and the messages API).
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{TestApp, spawn_app};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(20);
const DANA: &str = "+14155550111";
const OMAR: &str = "+14155550122";

/// `GET {path}` with `key` (if any) and `query` (encoded: a `+` stays a plus); status and JSON.
async fn get(app: &TestApp, key: Option<&str>, path: &str, query: &[(&str, &str)]) -> (u16, Value) {
    let response = request(app, reqwest::Method::GET, key, path, query).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn post(app: &TestApp, key: Option<&str>, path: &str) -> (u16, Value) {
    let response = request(app, reqwest::Method::POST, key, path, &[]).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn request(
    app: &TestApp,
    method: reqwest::Method,
    key: Option<&str>,
    path: &str,
    query: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", app.gateway_url))
        .query(query);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("gateway reachable")
}

/// `person` texts `texts` one after another, each answered before the next.
async fn texts(app: &TestApp, person: &str, texts: &[&str]) {
    for text in texts {
        let before = app.twilio.sent().len();
        assert_eq!(app.send_sms(person, text).await.status(), 200);
        app.wait_for_sms(before + 1, WAIT).await;
    }
    app.settle().await;
}

/// The sessions a listing gives (`GET /api/v1/sessions` with `query`), and its `next`.
async fn sessions(app: &TestApp, key: &str, query: &[(&str, &str)]) -> (Vec<Value>, Value) {
    let (status, body) = get(app, Some(key), "/api/v1/sessions", query).await;
    assert_eq!(status, 200, "{body}");
    (
        body["sessions"].as_array().unwrap().clone(),
        body["next"].clone(),
    )
}

/// The only session of `person`.
async fn session_of(app: &TestApp, key: &str, person: &str) -> Value {
    let (found, _) = sessions(app, key, &[("person", person)]).await;
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

/// `(person, agent)` of each session listed with `query`, in the listing's order.
async fn whose(app: &TestApp, key: &str, query: &[(&str, &str)]) -> Vec<(String, String)> {
    let (list, _) = sessions(app, key, query).await;
    list.iter()
        .map(|s| {
            let s = |a: &str, b: &str| s[a][b].as_str().unwrap().to_string();
            (s("person", "id"), s("agent", "name"))
        })
        .collect()
}

/// `(direction, channel, text)` of each message.
fn said(messages: &[Value]) -> Vec<(String, String, String)> {
    messages
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap().to_string();
            (s("direction"), s("channel"), s("text"))
        })
        .collect()
}

fn line(direction: &str, channel: &str, text: &str) -> (String, String, String) {
    (direction.into(), channel.into(), text.into())
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

#[tokio::test]
async fn an_operator_lists_a_persons_sessions_and_reads_their_conversation_in_order() {
    let app = spawn_app().await;
    texts(&app, DANA, &["hello", "and again"]).await;
    texts(&app, OMAR, &["not Dana"]).await;
    let key = app.api_key("ops-console", &["sessions:read"]).await;

    // Everyone's sessions, newest first.
    let (all, next) = sessions(&app, &key, &[]).await;
    let people: Vec<&Value> = all.iter().map(|s| &s["person"]["id"]).collect();
    assert_eq!(
        people,
        [
            &json!(format!("phone:{OMAR}")),
            &json!(format!("phone:{DANA}"))
        ]
    );
    assert_eq!(next, Value::Null);

    // Dana's session, as it stands.
    let dana = session_of(&app, &key, &format!("phone:{DANA}")).await;
    assert_eq!(dana["person"]["type"], "external", "{dana}");
    assert_eq!(
        dana["agent"],
        json!({"name": "reggie_oc", "identity": "reggie", "engine": "openclaw"})
    );
    assert_eq!(dana["status"], "idle");
    assert_eq!(dana["channel"], "sms");
    assert_eq!(dana["channels"], json!(["sms"]));
    assert_eq!(
        dana["turns"],
        json!({"done": 2, "last_seq": 2, "opened": 2})
    );
    assert!(dana["engine_session_id"].is_string(), "{dana}");
    assert_eq!(dana["pending_reset"], Value::Null);
    assert_eq!(dana["resets"], 0);
    let id = dana["id"].as_str().unwrap().to_string();

    // Her conversation, in order, and nobody else's.
    let (status, page) = get(
        &app,
        Some(&key),
        &format!("/api/v1/sessions/{id}/messages"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(
        said(messages),
        [
            line("inbound", "sms", "hello"),
            line("outbound", "sms", "echo: hello"),
            line("inbound", "sms", "and again"),
            line("outbound", "sms", "echo: and again"),
        ]
    );
    assert_eq!(page["next"], Value::Null);
    // A question and its answer share a correlation id; the answer says what it cost.
    assert_eq!(messages[0]["correlation_id"], messages[1]["correlation_id"]);
    assert_ne!(messages[1]["correlation_id"], messages[2]["correlation_id"]);
    assert_eq!(messages[1]["processing_ms"], 7);
    assert_eq!(messages[1]["tool_calls_count"], 2);
    assert_eq!(messages[1]["agent"], "reggie_oc");

    // Read a page at a time, it is the same conversation.
    let path = format!("/api/v1/sessions/{id}/messages");
    let (_, first) = get(&app, Some(&key), &path, &[("limit", "3")]).await;
    assert_eq!(first["messages"].as_array().unwrap().len(), 3);
    let after = first["next"].as_str().expect("a next page").to_string();
    let (_, rest) = get(
        &app,
        Some(&key),
        &path,
        &[("limit", "3"), ("after", &after)],
    )
    .await;
    assert_eq!(
        said(rest["messages"].as_array().unwrap()),
        said(&messages[3..])
    );
    assert_eq!(rest["next"], Value::Null);

    // The listing pages the same way.
    let (one, next) = sessions(&app, &key, &[("limit", "1")]).await;
    assert_eq!(one[0]["person"]["id"], json!(format!("phone:{OMAR}")));
    let (two, last) = sessions(
        &app,
        &key,
        &[("limit", "1"), ("after", next.as_str().unwrap())],
    )
    .await;
    assert_eq!(two[0]["id"], json!(id));
    assert_eq!(last, Value::Null);

    // One session read by its id is the one listed.
    let (status, one) = get(&app, Some(&key), &format!("/api/v1/sessions/{id}"), &[]).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["turns"], dana["turns"]);
    assert_eq!(one["summary"], Value::Null);
    app.shutdown().await;
}

#[tokio::test]
async fn sessions_are_found_by_agent_status_and_every_channel_their_conversation_used() {
    let app = spawn_app().await;
    texts(&app, DANA, &["hi by text"]).await;
    texts(&app, OMAR, &["hi from Omar"]).await;
    // Dana's CRM account is Dana: what it sends joins her conversation.
    let linker = app.api_key("ops-console", &["identity:write"]).await;
    let response = app
        .post_api(
            "identity/links",
            &linker,
            json!({"from": "api:crm", "to": format!("phone:{DANA}"), "reason": "Dana's CRM login"}),
            None,
        )
        .await;
    assert_eq!(response.status(), 201);
    let crm = app.api_key("crm", &[]).await;
    let (status, body) = {
        let r = app
            .post_api_message(&crm, json!({"text": "hi by API", "wait": true}), None)
            .await;
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("answered")),
        "{body}"
    );
    // And she asks the identity's other engine something.
    let r = app
        .post_api_message(
            &crm,
            json!({"agent": "reggie_fd", "text": "other engine", "wait": true}),
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    app.settle().await;
    let key = app.api_key("ops-console", &["sessions:read"]).await;
    let found = async |query: &[(&str, &str)]| whose(&app, &key, query).await;
    let dana = |agent: &str| (format!("phone:{DANA}"), agent.to_string());
    let omar = (format!("phone:{OMAR}"), "reggie_oc".to_string());

    // Her session began by SMS and went on by API: it is found by either channel.
    assert_eq!(
        found(&[("channel", "api")]).await,
        [dana("reggie_fd"), dana("reggie_oc")]
    );
    assert_eq!(
        found(&[("channel", "sms")]).await,
        [omar.clone(), dana("reggie_oc")]
    );
    assert_eq!(found(&[("channel", "admin_chat")]).await, []);
    let (all, _) = sessions(&app, &key, &[("agent", "reggie_oc"), ("channel", "sms")]).await;
    let hers = all
        .iter()
        .find(|s| s["person"]["id"] == json!(format!("phone:{DANA}")))
        .unwrap();
    assert_eq!(hers["channel"], "sms");
    assert_eq!(hers["channels"], json!(["api", "sms"]));
    let id = hers["id"].as_str().unwrap();
    let (_, page) = get(
        &app,
        Some(&key),
        &format!("/api/v1/sessions/{id}/messages"),
        &[],
    )
    .await;
    assert_eq!(
        said(page["messages"].as_array().unwrap()),
        [
            line("inbound", "sms", "hi by text"),
            line("outbound", "sms", "echo: hi by text"),
            line("inbound", "api", "hi by API"),
            line("outbound", "api", "echo: hi by API"),
        ]
    );

    // By agent: a variant's name, or its identity for every variant.
    assert_eq!(found(&[("agent", "reggie_fd")]).await, [dana("reggie_fd")]);
    assert_eq!(
        found(&[("agent", "reggie")]).await,
        [dana("reggie_fd"), omar.clone(), dana("reggie_oc")]
    );
    assert_eq!(
        found(&[("agent", "reggie_oc"), ("person", &format!("phone:{DANA}"))]).await,
        [dana("reggie_oc")]
    );
    // By status.
    assert_eq!(found(&[("status", "idle")]).await.len(), 3);
    assert_eq!(found(&[("status", "terminated")]).await, []);
    let (status, body) = get(
        &app,
        Some(&key),
        "/api/v1/sessions",
        &[("status", "asleep")],
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (400, "invalid_status"),
        "{body}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_session_shows_the_summary_its_identitys_engines_share() {
    let app = spawn_app().await;
    let crm = app.api_key("crm", &[]).await;
    for agent in ["reggie_oc", "reggie_fd"] {
        let r = app
            .post_api_message(
                &crm,
                json!({"agent": agent, "text": "hi", "wait": true}),
                None,
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    app.settle().await;
    let memory_key: String = sqlx::query_scalar(
        "SELECT DISTINCT memory_key FROM switchboard.sessions WHERE person_id = 'api:crm'",
    )
    .fetch_one(&app.db)
    .await
    .expect("one memory key for both engines");
    // The summary worker's row, written by hand (over the one the switch to reggie_fd may
    // already have had the worker write).
    sqlx::query(
        "INSERT INTO switchboard.summaries (memory_key, agent_identity, person_id, summary)
         VALUES ($1, 'reggie', 'api:crm', 'Asks about orders; prefers short answers.')
         ON CONFLICT (memory_key) DO UPDATE SET summary = EXCLUDED.summary",
    )
    .bind(&memory_key)
    .execute(&app.db)
    .await
    .unwrap();

    let key = app.api_key("ops-console", &["sessions:read"]).await;
    let (both, _) = sessions(&app, &key, &[("person", "api:crm")]).await;
    assert_eq!(both.len(), 2);
    for s in both {
        let (status, one) = get(
            &app,
            Some(&key),
            &format!("/api/v1/sessions/{}", s["id"].as_str().unwrap()),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{one}");
        assert_eq!(
            one["summary"]["text"], "Asks about orders; prefers short answers.",
            "{one}"
        );
        assert!(one["summary"]["updated_at"].is_string());
    }
    app.shutdown().await;
}

#[tokio::test]
async fn the_export_is_the_conversation_as_jsonl_one_message_a_line() {
    let app = spawn_app().await;
    texts(&app, DANA, &["first", "second"]).await;
    let key = app.api_key("ops-console", &["sessions:read"]).await;
    let id = session_of(&app, &key, &format!("phone:{DANA}")).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let export = |app: &TestApp| {
        let key = key.clone();
        let path = format!("/api/v1/sessions/{id}/export");
        let app_url = app.gateway_url.clone();
        async move {
            let r = reqwest::Client::new()
                .get(format!("{app_url}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let header = |name: &str| r.headers()[name].to_str().unwrap().to_string();
            let headers = (header("content-type"), header("content-disposition"));
            (headers, r.text().await.unwrap())
        }
    };
    let ((content_type, disposition), body) = export(&app).await;
    assert_eq!(content_type, "application/x-ndjson");
    assert_eq!(
        disposition,
        format!("attachment; filename=\"session-{id}.jsonl\"")
    );
    assert!(body.ends_with('\n'));
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    assert_eq!(
        said(&lines),
        [
            line("inbound", "sms", "first"),
            line("outbound", "sms", "echo: first"),
            line("inbound", "sms", "second"),
            line("outbound", "sms", "echo: second"),
        ]
    );
    assert!(
        lines
            .iter()
            .all(|l| l["agent"] == "reggie_oc" && l["at"].is_string())
    );
    // The same messages the API pages through.
    let (_, page) = get(
        &app,
        Some(&key),
        &format!("/api/v1/sessions/{id}/messages"),
        &[],
    )
    .await;
    let ids = |list: &[Value]| list.iter().map(|m| m["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&lines), ids(page["messages"].as_array().unwrap()));

    // A long conversation is exported whole: 1,200 more messages (logged by hand, as the log
    // worker writes them), past the export's batches of 500.
    let more: Vec<Uuid> = (0..1200).map(|_| Uuid::now_v7()).collect();
    let said_more: Vec<String> = (0..1200).map(|i| format!("note {i}")).collect();
    sqlx::query(
        "INSERT INTO switchboard.messages
            (id, session_id, person_id, agent_name, agent_identity, direction, channel, message,
             correlation_id)
         SELECT m.id, $1, $2, 'reggie_oc', 'reggie', 'inbound', 'sms', m.text, m.id::text
           FROM UNNEST($3::uuid[], $4::text[]) AS m(id, text)",
    )
    .bind(id.parse::<Uuid>().unwrap())
    .bind(format!("phone:{DANA}"))
    .bind(&more)
    .bind(&said_more)
    .execute(&app.db)
    .await
    .unwrap();
    let (_, body) = export(&app).await;
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4 + 1200);
    assert_eq!(lines[3]["text"], "echo: second");
    assert_eq!(lines[4]["text"], "note 0");
    assert_eq!(lines[1203]["text"], "note 1199");
    app.shutdown().await;
}

#[tokio::test]
async fn a_reset_asked_for_through_the_api_is_pending_for_the_next_turn_and_is_in_the_journal() {
    let app = spawn_app().await;
    texts(&app, DANA, &["remember the blue one"]).await;
    let reader = app.api_key("ops-console", &["sessions:read"]).await;
    let writer = app
        .api_key("ops-lead", &["sessions:read", "sessions:write"])
        .await;
    let id = session_of(&app, &reader, &format!("phone:{DANA}")).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let reset = format!("/api/v1/sessions/{id}/reset");
    let journal = |app: &TestApp| {
        let path = format!("/api/v1/sessions/{id}/events");
        let reader = reader.clone();
        let url = app.gateway_url.clone();
        async move {
            let r = reqwest::Client::new()
                .get(format!("{url}{path}"))
                .bearer_auth(reader)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: Value = r.json().await.unwrap();
            body["events"].as_array().unwrap().clone()
        }
    };
    let requested = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["kind"] == "reset_requested")
            .map(|e| e["detail"]["by"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };

    // Reading is not resetting.
    let (status, body) = post(&app, Some(&reader), &reset).await;
    assert_eq!(
        (status, error_code(&body)),
        (403, "missing_scope"),
        "{body}"
    );
    assert!(requested(&journal(&app).await).is_empty());

    let (status, body) = post(&app, Some(&writer), &reset).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["session_id"], json!(id));
    assert_eq!(body["pending_reset"], "api");
    // Asked twice, it is still one reset for the next turn; the journal says who asked, twice.
    let (status, _) = post(&app, Some(&writer), &reset).await;
    assert_eq!(status, 202);
    let (_, session) = get(&app, Some(&reader), &format!("/api/v1/sessions/{id}"), &[]).await;
    assert_eq!(session["pending_reset"], "api", "{session}");
    assert!(session["pending_reset_at"].is_string());
    assert_eq!(session["resets"], 0, "applied by the next turn, not now");
    let events = journal(&app).await;
    assert_eq!(requested(&events), ["api:ops-lead", "api:ops-lead"]);
    // The journal is in order, and the request is its latest entry.
    let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    assert_eq!(events.last().unwrap()["kind"], "reset_requested");
    assert!(events.last().unwrap()["at"].is_string());

    // Dana's next message applies it: a fresh engine session, and she is told.
    texts(&app, DANA, &["is it ready?"]).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].session_id, None);
    assert_eq!(calls[1].session_id, None, "the reset was not applied");
    let told = app.twilio.sent().last().unwrap().body.clone();
    assert!(told.contains("reset by an operator"), "{told}");
    let (_, session) = get(&app, Some(&reader), &format!("/api/v1/sessions/{id}"), &[]).await;
    assert_eq!(session["pending_reset"], Value::Null, "{session}");
    assert_eq!(session["resets"], 1);
    let kinds: Vec<Value> = journal(&app)
        .await
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    let requested_at = kinds.iter().rposition(|k| k == "reset_requested").unwrap();
    let applied_at = kinds
        .iter()
        .position(|k| k == "reset")
        .expect("a reset entry");
    assert!(applied_at > requested_at, "{kinds:?}");

    // A session that takes no more turns takes no reset.
    sqlx::query(
        "UPDATE switchboard.sessions SET status = 'terminated', pending_reset = NULL WHERE id = $1",
    )
    .bind(id.parse::<Uuid>().unwrap())
    .execute(&app.db)
    .await
    .unwrap();
    let (status, body) = post(&app, Some(&writer), &reset).await;
    assert_eq!(
        (status, error_code(&body)),
        (409, "session_terminated"),
        "{body}"
    );
    let (_, session) = get(&app, Some(&reader), &format!("/api/v1/sessions/{id}"), &[]).await;
    assert_eq!(session["pending_reset"], Value::Null);
    assert_eq!(requested(&journal(&app).await).len(), 2);
    app.shutdown().await;
}

#[tokio::test]
async fn a_key_without_sessions_read_sees_nothing() {
    let app = spawn_app().await;
    texts(&app, DANA, &["my secret order"]).await;
    let reader = app.api_key("ops-console", &["sessions:read"]).await;
    let id = session_of(&app, &reader, &format!("phone:{DANA}")).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let paths = [
        "/api/v1/sessions".to_string(),
        format!("/api/v1/sessions/{id}"),
        format!("/api/v1/sessions/{id}/messages"),
        format!("/api/v1/sessions/{id}/events"),
        format!("/api/v1/sessions/{id}/export"),
    ];
    let keys = [
        // What a key gets when no scope is named.
        app.api_key("crm", &[]).await,
        app.api_key(
            "auditor",
            &["identity:read", "identity:write", "messages:read"],
        )
        .await,
        // Resetting is not reading.
        app.api_key("ops-bot", &["sessions:write"]).await,
    ];
    for key in &keys {
        for path in &paths {
            let response = request(&app, reqwest::Method::GET, Some(key), path, &[]).await;
            assert_eq!(response.status(), 403, "{path}");
            let body = response.text().await.unwrap();
            assert!(!body.contains("secret") && !body.contains(DANA), "{body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(error_code(&body), "missing_scope", "{path}");
        }
    }
    let reset = format!("/api/v1/sessions/{id}/reset");
    let (status, body) = post(&app, Some(&keys[0]), &reset).await;
    assert_eq!((status, error_code(&body)), (403, "missing_scope"));

    // Without a key, or with one that is not ours: 401.
    for path in paths.iter().chain([&reset]) {
        for key in [None, Some("sb_not-a-key")] {
            let method = if path == &reset {
                reqwest::Method::POST
            } else {
                reqwest::Method::GET
            };
            let response = request(&app, method, key, path, &[]).await;
            assert_eq!(response.status(), 401, "{path}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(error_code(&body), "invalid_api_key");
        }
    }
    let (_, session) = get(&app, Some(&reader), &format!("/api/v1/sessions/{id}"), &[]).await;
    assert_eq!(session["pending_reset"], Value::Null, "nothing was reset");
    app.shutdown().await;
}

#[tokio::test]
async fn an_unknown_session_is_404_and_a_malformed_request_400_with_an_error_code() {
    let app = spawn_app().await;
    texts(&app, DANA, &["hi"]).await;
    let key = app
        .api_key("ops-lead", &["sessions:read", "sessions:write"])
        .await;
    let unknown = Uuid::now_v7();
    for path in ["", "/messages", "/events", "/export"] {
        let (status, body) = get(
            &app,
            Some(&key),
            &format!("/api/v1/sessions/{unknown}{path}"),
            &[],
        )
        .await;
        assert_eq!(
            (status, error_code(&body)),
            (404, "session_not_found"),
            "{path}: {body}"
        );
        let (status, body) = get(
            &app,
            Some(&key),
            &format!("/api/v1/sessions/not-a-session{path}"),
            &[],
        )
        .await;
        assert_eq!(
            (status, error_code(&body)),
            (400, "invalid_session_id"),
            "{path}: {body}"
        );
    }
    let (status, body) = post(
        &app,
        Some(&key),
        &format!("/api/v1/sessions/{unknown}/reset"),
    )
    .await;
    assert_eq!((status, error_code(&body)), (404, "session_not_found"));
    let (status, body) = post(&app, Some(&key), "/api/v1/sessions/42/reset").await;
    assert_eq!((status, error_code(&body)), (400, "invalid_session_id"));

    let bad = [
        (vec![("limit", "0")], "invalid_limit"),
        (vec![("limit", "501")], "invalid_limit"),
        (vec![("after", "yesterday")], "invalid_cursor"),
        (vec![("status", "asleep")], "invalid_status"),
        // A misspelt filter filters nothing: refused, not ignored.
        (vec![("persn", "phone:+14155550111")], "invalid_query"),
    ];
    for (query, code) in bad {
        let (status, body) = get(&app, Some(&key), "/api/v1/sessions", &query).await;
        assert_eq!(
            (status, error_code(&body)),
            (400, code),
            "{query:?}: {body}"
        );
    }
    let (found, _) = sessions(&app, &key, &[("limit", "500")]).await;
    assert_eq!(found.len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn the_conversation_names_the_tools_the_agent_called_for_a_reply_and_never_their_arguments() {
    let app = spawn_app().await;
    // The runner reports what its engine says it called (OpenClaw: `meta.toolSummary.tools`),
    // one name bounded and one of them control characters only.
    app.runner
        .report_tools(&["read", "web_search", "\u{7}", &"x".repeat(100), "read"]);
    texts(&app, DANA, &["what is in my notes?"]).await;
    let key = app.api_key("ops-console", &["sessions:read"]).await;
    let dana = session_of(&app, &key, &format!("phone:{DANA}")).await;
    let id = dana["id"].as_str().unwrap();
    let (status, body) = get(
        &app,
        Some(&key),
        &format!("/api/v1/sessions/{id}/messages"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let messages = body["messages"].as_array().unwrap();
    let (inbound, outbound) = (&messages[0], &messages[1]);
    assert_eq!(inbound["tool_names"], json!([]));
    assert_eq!(
        outbound["tool_names"],
        json!(["read", "web_search", "x".repeat(64)]),
        "{outbound}"
    );
    assert_eq!(outbound["tool_calls_count"], 2);
    // Kept in the log row beside the count.
    let logged: Value = sqlx::query_scalar(
        "SELECT metadata->'tool_names' FROM switchboard.messages WHERE direction = 'outbound'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(logged, json!(["read", "web_search", "x".repeat(64)]));
}
