//! Headless Chromium (Debian's `chromium`) driven over WebDriver (Debian's `chromedriver`), for
//! the tests of what people see in a browser: the chat widget and the ops console. `make test`
//! installs both packages (deploy/local/browser.sh). Screenshots go to
//! `target/screenshots/<test>/`, named in the order taken.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::process::{Child, Command};

/// How long a page may take to show what a test waits for.
pub const PAGE_WAIT: Duration = Duration::from_secs(20);

pub struct Browser {
    pub client: Client,
    _driver: Child,
    shots: PathBuf,
    taken: AtomicUsize,
    _profile: TempDir,
}

/// A folder removed when dropped (the browser's profile).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn find(program: &str, debian: &str) -> PathBuf {
    if Path::new(debian).is_file() {
        return PathBuf::from(debian);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{program} is not installed: `make test` installs Debian's chromium and \
                 chromium-driver (deploy/local/browser.sh install)"
            )
        })
}

impl Browser {
    /// A fresh headless Chromium with an empty profile; screenshots under `test`'s folder.
    pub async fn start(test: &str) -> Browser {
        let chromedriver = find("chromedriver", "/usr/bin/chromedriver");
        let chromium = find("chromium", "/usr/bin/chromium");
        let port = switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(15);
        while reqwest::get(format!("{url}/status")).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = TempDir(
            std::env::temp_dir().join(format!("sb-chromium-{}", uuid::Uuid::new_v4().simple())),
        );
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Root (CI) cannot use Chromium's sandbox.
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    // DevTools over a pipe: no listening port (every port stays below 32768).
                    "--remote-debugging-pipe",
                    "--window-size=1280,900",
                    // This machine's network is closed: Chromium's own background traffic
                    // (updates, sync, first-run, QUIC probes) only fails, many at a time.
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-quic",
                    format!("--user-data-dir={}", profile.0.display()),
                ],
            }),
        );
        // Chromium once exited at start while the whole suite loaded both cores (a full run's
        // widget test; alone it passed): a session is asked for twice before the test fails.
        let session = async || {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
        };
        let client = match session().await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("no Chromium session yet ({e}); asking again");
                session().await.expect("a Chromium session")
            }
        };
        let shots = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/screenshots")
            .join(test);
        let _ = std::fs::remove_dir_all(&shots);
        std::fs::create_dir_all(&shots).expect("the screenshots folder");
        Browser {
            client,
            _driver: driver,
            shots,
            taken: AtomicUsize::new(0),
            _profile: profile,
        }
    }

    /// Save what the page shows now as `<n>-<name>.png`; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let n = self.taken.fetch_add(1, Ordering::SeqCst) + 1;
        let path = self.shots.join(format!("{n:02}-{name}.png"));
        std::fs::write(&path, png).expect("save the screenshot");
        path
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("open the page");
    }

    /// The first element matching `css`, waiting for it.
    pub async fn element(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(PAGE_WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
    }

    /// Click the first element matching `css`, once it is there.
    pub async fn click(&self, css: &str) {
        self.element(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Type `text` into the first element matching `css` (`\n` is Enter).
    pub async fn type_into(&self, css: &str, text: &str) {
        self.element(css)
            .await
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// The texts of every element matching `css`, once `done` holds for them (a screenshot
    /// `timeout-<what>` and a panic if it never does).
    pub async fn texts_until(
        &self,
        css: &str,
        what: &str,
        done: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let mut texts = Vec::new();
            for e in self
                .client
                .find_all(Locator::Css(css))
                .await
                .unwrap_or_default()
            {
                texts.push(e.text().await.unwrap_or_default());
            }
            if done(&texts) {
                return texts;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot(&format!("timeout-{what}")).await;
                panic!(
                    "{what}: {css} shows {texts:?} (screenshot {})",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An attribute of the first element matching `css`, once `done` holds for it.
    pub async fn attr_until(
        &self,
        css: &str,
        attr: &str,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let value = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.attr(attr).await.ok().flatten().unwrap_or_default(),
                Err(_) => String::new(),
            };
            if done(&value) {
                return value;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot(&format!("timeout-{what}")).await;
                panic!(
                    "{what}: {css} [{attr}] is {value:?} (screenshot {})",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
