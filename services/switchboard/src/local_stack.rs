//! The CLI next to the embedded stack: with `make run` up, `switchboard <verb>` in a second
//! terminal finds the stack's credentials by itself (its `.stack/run/credentials/env`, in this
//! folder or one above), as long as the configuration still names the default local servers,
//! and the local embedder's files the stack fetched (so `switchboard search` ranks by meaning
//! there too). A configuration that names other servers, or `SB_NATS_URL`/`SB_DATABASE_URL`,
//! is never overridden.
//!
//! The other way round, with the stack's variables in the environment (`eval "$(stack env
//! run)"`), the CLI is on the same stack as before: `SB_STACK_CREDENTIALS_DIR` names it, and
//! `switchboard readers add` configures its NATS server as it does without them.
use std::path::{Path, PathBuf};

use switchboard_kit::Config;
use switchboard_kit::config::SecretUrl;

/// The credentials file `make run`'s stack writes, below a checkout's root.
const RUN_STACK_ENV: &str = ".stack/run/credentials/env";

/// Take the embedded stack's URLs when `config` names the default local servers without
/// credentials; the file they came from.
pub fn use_local_stack(config: &mut Config, from: &Path) -> Option<PathBuf> {
    let defaults = Config::default();
    if *config.nats_url != *defaults.nats_url || *config.database_url != *defaults.database_url {
        stack_of_environment(config, std::env::var_os(STACK_DIR_VAR).map(PathBuf::from));
        return None;
    }
    let env = from
        .ancestors()
        .map(|d| d.join(RUN_STACK_ENV))
        .find(|p| p.is_file())?;
    let text = std::fs::read_to_string(&env).ok()?;
    let mut found = false;
    for line in text.lines() {
        let Some((key, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('='))
        else {
            continue;
        };
        // The stack quotes paths with single quotes; its URLs need none.
        let value = value
            .strip_prefix('\'')
            .and_then(|v| v.strip_suffix('\''))
            .unwrap_or(value);
        let embedding = &mut config.embedding;
        let unset = |field: &mut String| {
            if field.is_empty() {
                *field = value.to_string();
            }
        };
        match key {
            "SB_NATS_URL" => config.nats_url = SecretUrl::new(value),
            "SB_DATABASE_URL" => config.database_url = SecretUrl::new(value),
            // The embedder's files, unless the configuration names its own.
            "SB_EMBEDDING__MODEL_DIR" => unset(&mut embedding.model_dir),
            "SB_EMBEDDING__ONNX_RUNTIME" => unset(&mut embedding.onnx_runtime),
            "SB_EMBEDDING__ONNX_MODEL" => unset(&mut embedding.onnx_model),
            "SB_EMBEDDING__STATIC_DIR" => unset(&mut embedding.static_dir),
            _ => continue,
        }
        found |= key.ends_with("_URL");
    }
    if found && config.readers.local_stack.is_none() {
        // `<stack>/credentials/env`: the readers' users go into that stack's NATS config.
        config.readers.local_stack = env.parent().and_then(Path::parent).map(Path::to_path_buf);
    }
    found.then_some(env)
}

/// What `stack env` exports besides the URLs: the stack's credentials folder.
const STACK_DIR_VAR: &str = "SB_STACK_CREDENTIALS_DIR";

/// With the stack's variables in the environment: the readers' users go into that stack's
/// NATS configuration, as without them; only when the configuration's URLs are that stack's
/// (its `env` file says so) and it names no stack of its own.
fn stack_of_environment(config: &mut Config, credentials: Option<PathBuf>) {
    let Some(credentials) = credentials else {
        return;
    };
    if config.readers.local_stack.is_some() {
        return;
    }
    let Ok(text) = std::fs::read_to_string(credentials.join("env")) else {
        return;
    };
    let names = |key: &str, url: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .any(|(k, v)| k == key && v.trim_matches('\'') == url)
    };
    if names("SB_NATS_URL", &config.nats_url) && names("SB_DATABASE_URL", &config.database_url) {
        config.readers.local_stack = credentials.parent().map(Path::to_path_buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_configuration_takes_the_run_stacks_urls_and_any_other_keeps_its_own() {
        let root = std::env::temp_dir().join(format!("sb-ls-{}", uuid::Uuid::new_v4().simple()));
        let creds = root.join(".stack/run/credentials");
        std::fs::create_dir_all(&creds).unwrap();
        std::fs::create_dir_all(root.join("deep/er")).unwrap();
        std::fs::write(
            creds.join("env"),
            "export SB_EMBEDDING__MODEL_DIR='/m'\nexport SB_NATS_URL=nats://u:p@127.0.0.1:14222\n\
             export SB_DATABASE_URL=postgres://u:q@127.0.0.1:15432/switchboard\n",
        )
        .unwrap();

        let mut config = Config::default();
        let used = use_local_stack(&mut config, &root.join("deep/er"));
        assert_eq!(used, Some(creds.join("env")));
        assert_eq!(&*config.nats_url, "nats://u:p@127.0.0.1:14222");
        assert_eq!(
            &*config.database_url,
            "postgres://u:q@127.0.0.1:15432/switchboard"
        );

        // The embedder's files come along, unless the configuration names its own.
        assert_eq!(config.embedding.model_dir, "/m");
        let mut own = Config::default();
        own.embedding.model_dir = "/mine".into();
        use_local_stack(&mut own, &root);
        assert_eq!(own.embedding.model_dir, "/mine");

        // With the stack's variables eval'd: the same stack's readers.
        let mut evald = Config {
            nats_url: SecretUrl::new("nats://u:p@127.0.0.1:14222"),
            database_url: SecretUrl::new("postgres://u:q@127.0.0.1:15432/switchboard"),
            ..Config::default()
        };
        stack_of_environment(&mut evald, Some(creds.clone()));
        assert_eq!(evald.readers.local_stack, Some(root.join(".stack/run")));

        let mut elsewhere = Config {
            database_url: SecretUrl::new("postgres://prod/switchboard"),
            ..Config::default()
        };
        assert_eq!(use_local_stack(&mut elsewhere, &root), None);
        assert_eq!(&*elsewhere.database_url, "postgres://prod/switchboard");
        stack_of_environment(&mut elsewhere, Some(creds.clone()));
        assert_eq!(
            elsewhere.readers.local_stack, None,
            "another server's configuration is not the stack's"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
