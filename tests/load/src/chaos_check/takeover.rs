//! The takeover's own promises ([`crate::chaos_takeover`]): something held, everything sent
//! after the takeover held, nothing held reaching the agent, nothing left for the agent at the
//! hand-back. (That each held message is answered by the operator once, in order, and logged
//! once is the verdict's usual reply checks: the operator answers as the agent would.)
use super::{Evidence, Kind, Verdict};

/// What the takeover must show: something held, everything sent after it held, nothing held
/// reaching the agent, nothing left for the agent at the hand-back.
pub(super) fn judge(e: &Evidence, v: &mut Verdict) {
    let Some(t) = &e.takeover else {
        return;
    };
    if t.held.is_empty() {
        v.add(
            Kind::Takeover,
            "the takeover held no message: it proved nothing".into(),
        );
    }
    for m in &t.sent_after {
        if !t.held.contains(m) {
            v.add(
                Kind::Takeover,
                format!("{m} was sent after the takeover and not held for the operator"),
            );
        }
    }
    for c in &e.runner_calls {
        for m in c.messages() {
            let text = m.split_whitespace().next().unwrap_or_default();
            if t.held.iter().any(|h| h == text) {
                v.add(
                    Kind::Takeover,
                    format!("{text}, held for the operator, reached the agent"),
                );
            }
        }
    }
    if t.agent_answers {
        v.add(
            Kind::Takeover,
            "the hand-back gave the agent a turn though the operator had answered everything"
                .into(),
        );
    }
}
