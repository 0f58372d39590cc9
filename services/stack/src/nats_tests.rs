//! nats.conf as the former deploy/local/stack.sh wrote it (testdata/, made by that script, in
//! git history, for the same inputs; only the two lines naming the tool differ), and the prefix
//! checks.
use std::path::Path;

use super::*;

fn creds() -> Credentials {
    Credentials::for_tests()
}

fn conf(prefixes: &str, analytics: &str) -> Result<String> {
    let c = creds();
    render_conf(&ConfInput {
        name: "demo",
        nats_port: 26222,
        monitor_port: 27222,
        pid_file: Path::new("/tmp/stk-golden/root/demo/nats/nats.pid"),
        store_dir: Path::new("/tmp/stk-golden/root/demo/nats"),
        cred_dir: Path::new("/tmp/stk-golden/root/demo/credentials"),
        credentials: &c,
        fingerprint: "7414a4096979d9136b599addda4053f8",
        prefixes,
        analytics,
    })
}

#[test]
fn the_config_is_the_scripts() {
    assert_eq!(
        conf("", "").unwrap(),
        include_str!("testdata/nats-default.conf")
    );
    assert_eq!(
        conf("sb t1", "my-pfx").unwrap(),
        include_str!("testdata/nats-prefixes.conf")
    );
}

#[test]
fn the_settings_line_names_credentials_prefixes_and_permissions() {
    assert_eq!(
        settings_line("f00", "", ""),
        "# settings: credentials f00, prefixes *, analytics sb, permissions v2"
    );
    assert_eq!(
        settings_line("f00", "sb  t1", "x"),
        "# settings: credentials f00, prefixes sb  t1, analytics x, permissions v2"
    );
    assert!(
        conf("", "")
            .unwrap()
            .lines()
            .any(|l| l == settings_line("7414a4096979d9136b599addda4053f8", "", ""))
    );
}

#[test]
fn prefixes_must_be_subject_tokens() {
    check_prefixes("sb", "sb").unwrap();
    check_prefixes("* t_1 a-b", "").unwrap();
    let e = check_prefixes("sb a.b", "").unwrap_err().to_string();
    assert_eq!(
        e,
        "SB_STACK_NATS_PREFIXES: 'a.b' is not a subject token (or '*')"
    );
    assert!(check_prefixes("  ", "").is_err(), "only spaces");
    let e = check_prefixes("", "*").unwrap_err().to_string();
    assert_eq!(e, "SB_STACK_ANALYTICS_PREFIX: '*' is not a subject token");
    assert!(conf("sb>", "").is_err());
}
