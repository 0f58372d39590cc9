//! What a turn publishes: its reply (the stored one, so a redelivered turn says the same
//! thing under the same dedupe id), the `session.reset` event when it started a fresh engine
//! session, and Switchboard's own notices (the runner is down, the message expired).
use chrono::DateTime;
use switchboard_kit::Output;
use switchboard_kit::proto::{Reply, SessionReset, Turn};
use uuid::Uuid;

use crate::turn_store::StoredReply;
use crate::{DispatchError, TurnDispatcher, schedule};

impl TurnDispatcher {
    /// The turn's reply, and the `session.reset` event when it started a fresh engine session.
    pub(crate) fn outputs(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Vec<Output> {
        let mut out = vec![self.reply_output(turn, session, stored)];
        if let Some(reason) = stored.reset {
            let person = turn
                .message
                .as_ref()
                .and_then(|m| m.person.clone())
                .unwrap_or_default();
            let event = SessionReset {
                session_id: session.to_string(),
                person_id: person.person_id,
                agent_name: turn.agent_name.clone(),
                agent_identity: turn.agent_identity.clone(),
                reason: reason.as_str().to_string(),
                seq: turn.seq,
                reset_at_ms: switchboard_kit::now_ms(),
            };
            let correlation = turn
                .message
                .as_ref()
                .and_then(|m| m.inbound.as_ref())
                .map(|i| i.correlation_id.clone())
                .unwrap_or_default();
            out.push(
                Output::new(
                    self.topology.event("session.reset"),
                    format!("{session}:{}", turn.seq),
                    &event,
                )
                .correlated(correlation),
            );
        }
        out
    }

    fn reply_output(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Output {
        let reply = self.reply_message(turn, session, stored);
        Output::new(
            self.topology.reply(),
            format!("{session}:{}", turn.seq),
            &reply,
        )
        .correlated(reply.correlation_id.clone())
    }

    fn reply_message(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Reply {
        let msg = turn.message.clone().unwrap_or_default();
        let inbound = msg.inbound.unwrap_or_default();
        // A heartbeat's "nothing to report" is logged, not sent; what it reports goes without
        // the token. Derived from the stored answer, so a redelivered turn says the same.
        let (text, kind) = if inbound.heartbeat {
            match schedule::heartbeat_report(&stored.text) {
                Some(report) => (report.to_string(), String::new()),
                None => (stored.text.clone(), schedule::HEARTBEAT_OK_KIND.to_string()),
            }
        } else {
            (stored.text.clone(), String::new())
        };
        Reply {
            id: stored.reply_id.to_string(),
            session_id: session.to_string(),
            seq: turn.seq,
            agent_name: turn.agent_name.clone(),
            agent_identity: turn.agent_identity.clone(),
            text,
            engine_session_id: stored.engine_session_id.clone(),
            processing_ms: stored.processing_ms,
            tool_calls_count: stored.tool_calls_count,
            tool_names: stored.tool_names.clone(),
            exports: stored.exports.iter().map(Into::into).collect(),
            correlation_id: inbound.correlation_id.clone(),
            in_reply_to: inbound.id.clone(),
            channel: inbound.channel.clone(),
            provider: inbound.provider.clone(),
            recipient: inbound.sender.clone(),
            reply_from: inbound.recipient.clone(),
            person: msg.person,
            provider_message_id: inbound.provider_message_id.clone(),
            kind,
            answers: stored.answers.clone(),
            waits_for_runner: false,
            ahead_of_earlier_replies: false,
            // A given answer an operator wrote (a takeover) says whose it is.
            operator: inbound.operator.clone(),
        }
    }

    /// Switchboard's own message to the turn's person, under its own dedupe id (the turn's
    /// answer comes later under the turn's).
    pub(crate) fn notice_output(
        &self,
        turn: &Turn,
        session: Uuid,
        notice: Uuid,
        text: String,
        waits_for_runner: bool,
    ) -> Output {
        let stored = StoredReply::new(notice, text, None);
        self.notice_of(Reply {
            kind: "notice".into(),
            waits_for_runner,
            ..self.reply_message(turn, session, &stored)
        })
    }

    /// [`Self::notice_output`] of a runner-down notice that goes out before the session's
    /// earlier replies (a person queued behind other people's turns in a shared session).
    pub(crate) fn notice_ahead_output(
        &self,
        turn: &Turn,
        session: Uuid,
        notice: Uuid,
        text: String,
    ) -> Output {
        let stored = StoredReply::new(notice, text, None);
        self.notice_of(Reply {
            kind: "notice".into(),
            waits_for_runner: true,
            ahead_of_earlier_replies: true,
            ..self.reply_message(turn, session, &stored)
        })
    }

    fn notice_of(&self, reply: Reply) -> Output {
        Output::new(
            self.topology.reply(),
            format!("notice:{}", reply.id),
            &reply,
        )
        .correlated(reply.correlation_id.clone())
    }

    /// Record that the turn expired and tell the person (the notice's id is kept in the
    /// journal entry, so a repeated give-up tells the same message).
    pub(crate) async fn expired(
        &self,
        turn: &Turn,
        session: Uuid,
        reason: &str,
    ) -> Result<Vec<Output>, DispatchError> {
        let notice = self.turns.record_expired(session, turn.seq, reason).await?;
        let sent = turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .and_then(|i| DateTime::from_timestamp_millis(i.received_at_ms))
            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|| "earlier".into());
        let text = self.config.expired_notice.replace("{sent}", &sent);
        Ok(vec![self.notice_output(turn, session, notice, text, false)])
    }
}
