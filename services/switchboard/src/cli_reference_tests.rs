//! docs/cli.md and the command agree: every verb the binary has is documented under a heading
//! of its own, and every verb the page documents exists.
use std::collections::BTreeSet;

use clap::CommandFactory as _;

use crate::Cli;

/// Every runnable verb, as a user types it (`dlq replay`): the leaves of the command tree.
fn verbs(cmd: &clap::Command, path: &str, out: &mut BTreeSet<String>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let here = if path.is_empty() {
            sub.get_name().to_string()
        } else {
            format!("{path} {}", sub.get_name())
        };
        if sub.has_subcommands() {
            verbs(sub, &here, out);
        } else {
            out.insert(here);
        }
    }
}

#[test]
fn the_cli_reference_documents_every_verb_and_only_real_ones() {
    let page = include_str!("../../../docs/cli.md");
    let documented: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("### `switchboard "))
        .filter_map(|l| l.strip_suffix('`'))
        .map(str::to_string)
        .collect();
    let mut real = BTreeSet::new();
    verbs(&Cli::command(), "", &mut real);
    let missing: Vec<_> = real.difference(&documented).collect();
    let invented: Vec<_> = documented.difference(&real).collect();
    assert!(
        missing.is_empty(),
        "verbs docs/cli.md does not document: {missing:?}"
    );
    assert!(
        invented.is_empty(),
        "docs/cli.md documents verbs that do not exist: {invented:?}"
    );
    assert!(real.len() > 30, "{real:?}");
}
