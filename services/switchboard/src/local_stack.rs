//! The CLI next to the embedded stack: with `make run` up, `switchboard <verb>` in a second
//! terminal finds the stack's credentials by itself (its `.stack/run/credentials/env`, in this
//! folder or one above), as long as the configuration still names the default local servers.
//! A configuration that names other servers, or `SB_NATS_URL`/`SB_DATABASE_URL`, is never
//! overridden.
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
        match key {
            "SB_NATS_URL" => config.nats_url = SecretUrl::new(value),
            "SB_DATABASE_URL" => config.database_url = SecretUrl::new(value),
            _ => continue,
        }
        found = true;
    }
    if found && config.readers.local_stack.is_none() {
        // `<stack>/credentials/env`: the readers' users go into that stack's NATS config.
        config.readers.local_stack = env.parent().and_then(Path::parent).map(Path::to_path_buf);
    }
    found.then_some(env)
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

        let mut elsewhere = Config {
            database_url: SecretUrl::new("postgres://prod/switchboard"),
            ..Config::default()
        };
        assert_eq!(use_local_stack(&mut elsewhere, &root), None);
        assert_eq!(&*elsewhere.database_url, "postgres://prod/switchboard");
        let _ = std::fs::remove_dir_all(&root);
    }
}
