//! The chaos run's verdict, as a pure function of what the run recorded.
//!
//! A run collects its [`Evidence`] (what the load generator got accepted on each channel, every
//! call the fake runner received, every message the providers' fakes accepted (Twilio,
//! TextMagic, Telegram, Slack, WhatsApp), the chat and
//! API replies in the mailbox table and those their clients got, the database's turns, log rows
//! and delivery ledger, every kill and server crash, the runner's outage and the waits the
//! database recorded for it, the dead letters) and writes it next to its report; [`judge`]
//! turns it into a [`Verdict`], with a tally per channel ([`ChannelTally`]). Keeping the two
//! apart lets the checker itself be tested on recorded evidence: each kind of broken promise
//! must make it fail, with the evidence.
//!
//! A reply names the messages it answers: the fake runner answers `echo: ` and every message
//! its call carried, in the prompt's order (`echo: s1#2` alone, `echo: s1#2 s1#3` for a call
//! that joined two messages under queue mode `collect`). A message is answered by its own
//! reply or by the one reply of the call it was joined into.
//!
//! What fails a run (each a kind of [`Finding`]):
//! - a message the gateway never accepted, an accepted one with no turn or no inbound log row
//!   (or more than one: joined or not, every message keeps its own);
//! - a reply never sent (SMS, Telegram, Slack, WhatsApp: not at the fake provider; chat and
//!   API: not in the mailbox), unless its channel keeps no log (Telegram, WhatsApp) and the
//!   ledger recorded it failed after its deliverer was SIGKILLed mid-send ([`no_log`]: "failed,
//!   recorded", counted apart with its evidence, its dead letter with it), a
//!   chat or API reply in the mailbox that its client never got (pushed on the socket, or read
//!   back with `GET /api/v1/messages/<id>`), a reply sent to anyone but the person who wrote or
//!   on another channel than theirs, or naming a message of someone else, a message without
//!   exactly one outbound log row answering it;
//! - a message answered by two different replies (alone and joined, or in two groups);
//! - a runner call (first or repeated) for a turn of a person after a call that carried a
//!   later message of theirs (by the session's turn number or by the person's own order),
//!   unless it is the same turn called again; a provider's message (first or re-sent; a
//!   mailbox entry, by `seq`) after a reply answering a later message of the same person;
//! - a joined call whose messages are not in the person's order, a joined call by the
//!   `followup` agent, a joined message whose turn does not record the join
//!   (`turns.joined_into` = the last message's turn, whose row holds the reply), and a run
//!   with `collect` people in which no call joined anything (it proves nothing about collect);
//! - two different turns of one person at the runner at once; a turn called again while an
//!   earlier call of it still ran; a turn called again under another `Idempotency-Key` than
//!   its first call's, or with no dispatcher killed and no NATS or Postgres crash between its
//!   first call and the re-run ([`reruns`]);
//! - a reply delivered twice: a provider's message sent again (an SMS provider's list, Slack's
//!   history, closed the window a killed deliverer used to leave, and Telegram and WhatsApp
//!   never send a part of unknown outcome again, so even a re-send the window explains fails;
//!   the report
//!   says which were explained: the deliver process that made the previous send, named by its
//!   `User-Agent`, SIGKILLed within its lease of that send and before the re-send, the ledger
//!   never recording the previous send), a reply stored in the mailbox as two entries, a reply
//!   its client was handed twice;
//! - the runner's outage (see below) told someone twice, told someone with nothing waiting,
//!   left someone untold, or made nothing wait;
//! - any dead letter (but the deliver stage's of a reply or notice failed, recorded), a
//!   dead-letter list that could not be read, a pipeline that did not settle.
//!
//! **The runner's outage, and who must be told.** The fake runner answers 503 for a while,
//! then stops listening (connections refused), then listens again ([`RunnerOutage`](super::observers::RunnerOutage)). What the
//! evidence can show, and so what is checked:
//! - *Notices* are what the person got that is not an answer: a provider's message (SMS,
//!   Telegram, Slack, WhatsApp) whose text is the configured `dispatch.runner_down_notice`, a
//!   chat `notice` frame, an entry of an API
//!   message's `notices`, a mailbox entry of kind `notice`. They are counted apart from
//!   replies: they answer no message, are never "lost" or "doubled" replies, and a reply check
//!   never sees one.
//! - *Waits the product recorded*: the journal's `waiting` entries (one per session and
//!   outage, with the notice's id), written in the transaction that marks the session
//!   waiting. Each must reach its person on their channel: a provider's notice (the fake
//!   provider cannot see reply ids, so: at least one notice message to them), the chat notice
//!   frame and the API listing with that notice's id; on Telegram and WhatsApp a notice the
//!   ledger recorded failed as [`no_log`] allows counts as failed, recorded, not as untold.
//! - *Who could have waited* (the harness's own evidence, independent of the product's
//!   records): a person with a message accepted before the runner was back (plus
//!   [`NOTICE_SLACK_US`]) whose last answered runner call for it began after the outage began
//!   (or which never got one). A notice or recorded wait for anyone else (a message that
//!   arrived after the runner was back, say) is a notice without a waiting turn.
//! - *Who certainly waited at a dispatcher*: a person with a message whose turn a dispatcher
//!   first picked up [`PICKUP_GRACE_US`] or more before the runner was back, and which was
//!   first called after it, must have been told ([`waited`]): the people not told are those
//!   whose turn reached a dispatcher only after the runner was back.
//! - *Who certainly waited*: a person whose call the runner refused with 503 at least
//!   [`NOTICE_GRACE_US`] before it was back (time for the dispatcher's breaker to open and
//!   the turn to wait) must have a recorded wait, so be told. Connections refused leave no
//!   trace at the fake, so people whose turns only met a closed port are held to the
//!   product's record and the "could have waited" bound, not to this one.
//! - *Told once*: per person, at most one provider notice, one notice frame, one notice id listed
//!   once by the API (a notice is listed under the one message it was told for), one
//!   mailbox notice, one recorded wait; the run has one outage, so one each.
//! - *Turns waited*: messages accepted before the runner was back whose first answered call
//!   began after it was back, and the recorded waits: an outage with none of either proves
//!   nothing, and fails.

