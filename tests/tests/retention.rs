//! Retention: the identify worker's sweep deletes the API requests, mailbox entries and link
//! claims older than `[retention]` keeps them, and leaves newer ones and those something still
//! waits for; an API request whose message never went in is marked expired.
use std::time::{Duration, Instant};

use switchboard_e2e::{TestApp, spawn_app_configured};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(20);

async fn api_request(app: &TestApp, age: &str) -> String {
    let id = Uuid::now_v7().to_string();
    sqlx::query(
        "INSERT INTO switchboard.api_requests (correlation_id, owner, agent, created_at)
         VALUES ($1, 'crm', 'reggie_oc', now() - $2::interval)",
    )
    .bind(&id)
    .bind(age)
    .execute(&app.db)
    .await
    .unwrap();
    id
}

async fn mailbox_entry(app: &TestApp, age: &str, pushed: bool) -> Uuid {
    let reply = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO switchboard.mailbox
             (reply_id, part, channel, address, agent, correlation_id, text, created_at, pushed_at)
         VALUES ($1, 0, 'admin_chat', 'ana', 'reggie_oc', 'c-1', 'hello',
                 now() - $2::interval, CASE WHEN $3 THEN now() - $2::interval END)",
    )
    .bind(reply)
    .bind(age)
    .bind(pushed)
    .execute(&app.db)
    .await
    .unwrap();
    reply
}

/// A link claim asked for `age` ago, `status`, whose code works until `expires_in` from now
/// (negative: expired), with the answer to the message that asked for it.
async fn link_claim(app: &TestApp, age: &str, status: &str, expires_in: &str) -> Uuid {
    let (claim, message) = (Uuid::now_v7(), Uuid::now_v7());
    // One statement: the sweep (every second) must never see the claim without its answer.
    sqlx::query(
        "WITH claim AS (
             INSERT INTO switchboard.link_claims
                 (id, requested_by, claimant_id, phone, code, status, created_at, expires_at)
             VALUES ($1, $2, 'user:ana', '+14155550199', '123456', $3, now() - $4::interval,
                     now() + $5::interval)
             RETURNING id)
         INSERT INTO switchboard.link_proof_answers (message_id, claim_id, outcome, answer, at)
         SELECT $2, id, 'code_sent', 'I sent a code', now() - $4::interval FROM claim",
    )
    .bind(claim)
    .bind(message)
    .bind(status)
    .bind(age)
    .bind(expires_in)
    .execute(&app.db)
    .await
    .unwrap();
    claim
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&app.db).await.unwrap()
}

#[tokio::test]
async fn the_sweep_deletes_what_is_past_its_retention_and_keeps_the_rest() {
    let app = spawn_app_configured(|c| c.retention.sweep_every_s = 1).await;
    // Gone after the sweep.
    let old_request = api_request(&app, "8 days").await;
    let old_pushed = mailbox_entry(&app, "8 days", true).await;
    let old_unpushed = mailbox_entry(&app, "31 days", false).await;
    let old_claim = link_claim(&app, "31 days", "linked", "-31 days").await;
    // Kept.
    let day_old_request = api_request(&app, "1 day").await;
    let fresh_request = api_request(&app, "1 minute").await;
    let unpushed = mailbox_entry(&app, "8 days", false).await;
    let pushed = mailbox_entry(&app, "1 day", true).await;
    let settled = link_claim(&app, "1 day", "superseded", "-1 day").await;
    // A claim whose code still works is waited for, however old (here by hand).
    let waiting = link_claim(&app, "31 days", "pending", "5 minutes").await;

    let deadline = Instant::now() + WAIT;
    loop {
        let left = count(
            &app,
            &format!(
                "SELECT (SELECT count(*) FROM switchboard.api_requests
                          WHERE correlation_id = '{old_request}')
                      + (SELECT count(*) FROM switchboard.mailbox
                          WHERE reply_id IN ('{old_pushed}', '{old_unpushed}'))
                      + (SELECT count(*) FROM switchboard.link_claims WHERE id = '{old_claim}')"
            ),
        )
        .await;
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} old rows left");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Another sweep or two, to see the rest stays.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let requests: Vec<(String, bool)> = sqlx::query_as(
        "SELECT correlation_id, expired_at IS NOT NULL FROM switchboard.api_requests
          ORDER BY created_at",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        requests,
        [
            // No turn a day after it was accepted (refused, its row left behind): it is over.
            (day_old_request, true),
            (fresh_request, false),
        ]
    );
    // Its caller reads that it is over, not `pending` forever.
    let key = app.api_key("crm", &[]).await;
    let status: serde_json::Value = app
        .get_api_message(&key, &requests[0].0)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "expired", "{status}");
    let status: serde_json::Value = app
        .get_api_message(&key, &requests[1].0)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "pending", "{status}");
    let mailbox: Vec<Uuid> =
        sqlx::query_scalar("SELECT reply_id FROM switchboard.mailbox ORDER BY created_at")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(mailbox, [unpushed, pushed]);
    let claims: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM switchboard.link_claims ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    let mut kept = vec![settled, waiting];
    kept.sort();
    assert_eq!(claims, kept);
    assert_eq!(
        count(&app, "SELECT count(*) FROM switchboard.link_proof_answers").await,
        2,
        "the answers of the kept claims stay"
    );
    assert!(
        app.metrics()
            .await
            .contains("sb_retention_rows_total{table=\"mailbox\"} 2")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_retention_of_zero_keeps_rows_forever() {
    let app = spawn_app_configured(|c| {
        c.retention.sweep_every_s = 1;
        c.retention.api_requests_days = 0;
        c.retention.api_pending_expiry_s = 0;
        c.retention.mailbox_days = 0;
        c.retention.mailbox_unpushed_days = 0;
        c.retention.link_claims_days = 0;
    })
    .await;
    api_request(&app, "400 days").await;
    mailbox_entry(&app, "400 days", true).await;
    mailbox_entry(&app, "400 days", false).await;
    link_claim(&app, "400 days", "linked", "-400 days").await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        count(
            &app,
            "SELECT (SELECT count(*) FROM switchboard.api_requests WHERE expired_at IS NULL)
                  + (SELECT count(*) FROM switchboard.mailbox)
                  + (SELECT count(*) FROM switchboard.link_claims)",
        )
        .await,
        4
    );
    app.shutdown().await;
}
