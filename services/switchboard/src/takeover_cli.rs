//! `switchboard sessions takeover|reply|handback`: an operator steps into a conversation from
//! a terminal, as the sessions API's takeover routes do ([`switchboard_kit::takeovers`]); the
//! journal records the operator as `cli:<login>`.
use anyhow::bail;
use switchboard_kit::arrival::ArrivalCounter;
use switchboard_kit::startup::App;
use switchboard_kit::takeovers::{self, HandedBack, TakenOver};
use uuid::Uuid;

/// What the operator does.
pub enum Step {
    Take,
    Reply(String),
    HandBack,
}

pub async fn run(app: &App, by: &str, id: Uuid, step: Step, json: bool) -> anyhow::Result<()> {
    let db = &app.db;
    let runtime = app.runtime();
    let arrivals = ArrivalCounter::new(runtime.js.clone(), &runtime.topology);
    let shown = match step {
        Step::Take => match takeovers::take_over(db, id, by).await? {
            TakenOver::Now(t) | TakenOver::Already(t) => {
                let notice = &app.config.escalation.takeover_notice;
                takeovers::publish_taken(db, &runtime, &arrivals, &t, notice).await?;
                (
                    serde_json::json!(t),
                    format!("session {id}: yours ({by}); the agent is paused"),
                )
            }
            TakenOver::HeldByOther(t) => {
                bail!(
                    "{} has this conversation since {}",
                    t.taken_by,
                    t.started_at
                )
            }
            TakenOver::NoSuchSession => bail!("no session {id}"),
            TakenOver::Terminated => bail!("session {id} is terminated: it takes no more turns"),
            TakenOver::Shared => bail!(
                "everyone who writes to this agent shares session {id}: a reply would go to one \
                 of many people"
            ),
        },
        Step::Reply(text) => {
            let text = text.trim().to_string();
            if text.is_empty() {
                bail!("nothing to send");
            }
            let Some(t) = takeovers::open(db, id).await? else {
                bail!("the agent has session {id}: take it over first");
            };
            let message = Uuid::now_v7();
            let channel =
                takeovers::send_as_operator(db, &runtime, &arrivals, &t, by, message, text).await?;
            (
                serde_json::json!({"message_id": message, "takeover_id": t.id, "channel": channel}),
                format!("sent on {channel} (message {message})"),
            )
        }
        Step::HandBack => match takeovers::hand_back(db, id, by).await? {
            HandedBack::Now { takeover, held } => {
                takeovers::announce_handed_back(db, &runtime, &takeover).await?;
                takeovers::publish_handback(db, &runtime, &arrivals, &takeover).await?;
                let answers = takeover.handback_input.is_some();
                (
                    serde_json::json!({"takeover": takeover, "held": held, "agent_answers": answers}),
                    format!(
                        "session {id}: back with the agent ({held} message(s) held{})",
                        if answers {
                            "; it answers the ones after your last reply"
                        } else {
                            ""
                        }
                    ),
                )
            }
            HandedBack::Before(_) | HandedBack::NotTaken => {
                bail!("the agent has session {id} already")
            }
            HandedBack::NoSuchSession => bail!("no session {id}"),
        },
    };
    if json {
        println!("{}", shown.0);
    } else {
        println!("{}", shown.1);
    }
    Ok(())
}