mod answered;
mod doubles;
mod evidence;
mod health;
mod index;
mod joins;
mod memory;
mod no_log;
mod outage;
mod reply_order;
mod reruns;
mod runner;
mod takeover;
mod verdict;
mod waited;

pub use evidence::{
    AcceptedMessage, DeadLetterNote, Evidence, Kill, LedgerRow, MailboxRow, ServerCrash,
    TakeoverRecord, TurnRow, WaitingRow,
};
pub use memory::{
    CategoryRow, LoggedMessage, MEMORY_STAGES, MemoryEvidence, MemoryTally, ModelPrompt,
    SummarisedEntry, SummaryRow, VectorRow,
};
pub use outage::{NOTICE_GRACE_US, NOTICE_SLACK_US, TOLD_GRACE_US};
pub use verdict::{ChannelTally, Double, FailedRecorded, Finding, Kind, OutageTally, Verdict};

pub use waited::PICKUP_GRACE_US;

use index::Index;

fn secs(us: u64) -> String {
    format!("{:.3}s", us as f64 / 1e6)
}

/// Judge a run by its evidence.
pub fn judge(e: &Evidence) -> Verdict {
    let mut v = Verdict {
        runner_calls: e.runner_calls.len() as u64,
        sends: e.sends.len() as u64,
        ..Default::default()
    };

    if e.never_accepted > 0 {
        v.add(
            Kind::NeverAccepted,
            format!(
                "{} messages were never accepted by the gateway",
                e.never_accepted
            ),
        );
    }

    let ix = Index::new(e);
    v.collect_people = ix.collects.len() as u64;
    v.distinct_replies_sent = ix.sends_of.len() as u64;

    answered::judge(e, &ix, &mut v);

    runner::judge_runner_calls(e, &ix.channel_of, &ix.collects, &mut v);

    joins::judge(&ix, &mut v);

    reply_order::judge(e, &ix, &mut v);

    doubles::judge(e, &ix, &mut v);

    outage::judge_notices(e, &ix.accepted, &ix.channel_of, &mut v);

    // Dead letters last: a deliverer's of a reply failed as its channel promises is excused.

    health::judge(e, &mut v);
    memory::judge(e, &mut v);
    takeover::judge(e, &mut v);
    v
}

#[cfg(test)]
mod joined_tests;
#[cfg(test)]
mod memory_tests;
#[cfg(test)]
mod no_log_tests;
#[cfg(test)]
mod outage_tests;
#[cfg(test)]
mod tests;
