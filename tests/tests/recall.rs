//! Recall: a turn's prompt carries the person's earlier messages with this agent identity that
//! bear on what they just said (never anyone else's, never what the agent's engine session
//! holds already), and the session's journal says what was recalled and how far behind the
//! index was. Embeddings come from a fake OpenAI-compatible server (deterministic vectors over
//! the words), written by the real embedding worker.
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_e2e::{FakeModel, FakeRunner, TestApp, recall_block, spawn_app_configured};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

async fn app_with_embeddings() -> (TestApp, FakeModel) {
    app_with(false).await
}

/// With `workspaces`, sessions get a workspace (memory.md), and so a reset its flush first.
async fn app_with(workspaces: bool) -> (TestApp, FakeModel) {
    let fake = FakeModel::start(64).await;
    let embedding = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| {
        if workspaces {
            c.workspace.root = std::env::temp_dir()
                .join(format!("sb-recall-{}", Uuid::new_v4().simple()))
                .to_string_lossy()
                .into_owned();
        }
        c.embedding = embedding;
    })
    .await;
    (app, fake)
}

/// Wait until at least `logged` messages are logged and every logged message has its vector
/// (the log and embedding workers caught up: a reply sent does not mean its exchange is
/// logged yet). The flush's silent answer is not conversation: never embedded.
async fn indexed(app: &TestApp, logged: i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (messages, vectors): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM switchboard.messages
                      WHERE coalesce(metadata->>'kind', '') <> 'memory_flush'),
                    (SELECT count(*) FROM switchboard.message_vectors)",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if messages >= logged && messages == vectors {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{vectors} of {messages} messages indexed within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An SMS from `phone`, answered: the `n`th SMS sent.
async fn text(app: &TestApp, phone: &str, body: &str, n: usize) {
    app.text_answered(phone, body, n).await;
}

