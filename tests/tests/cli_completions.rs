//! `switchboard completions <shell>`: a script the shell itself completes with, from any folder
//! and with no configuration (tried in bash, as a user's shell would load it).
use std::process::Command;

use switchboard_e2e::switchboard_bin;

/// What bash offers after `line` (the words so far), with the script loaded.
fn bash_completes(line: &str) -> Vec<String> {
    let empty = std::env::temp_dir().join(format!("sb-compl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&empty).unwrap();
    let script = format!(
        r#"source <("$SB_BIN" completions bash) || exit 9
COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}
read -ra COMP_WORDS <<< "$COMP_LINE"
[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_switchboard switchboard "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#
    );
    let mut cmd = Command::new("bash");
    cmd.args(["--norc", "-c", &script])
        .env("SB_BIN", switchboard_bin())
        .current_dir(&empty);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SB_") && k != "SB_BIN" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_the_verbs_and_their_subcommands() {
    let verbs = bash_completes("switchboard st");
    assert!(verbs.contains(&"status".to_string()), "{verbs:?}");
    assert!(verbs.contains(&"stages".to_string()), "{verbs:?}");
    assert!(verbs.contains(&"streams".to_string()), "{verbs:?}");
    let dlq = bash_completes("switchboard dlq ");
    assert!(
        dlq.contains(&"list".to_string()) && dlq.contains(&"replay".to_string()),
        "{dlq:?}"
    );
    let flags = bash_completes("switchboard status --");
    assert!(flags.contains(&"--json".to_string()), "{flags:?}");
}

#[test]
fn every_shell_gets_a_script_and_an_unknown_one_is_refused() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(switchboard_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("forget") && script.contains("status"),
            "{shell}"
        );
    }
    let out = Command::new(switchboard_bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
