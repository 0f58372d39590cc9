//! Switchboard in one process: every stage wired together (`switchboard up`), plus the demo
//! runner and outbox.
pub mod demo;

use switchboard_kit::StageName;
use switchboard_kit::startup::{App, Task};

/// Every stage of the product, as tasks of one process.
pub fn all_stages(app: &App) -> Vec<Task> {
    stages(app, &StageName::ALL)
}

/// The named stages, as tasks of this process.
pub fn stages(app: &App, names: &[StageName]) -> Vec<Task> {
    names
        .iter()
        .map(|name| match name {
            StageName::Identify => switchboard_identify::task(app),
            StageName::Session => switchboard_session::task(app),
            StageName::Dispatch => switchboard_dispatch::task(app),
            StageName::LogInbound => switchboard_log::inbound_task(app),
            StageName::LogOutbound => switchboard_log::outbound_task(app),
            StageName::Deliver => switchboard_deliver::task(app),
        })
        .collect()
}