async fn inbound_id(app: &TestApp, text: &str) -> Uuid {
    sqlx::query_scalar(
        "SELECT id FROM switchboard.messages WHERE direction = 'inbound' AND message = $1",
    )
    .bind(text)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The session's journal entries of `kind`, oldest first, as the sessions API shows them.
async fn journal(app: &TestApp, kind: &str) -> Vec<Value> {
    let session: Uuid = sqlx::query_scalar("SELECT id FROM switchboard.sessions LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let key = app.api_key("ops", &["sessions:read"]).await;
    let body: Value = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/sessions/{session}/events",
            app.gateway_url
        ))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_fresh_session_recalls_the_persons_earlier_message_on_the_same_matter_and_the_journal_says_so()
 {
    let (app, _fake) = app_with_embeddings().await;
    let phone = "+14155550301";
    text(
        &app,
        phone,
        "My March payslip is missing the overtime hours",
        1,
    )
    .await;
    text(&app, phone, "Also the canteen coffee machine is broken", 2).await;
    indexed(&app, 4).await;

    // A reset: the new engine session knows nothing of the earlier turns.
    text(&app, phone, "/reset is my March payslip fixed yet", 3).await;
    let calls = app.runner.calls();
    let prompt = &calls.last().unwrap().prompt;
    let block = recall_block(prompt).expect("the prompt has a recall block");
    let lines: Vec<&str> = block.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(
        lines[0].contains("they wrote: My March payslip is missing the overtime hours"),
        "the payslip message is recalled first:\n{block}"
    );
    assert!(
        !block.contains("/reset"),
        "the message being answered is not recalled to itself:\n{block}"
    );
    // Memory and summary come before recall: the curated memory wins where they disagree.
    let at = |needle: &str| prompt.find(needle).unwrap();
    assert!(
        at("Curated memory") < at("Summary of earlier")
            && at("Summary of earlier") < at("Recalled")
    );

    let entries = journal(&app, "recall").await;
    let last = entries.last().expect("a recall entry in the journal");
    let recalled: Vec<&str> = last["detail"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    let payslip = inbound_id(&app, "My March payslip is missing the overtime hours").await;
    assert_eq!(recalled[0], payslip.to_string(), "{last}");
    assert_eq!(last["detail"]["messages_waiting"], 0, "{last}");
    assert!(last["detail"]["index_lag_s"].is_number(), "{last}");
    assert!(last["detail"]["messages"][0]["score"].as_f64().unwrap() > 0.0);
    app.shutdown().await;
}

#[tokio::test]
async fn what_the_engine_session_already_holds_is_not_recalled_until_a_reset_clears_it() {
    let (app, _fake) = app_with_embeddings().await;
    let phone = "+14155550302";
    text(
        &app,
        phone,
        "My March payslip is missing the overtime hours",
        1,
    )
    .await;
    indexed(&app, 2).await;
    text(&app, phone, "Any news on the March payslip?", 2).await;
    let calls = app.runner.calls();
    let resumed = &calls[1];
    assert!(
        resumed.session_id.is_some(),
        "the engine session was resumed"
    );
    let block = recall_block(&resumed.prompt).unwrap_or_default();
    assert!(
        !block.contains("missing the overtime"),
        "the resumed engine session holds that turn already:\n{block}"
    );

    indexed(&app, 4).await;
    text(&app, phone, "/reset the March payslip again", 3).await;
    let fresh = app.runner.calls().last().unwrap().clone();
    assert!(fresh.session_id.is_none(), "a fresh engine session");
    let block = recall_block(&fresh.prompt).expect("a recall block");
    assert!(
        block.contains("they wrote: My March payslip is missing the overtime hours")
            && block.contains("they wrote: Any news on the March payslip?"),
        "after the reset, both earlier turns are recalled:\n{block}"
    );
    assert_eq!(journal(&app, "recall").await.len(), 3, "one entry per turn");
    app.shutdown().await;
}

/// Held messages (and the one being answered) nearer to the new message than anything else
/// must not crowd out the person's older, recallable message: the filters are applied while the
/// vector candidates are ranked, not only after the few best are taken.
#[tokio::test]
async fn messages_the_engine_session_holds_do_not_crowd_an_older_message_out_of_recall() {
    let fake = FakeModel::start(64).await;
    let embedding = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| {
        c.embedding = embedding;
        // One hit: each branch ranks four candidates, fewer than the six held messages.
        c.recall.top_k = 1;
    })
    .await;
    let phone = "+14155550304";
    let old = "My March payslip is missing the overtime hours";
    text(&app, phone, old, 1).await;
    // A fresh engine session, then turns on the same matter in words the old message lacks
    // ("again"), so only its meaning can recall it: each one, and its echoed reply, is nearer
    // to the next turn than the old message is.
    let again = "March payslip overtime hours missing again";
    text(&app, phone, &format!("/reset {again}"), 2).await;
    text(&app, phone, again, 3).await;
    text(&app, phone, again, 4).await;
    indexed(&app, 8).await;
    text(&app, phone, again, 5).await;

    let prompt = app.runner.calls().last().unwrap().prompt.clone();
    let block = recall_block(&prompt).unwrap_or_default();
    assert!(
        block.contains(&format!("they wrote: {old}")),
        "the older message is recalled past the six held ones nearer to the query:\n{block}"
    );
    assert!(
        !block.contains("again"),
        "nothing the engine session holds is recalled:\n{block}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn fifty_people_with_near_identical_messages_each_recall_only_their_own() {
    let (app, _fake) = app_with_embeddings().await;
    let phone = |i: usize| format!("+1415555{:04}", 4000 + i);
    let people = 50;
    for i in 0..people {
        app.send_sms(
            &phone(i),
            &format!("my payslip code is P{i:02}x and it is wrong"),
        )
        .await;
    }
    app.wait_for_sms(people, WAIT).await;
    indexed(&app, 100).await;
    for i in 0..people {
        app.send_sms(&phone(i), "/reset my payslip code is wrong")
            .await;
    }
    app.wait_for_sms(2 * people, WAIT).await;

    let mut checked = 0;
    for call in app.runner.calls() {
        // The second turn of each (`/reset` is taken off the text the agent sees).
        if FakeRunner::said(&call.prompt) != "my payslip code is wrong" {
            continue;
        }
        let block = recall_block(&call.prompt).expect("a recall block");
        let person = switchboard_e2e::fakes::person_of(&call.prompt);
        let i: usize = person
            .trim_start_matches("phone:+1415555")
            .parse::<usize>()
            .unwrap()
            - 4000;
        let own = format!("P{i:02}x");
        assert!(
            block.contains(&own),
            "{person} recalls their own code:\n{block}"
        );
        let others: Vec<String> = (0..people)
            .filter(|j| *j != i)
            .map(|j| format!("P{j:02}x"))
            .filter(|code| block.contains(code.as_str()))
            .collect();
        assert!(
            others.is_empty(),
            "{person}'s recall carries {others:?}:\n{block}"
        );
        checked += 1;
    }
    assert_eq!(checked, people, "every person's second turn was checked");
    app.shutdown().await;
}

#[tokio::test]
async fn the_agents_silent_answer_to_the_flush_is_never_recalled_nor_summarised() {
    const FLUSH_ANSWER: &str =
        "Kept in memory.md: March payslip missing overtime hours, fix pending";
    let (app, _fake) = app_with(true).await;
    app.runner.answer_when(
        switchboard_dispatch::prompt::FLUSH_INSTRUCTION,
        FLUSH_ANSWER,
    );
    let phone = "+14155550303";
    text(
        &app,
        phone,
        "My March payslip is missing the overtime hours",
        1,
    )
    .await;
    // The reset runs the silent flush on the old engine session: its answer is logged.
    text(&app, phone, "/reset", 2).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let flushed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM switchboard.messages WHERE metadata->>'kind' = 'memory_flush'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if flushed == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the flush answer is logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both exchanges (the reset's reply too: a sent SMS may be logged after it is sent).
    indexed(&app, 4).await;

    text(
        &app,
        phone,
        "is the overtime on my March payslip fixed yet",
        3,
    )
    .await;
    let prompt = app.runner.calls().last().unwrap().prompt.clone();
    let block = recall_block(&prompt).expect("a recall block");
    assert!(
        block.contains("they wrote: My March payslip is missing the overtime hours"),
        "the person's message is recalled:\n{block}"
    );
    assert!(
        !block.contains("Kept in memory.md"),
        "the agent's silent flush answer (on the same matter) is not:\n{block}"
    );
    let entries = journal(&app, "recall").await;
    let last = entries.last().expect("a recall entry");
    assert_eq!(
        last["detail"]["messages_waiting"], 0,
        "the flush answer, never embedded, does not make the index look behind: {last}"
    );
    assert!(!block.contains("waiting"), "{block}");

    // The reset asked for a summary of what the old engine session heard: it has the
    // person's message, not the flush answer.
    let deadline = Instant::now() + WAIT;
    let summary: String = loop {
        let s: Option<String> = sqlx::query_scalar("SELECT summary FROM switchboard.summaries")
            .fetch_optional(&app.db)
            .await
            .unwrap();
        if let Some(s) = s.filter(|s| s.contains("payslip")) {
            break s;
        }
        assert!(Instant::now() < deadline, "no summary within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !summary.contains("Kept in memory.md"),
        "the flush answer is not summarised: {summary}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn twenty_people_recalled_at_once_each_see_only_their_own_topics() {
    let (app, _fake) = app_with_embeddings().await;
    let phone = |i: usize| format!("+1415555{:04}", 5000 + i);
    let people = 20;
    for i in 0..people {
        app.send_sms(&phone(i), &format!("question number {i} about my roster"))
            .await;
    }
    app.wait_for_sms(people, WAIT).await;
    // Each person's exchange labelled with a topic of their own.
    let deadline = Instant::now() + WAIT;
    loop {
        let labelled: i64 =
            sqlx::query_scalar("SELECT count(*) FROM switchboard.exchange_categories")
                .fetch_one(&app.db)
                .await
                .unwrap();
        if labelled == people as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "{labelled} exchanges labelled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sqlx::query(
        "UPDATE switchboard.exchange_categories
            SET label = 'topic_' || replace(person_id, 'phone:+1415555', '')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    for i in 0..people {
        app.send_sms(&phone(i), "and what about next week?").await;
    }
    app.wait_for_sms(2 * people, WAIT).await;
    let mut checked = 0;
    for call in app.runner.calls() {
        if FakeRunner::said(&call.prompt) != "and what about next week?" {
            continue;
        }
        let block = recall_block(&call.prompt).expect("a recall block");
        let person = switchboard_e2e::fakes::person_of(&call.prompt);
        let own = format!("topic_{}", person.trim_start_matches("phone:+1415555"));
        assert!(block.contains(&own), "{person} sees their topic:\n{block}");
        assert_eq!(
            block.matches("topic_").count(),
            1,
            "{person} sees another's topic:\n{block}"
        );
        checked += 1;
    }
    assert_eq!(checked, people, "every person's second turn was checked");
    app.shutdown().await;
}
