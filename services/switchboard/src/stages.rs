//! Every stage of the product, in data-path order. Adding a stage is one crate and one line
//! here (see `docs/adding-a-stage.md`): `streams apply`, `switchboard up`, `switchboard worker`,
//! `[stages.<name>]` and the metrics all loop over this list.
use switchboard_kit::Registration;
use switchboard_kit::startup::{App, Task};

pub const ALL: &[Registration] = &[
    switchboard_identify::STAGE,
    switchboard_session::STAGE,
    switchboard_dispatch::STAGE,
    switchboard_log::INBOUND,
    switchboard_log::OUTBOUND,
    switchboard_deliver::STAGE,
    switchboard_embed::STAGE,
    switchboard_categorise::STAGE,
    switchboard_escalate::STAGE,
    switchboard_summary::STAGE,
    switchboard_forget::STAGE,
];

/// The registration of the stage called `name`.
pub fn by_name(name: &str) -> Option<&'static Registration> {
    ALL.iter().find(|r| r.spec.name == name)
}

/// The stages `names` stand for: each a stage name or a worker name (`log` is `log-inbound` and
/// `log-outbound`), in list order, each once.
pub fn select(names: &[impl AsRef<str>]) -> Result<Vec<&'static Registration>, UnknownStage> {
    select_from(ALL, names)
}

/// [`select`] over `stages` (the product's list, or one a test made longer).
pub fn select_from<'a>(
    stages: &'a [Registration],
    names: &[impl AsRef<str>],
) -> Result<Vec<&'a Registration>, UnknownStage> {
    let stands_for = |r: &Registration, n: &str| r.spec.name == n || r.worker == n;
    if let Some(unknown) = names
        .iter()
        .map(AsRef::as_ref)
        .find(|n| !stages.iter().any(|r| stands_for(r, n)))
    {
        return Err(UnknownStage(unknown.to_string()));
    }
    Ok(stages
        .iter()
        .filter(|r| names.iter().any(|n| stands_for(r, n.as_ref())))
        .collect())
}

#[derive(Debug, thiserror::Error)]
#[error("no stage or worker is called {0:?} (stages: {list})", list = names().join(", "))]
pub struct UnknownStage(pub String);

/// Every stage's name, in list order.
pub fn names() -> Vec<&'static str> {
    ALL.iter().map(|r| r.spec.name).collect()
}

/// The tasks running `stages` in `app`.
pub fn tasks(app: &App, stages: &[&Registration]) -> Vec<Task> {
    stages.iter().map(|r| (r.start)(app)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::config::RuntimeConfig;

    #[test]
    fn every_stage_has_its_own_name_and_reads_a_subject_a_stream_holds() {
        let specs: Vec<_> = ALL.iter().map(|r| r.spec).collect();
        switchboard_kit::Topology::new("sb", 8)
            .check(&specs, &RuntimeConfig::default())
            .expect("the product's stages fit the streams");
    }

    #[test]
    fn a_worker_name_selects_its_stages_and_an_unknown_name_is_refused() {
        let log: Vec<_> = select(&["log"])
            .unwrap()
            .iter()
            .map(|r| r.spec.name)
            .collect();
        assert_eq!(log, ["log-inbound", "log-outbound"]);
        // An erasure's stream sweep is a worker of its own, no guest of the log worker.
        let forget: Vec<_> = select(&["forget"])
            .unwrap()
            .iter()
            .map(|r| r.spec.name)
            .collect();
        assert_eq!(forget, ["forget-sweep"]);
        let one: Vec<_> = select(&["deliver", "identify"])
            .unwrap()
            .iter()
            .map(|r| r.spec.name)
            .collect();
        assert_eq!(one, ["identify", "deliver"]);
        let err = select(&["summarize"]).unwrap_err().to_string();
        assert!(
            err.contains("summarize") && err.contains("dispatch"),
            "{err}"
        );
    }

    #[test]
    fn tuning_a_stage_that_does_not_exist_is_refused_naming_the_stages() {
        let mut config = switchboard_kit::Config::default();
        config.stages.insert("dispach".into(), Default::default());
        let err = switchboard_kit::startup::check_overrides(&config, ALL)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[stages.dispach]") && err.contains("dispatch"),
            "{err}"
        );
    }

    #[test]
    fn the_example_configuration_tunes_only_stages_that_exist() {
        let example =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../switchboard.toml");
        let config = switchboard_kit::Config::load_from(&example).expect("example loads");
        assert!(
            !config.stages.is_empty(),
            "the example shows a [stages.*] table"
        );
        switchboard_kit::startup::check_overrides(&config, ALL).expect("known stages");
    }
}
