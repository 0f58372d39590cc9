//! An agent's workspace is untrusted input (issue 40): while its turn runs, the agent can put a
//! link to a file elsewhere on the host, a FIFO or a huge file where the dispatcher reads and
//! writes. None of it is followed, written through, waited on or read whole: what it points to
//! never reaches a prompt, and the file elsewhere is never changed.
use std::path::{Path, PathBuf};
use std::time::Duration;

use switchboard_e2e::{FakeRunner, TestApp, spawn_app_configured, twilio_sms_params};

const PERSON: &str = "+14155550188";
const WAIT: Duration = Duration::from_secs(20);

/// A temporary folder holding the workspace root and, outside it, a canary file of the host's.
struct Host {
    base: PathBuf,
    canary: PathBuf,
    secret: String,
}

impl Host {
    fn new() -> Self {
        let base = std::env::temp_dir().join(format!("sb-links-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&base).unwrap();
        let secret = format!("CANARY-{}", uuid::Uuid::new_v4().simple());
        let canary = base.join("host-secret.txt");
        std::fs::write(&canary, &secret).unwrap();
        Self {
            base,
            canary,
            secret,
        }
    }

    fn root(&self) -> String {
        self.base.join("workspaces").to_string_lossy().into_owned()
    }

    async fn app(&self) -> TestApp {
        let root = self.root();
        spawn_app_configured(move |c| {
            c.workspace.root = root;
            c.workspace.max_attachment_bytes = 1_000;
        })
        .await
    }

    fn canary_unchanged(&self) {
        assert_eq!(
            std::fs::read_to_string(&self.canary).unwrap(),
            self.secret,
            "the file outside the workspace was written"
        );
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// Have the agent run `plant(workspace)` during its turn when the person says `word`.
fn agent_plants(app: &TestApp, word: &'static str, plant: impl Fn(&Path) + Send + Sync + 'static) {
    app.runner.answer_with(move |call, _| {
        let said = FakeRunner::said(&call.prompt);
        if said.contains(word) {
            plant(Path::new(call.workspace.as_deref().expect("a workspace")));
        }
        format!("echo: {said}")
    });
}

async fn stored_memory(app: &TestApp) -> Option<String> {
    sqlx::query_scalar("SELECT body FROM switchboard.memories")
        .fetch_optional(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn memory_md_swapped_for_a_link_to_a_host_file_never_reaches_the_next_prompt() {
    let host = Host::new();
    let app = host.app().await;
    let canary = host.canary.clone();
    agent_plants(&app, "swap", move |ws| {
        std::fs::remove_file(ws.join("memory.md")).unwrap();
        std::os::unix::fs::symlink(&canary, ws.join("memory.md")).unwrap();
    });
    app.send_sms(PERSON, "swap your memory").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "what do you remember?").await;
    app.wait_for_sms(2, WAIT).await;

    let next = app.runner.calls().pop().unwrap();
    assert!(!next.prompt.contains(&host.secret), "{}", next.prompt);
    assert_eq!(
        stored_memory(&app).await,
        None,
        "nothing was kept as memory"
    );
    host.canary_unchanged();
    // The next turn put a file of its own where the link was.
    let ws = PathBuf::from(next.workspace.unwrap());
    assert!(
        std::fs::symlink_metadata(ws.join("memory.md"))
            .unwrap()
            .file_type()
            .is_file()
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_planted_temporary_name_is_never_written_through() {
    let host = Host::new();
    let app = host.app().await;
    let canary = host.canary.clone();
    agent_plants(&app, "plant", move |ws| {
        // memory.md gone, so the next turn writes it again, through whatever temporary name.
        std::fs::remove_file(ws.join("memory.md")).unwrap();
        for name in [".memory.md.tmp", ".summary.md.tmp", ".memory.md.part"] {
            std::os::unix::fs::symlink(&canary, ws.join(name)).unwrap();
        }
    });
    app.send_sms(PERSON, "plant the links").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "and now?").await;
    app.wait_for_sms(2, WAIT).await;

    host.canary_unchanged();
    let ws = PathBuf::from(app.runner.calls().pop().unwrap().workspace.unwrap());
    assert!(
        std::fs::symlink_metadata(ws.join("memory.md"))
            .unwrap()
            .file_type()
            .is_file(),
        "memory.md is a file of its own, not the planted link"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn memory_md_made_a_fifo_does_not_hang_the_turn() {
    let host = Host::new();
    let app = host.app().await;
    agent_plants(&app, "fifo", |ws| {
        std::fs::remove_file(ws.join("memory.md")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(ws.join("memory.md"))
            .status()
            .unwrap();
        assert!(made.success());
    });
    app.send_sms(PERSON, "fifo time").await;
    // Answered (the FIFO is refused, not waited on), and so is the next turn.
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "still there?").await;
    app.wait_for_sms(2, WAIT).await;
    assert_eq!(stored_memory(&app).await, None);
    app.shutdown().await;
}

#[tokio::test]
async fn a_huge_memory_md_is_refused_not_read() {
    let host = Host::new();
    let app = host.app().await;
    agent_plants(&app, "huge", |ws| {
        let file = std::fs::File::create(ws.join("memory.md")).unwrap();
        file.set_len(1 << 30).unwrap(); // 1 GB of zeros, sparse
    });
    app.send_sms(PERSON, "huge memory").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "and?").await;
    app.wait_for_sms(2, WAIT).await;
    assert_eq!(stored_memory(&app).await, None, "the file was not read");
    let next = app.runner.calls().pop().unwrap();
    assert!(!next.prompt.contains('\0'));
    app.shutdown().await;
}

#[tokio::test]
async fn attachments_swapped_for_a_link_to_a_host_folder_get_nothing_written_there() {
    let host = Host::new();
    let app = host.app().await;
    let elsewhere = host.base.join("host-folder");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let target = elsewhere.clone();
    agent_plants(&app, "swap", move |ws| {
        std::fs::remove_dir_all(ws.join("attachments")).unwrap();
        std::os::unix::fs::symlink(&target, ws.join("attachments")).unwrap();
    });
    app.send_sms(PERSON, "swap attachments").await;
    app.wait_for_sms(1, WAIT).await;

    let picture = app.twilio.add_media("image/jpeg", vec![9u8; 100]);
    let mut params = twilio_sms_params(&app.twilio.account_sid, PERSON, "a picture", "SMlink1");
    params.retain(|(k, _)| k != "NumMedia");
    params.extend([
        ("NumMedia".to_string(), "1".to_string()),
        ("MediaUrl0".to_string(), picture),
        ("MediaContentType0".to_string(), "image/jpeg".to_string()),
    ]);
    let signature = app.sign(&params);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();
    assert_eq!(app.post_twilio(body, Some(&signature)).await.status(), 200);
    app.wait_for_sms(2, WAIT).await;

    let written: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(
        written.is_empty(),
        "written outside the workspace: {written:?}"
    );
    let prompt = app.runner.calls().pop().unwrap().prompt;
    assert!(
        prompt.contains("an attachment that could not be kept"),
        "{prompt}"
    );
    app.shutdown().await;
}
