//! `switchboard people import people.csv`, as an operator runs it: the directory filled from a
//! file, a report of what happened to every row, and the imported people recognised when they
//! text.
use std::time::Duration;

use switchboard_e2e::{FakeRunner, spawn_app};

const WAIT: Duration = Duration::from_secs(20);

async fn import(app: &switchboard_e2e::TestApp, csv: &str) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("{}-people.csv", uuid::Uuid::new_v4()));
    std::fs::write(&path, csv).unwrap();
    let out = app
        .cli(&["people".as_ref(), "import".as_ref(), path.as_os_str()])
        .await;
    let _ = std::fs::remove_file(&path);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn an_imported_directory_is_reported_row_by_row_and_recognises_who_texts() {
    let app = spawn_app().await;
    let (ok, report) = import(
        &app,
        "person_id,person_type,name,role,phone,email\n\
         staff-17,staff,Dana Smith,admin,(415) 555-0117,dana@example.com\n\
         part-3,participant,Sam Lee,,+1 415 555 0103,\n\
         part-4,participant,Kim,,not a number,\n",
    )
    .await;
    assert!(
        !ok,
        "a refused row makes the import exit non-zero:\n{report}"
    );
    assert!(
        report.contains("2 added, 0 updated, 0 unchanged, 1 refused"),
        "{report}"
    );
    assert!(report.contains("line 4: phone"), "{report}");

    // The imported staff member texts: the agent is told who they are.
    app.send_sms("+14155550117", "hi, it's Dana").await;
    app.wait_for_sms(1, WAIT).await;
    let calls = app.runner.calls();
    assert_eq!(FakeRunner::said(&calls[0].prompt), "hi, it's Dana");
    assert!(
        calls[0].prompt.contains("Dana Smith"),
        "{}",
        calls[0].prompt
    );
    assert!(calls[0].prompt.contains("staff-17"), "{}", calls[0].prompt);

    // Importing again: a changed name is an update, the rest unchanged; a phone that belongs
    // to someone else is refused, never moved.
    let (ok, report) = import(
        &app,
        "person_id,person_type,name,role,phone\n\
         staff-17,staff,Dana Smith-Jones,admin,\n\
         part-3,participant,Sam Lee,,+14155550103\n\
         part-9,participant,Mallory,,+14155550117\n",
    )
    .await;
    assert!(!ok);
    assert!(
        report.contains("0 added, 1 updated, 1 unchanged, 1 refused"),
        "{report}"
    );
    assert!(
        report.contains("line 4: phone +14155550117 already belongs to staff-17"),
        "{report}"
    );
    let owner: String = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.contact_points WHERE address = '+14155550117'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(owner, "staff-17");
    let mallory: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.people WHERE person_id = 'part-9'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(mallory, 0, "a refused row writes nothing");
    app.shutdown().await;
}

/// The same import and a link, as a script reads them: `--json`.
#[tokio::test]
async fn a_script_reads_the_import_report_and_the_links_as_json() {
    let app = spawn_app().await;
    let path = std::env::temp_dir().join(format!("{}-people.csv", uuid::Uuid::new_v4()));
    std::fs::write(
        &path,
        "person_id,person_type,name,phone\n\
         staff-21,staff,Dana,+14155550121\n\
         part-22,participant,Sam,not a number\n",
    )
    .unwrap();
    let out = app
        .cli(&[
            "people".as_ref(),
            "import".as_ref(),
            path.as_os_str(),
            "--json".as_ref(),
        ])
        .await;
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(1), "a refused row still exits 1");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["added"], 1);
    assert_eq!(report["refused"][0]["line"], 3);
    assert!(
        report["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("phone"),
        "{report}"
    );

    let cli_json = async |args: &[&str]| app.cli_json(args).await;
    let link = [
        "people",
        "link",
        "phone:+14155550199",
        "staff-21",
        "--reason",
        "new phone",
        "--by",
        "ops",
        "--json",
    ];
    let linked = cli_json(&link).await;
    assert_eq!(linked["changed"], true, "{linked}");
    assert_eq!(linked["entry"]["actor"], "ops");
    let again = cli_json(&link).await;
    assert_eq!(again["changed"], false, "already so: {again}");
    let listing = cli_json(&["people", "links", "--person", "staff-21", "--json"]).await;
    assert_eq!(listing["links"].as_array().unwrap().len(), 1, "{listing}");
    assert_eq!(listing["audit"].as_array().unwrap().len(), 1, "{listing}");
    app.shutdown().await;
}
