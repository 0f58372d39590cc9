//! A stage added the way `docs/adding-a-stage.md` says, one module and one line, runs in the
//! product beside its stages: its consumer is made with the topology, it sees the pipeline's
//! events, its outcomes are on `/metrics`, and what it cannot read goes to its dead letters with
//! the reason. The runtime does all of that; the stage is a plain handler.
use std::time::{Duration, Instant};

use switchboard_e2e::{AppOptions, spawn_app_with};

/// The module a new stage is: a handler from an event to outputs, and its registration.
mod toy {
    use std::sync::Mutex;

    use switchboard_kit::proto::MessageLogged;
    use switchboard_kit::startup::App;
    use switchboard_kit::{Attempt, Outcome, Registration, Source, Stage, StageSpec};

    /// What it saw: (person, direction) of each logged message.
    pub static SEEN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

    /// Follows the message log's public events, as an analytics stage would.
    pub struct CountMessages;

    impl Stage for CountMessages {
        type Input = MessageLogged;
        const SPEC: StageSpec = StageSpec::new("toy-count", Source::Events("message.logged"));

        async fn handle(&self, event: MessageLogged, _attempt: &Attempt) -> Outcome {
            SEEN.lock()
                .unwrap()
                .push((event.person_id, event.direction));
            Ok(vec![])
        }
    }

    /// The stage as the product lists it.
    pub const STAGE: Registration = Registration {
        spec: CountMessages::SPEC,
        worker: "toy",
        start: |app: &App| app.stage_task(CountMessages),
    };
}

#[tokio::test]
async fn a_stage_added_by_one_module_and_one_line_sees_every_logged_message_of_a_person() {
    // The one line: the product's stages and this one.
    let app = spawn_app_with(AppOptions::default().with_stage(toy::STAGE)).await;
    let person = "+14155550177";
    let resp = app.send_sms(person, "hello toy").await;
    assert_eq!(resp.status(), 200);

    let deadline = Instant::now() + Duration::from_secs(20);
    let mine = || {
        let mut seen: Vec<String> = toy::SEEN
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == &format!("phone:{person}"))
            .map(|(_, d)| d.clone())
            .collect();
        seen.sort();
        seen
    };
    while mine().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        mine(),
        ["inbound", "outbound"],
        "the toy stage saw the person's message and the agent's reply, once each"
    );
    let metrics = app.metrics().await;
    let handled_ok = metrics
        .lines()
        .filter(|l| l.starts_with("sb_stage_messages_total{"))
        .find(|l| l.contains("stage=\"toy-count\"") && l.contains("outcome=\"ok\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(
        handled_ok.is_some_and(|n| n >= 2.0),
        "the runtime counts the toy stage's outcomes like any other's: {handled_ok:?}"
    );
}

/// Every file outside a stage's crate that names it, for a stage nothing else uses (the
/// categoriser and the summariser): this page must name each, so a newcomer touches them all.
#[test]
fn the_guide_names_every_file_a_new_stage_touches() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let guide = std::fs::read_to_string(repo.join("docs/adding-a-stage.md")).unwrap();
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "toml") {
                out.push(path);
            }
        }
    }
    let mut files = vec![repo.join("Cargo.toml")];
    walk(&repo.join("services"), &mut files);
    for stage in ["categorise", "summary"] {
        let (dash, snake) = (
            format!("switchboard-{stage}"),
            format!("switchboard_{stage}"),
        );
        let own = repo.join("services").join(stage);
        let touched: Vec<String> = files
            .iter()
            .filter(|f| !f.starts_with(&own))
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                text.contains(&dash) || text.contains(&snake)
            })
            .map(|f| {
                f.strip_prefix(&repo)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert!(touched.len() >= 3, "{stage}: {touched:?}");
        for file in &touched {
            assert!(
                guide.contains(&format!("`{file}`")),
                "docs/adding-a-stage.md does not name {file}, which the {stage} stage touches"
            );
        }
    }
}
