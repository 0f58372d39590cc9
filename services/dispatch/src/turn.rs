//! One turn's run, in the order it happens: acquire the session's call slot (or find the turn
//! answered, or wait), plan the call (the reset's flush, the answer Switchboard gives itself,
//! the messages joining it, the prompt), call the runner, and settle (commit the answer by
//! compare-and-set, or find the one another call committed). The slot is given back in one
//! place whatever happened: [`CallLease::finish`].
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use switchboard_kit::config::{AgentConfig, QueueMode, StaleTurns};
use switchboard_kit::proto::Turn;
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::status::ResetReason;
use switchboard_kit::{Attempt, Output, Wake};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::exports::ExportsOfCall;
use crate::lease::{CALL_DEADLINE_MARGIN, CallFor, CallLease};
use crate::queue::Group;
use crate::recall::Recalled;
use crate::runner::{RunRequest, RunnerError};
use crate::turn_store::{NextEngineSession, Settlement, StoredReply};
use crate::{DispatchError, TurnDispatcher, breaker, flush, prompt};

/// How long a runner's answer is kept trying to be stored (the commit is a compare-and-set
/// on the call's lease, so a late success is still exactly one answer).
const COMMIT_RETRY_FOR: Duration = Duration::from_secs(30);

/// How long a turn that meets this process's breaker open may take to prepare the check call
/// that would find the runner down for itself. Past it (a dispatcher far behind, or a database
/// slow to answer) the person is told now and the turn waits for the runner, as when the check
/// is refused: they wait on a runner this process has seen down, and being told is what the
/// wait owes them. Preparing a call takes milliseconds when the dispatcher keeps up.
const CHECK_PREPARATION_PATIENCE: Duration = Duration::from_millis(500);

/// The turn as it runs: whose it is, and the reset it starts.
struct TurnRun<'a> {
    turn: &'a Turn,
    attempt: &'a Attempt,
    agent: &'a AgentConfig,
    session: Uuid,
    person_id: String,
    /// The reset this turn starts: its own (decided when it was opened), else one asked for
    /// outside the conversation.
    reset: Option<ResetReason>,
    /// The pending reset it applies: when it was asked for (cleared at the commit unless a
    /// newer one came meanwhile).
    consumed: Option<Option<DateTime<Utc>>>,
}

impl TurnRun<'_> {
    fn correlation(&self) -> &str {
        self.turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .map(|i| i.correlation_id.as_str())
            .unwrap_or(&self.attempt.correlation_id)
    }

    /// The turn's answer, ready to commit (`reply_id` fresh, the turn's reset with it).
    fn settlement(
        &self,
        text: String,
        engine_session_id: String,
        next: NextEngineSession,
    ) -> Settlement {
        Settlement {
            reply: StoredReply {
                engine_session_id,
                ..StoredReply::new(Uuid::now_v7(), text, self.reset)
            },
            next,
            first: self.turn.seq,
            consumed: self.consumed,
            recall: None,
            briefed_through: None,
        }
    }
}

/// What [`TurnDispatcher::acquire`] found.
enum Acquired {
    /// The call slot is this turn's.
    Leased(Box<CallLease>),
    /// The turn was settled before (by this process before a crash, or by another replica):
    /// what it published then, again.
    Settled(Vec<Output>),
}

/// What the turn does with the slot.
enum Plan {
    /// Answered without the agent: a given answer, or `/new` alone.
    Answer(Settlement),
    /// A runner call.
    Call(PlannedCall),
}

/// A runner call, ready to make.
struct PlannedCall {
    group: Group,
    prompt: String,
    /// The call's Idempotency-Key.
    key: String,
    recalled: Option<Recalled>,
    /// The call only checks whether the runner is back (this process's breaker is open).
    check: bool,
    /// Resolves when this process finds the runner back.
    recovery: Wake,
    /// The workspace folder whose memory.md the agent may edit.
    memory_file: Option<std::path::PathBuf>,
    turn_token: String,
    api_url: String,
    /// The prompt retold the takeovers ended by then.
    briefed_through: Option<DateTime<Utc>>,
}

impl TurnDispatcher {
    /// Run one turn. Returns the reply (and events) to publish.
    pub(crate) async fn dispatch_turn(
        &self,
        turn: &Turn,
        attempt: &Attempt,
    ) -> Result<Vec<Output>, DispatchError> {
        let session: Uuid = turn
            .session_id
            .parse()
            .map_err(|_| DispatchError::Malformed("session_id"))?;
        let (agent, slots) = self
            .agents
            .get(&turn.agent_name)
            .ok_or_else(|| DispatchError::UnknownAgent(turn.agent_name.clone()))?;
        let person_id = turn
            .message
            .as_ref()
            .and_then(|m| m.person.as_ref())
            .map(|p| p.person_id.clone())
            .unwrap_or_default();
        let shared = crate::lease::shared_by_everyone(turn);
        let mut lease = match self.acquire(turn, session, agent, slots, &person_id).await {
            Ok(Acquired::Leased(lease)) => *lease,
            Ok(Acquired::Settled(outputs)) => return Ok(outputs),
            // Queued behind a turn that waits for the runner in a session everyone shares:
            // maybe another person's message, so they are told too.
            Err(DispatchError::NotYet {
                outage: Some(outage),
                wake,
                ..
            }) if shared => {
                return Err(self
                    .tell_queued_of_outage(turn, session, &person_id, outage, wake, attempt)
                    .await);
            }
            Err(e) => return Err(e),
        };
        // The turn's own reset, else one asked for outside the conversation. A message the
        // agent started does not take an operator's reset: the person's next message does,
        // and is told.
        let own_reset = ResetReason::parse(&turn.reset);
        let (reset, consumed) = match (turn.given_answer(), own_reset, &lease.found.pending_reset) {
            (Some(_), own, _) => (own, None),
            (None, own, Some((pending, at))) => (own.or(Some(*pending)), Some(*at)),
            (None, own, None) => (own, None),
        };
        let run = TurnRun {
            turn,
            attempt,
            agent,
            session,
            person_id,
            reset,
            consumed,
        };
        // The session waited for the runner and its person was told. A redelivered turn (its
        // dispatcher died) tells them again with its answer, under the same notice id (sent
        // once however often it is published): the dispatcher that recorded the wait may have
        // died before publishing the notice, and the runner be back by now. (Whether this
        // delivery parked before does not matter: the notice may still never have gone out.)
        let retell = lease
            .found
            .waiting_notice
            .filter(|_| attempt.delivered > 1)
            .map(|outage| {
                crate::outage::notice_for(outage, shared.then_some(run.person_id.as_str()))
            });
        let result = self.run_leased(&run, &mut lease).await;
        lease.finish().await;
        let mut outputs = result?;
        if let Some(notice) = retell {
            let text = self.config.runner_down_notice.clone();
            outputs.insert(0, self.notice_output(turn, session, notice, text, true));
        }
        Ok(outputs)
    }

    /// Take the session's call slot, only when this turn is next and the slot is free;
    /// otherwise the turn is parked (no handler slot held) until the session moves. The lease
    /// commits against the turn's predecessor, or the turn itself when a failed latest turn is
    /// run again (a replay).
    async fn acquire(
        &self,
        turn: &Turn,
        session: Uuid,
        agent: &AgentConfig,
        slots: &Arc<Semaphore>,
        person_id: &str,
    ) -> Result<Acquired, DispatchError> {
        let timeout = Duration::from_secs(agent.timeout_s) + CALL_DEADLINE_MARGIN;
        let call = |after| CallFor {
            session,
            seq: turn.seq,
            after,
            timeout,
            person_id,
            shared: crate::lease::shared_by_everyone(turn),
        };
        // The usual case in one statement: this turn is next and the slot is free. (Only with
        // a free agent slot at hand: a redelivered or early turn must not queue for one
        // before the checks below.)
        if let Ok(slot) = slots.clone().try_acquire_owned()
            && let Some(lease) = self.slots.take(&call(turn.seq - 1), slot).await?
        {
            return Ok(Acquired::Leased(Box::new(lease)));
        }
        // Woken by this process moving the session on, or by the session watch.
        let waiting = self.wakers.wait_on(session);
        let (last, outage) = self.turns.cursor_and_outage(session).await?;
        let mut ready = None;
        if turn.seq <= last {
            match self.turns.stored_reply(session, turn.seq).await {
                // Already done (by us before a crash, or by another replica): same answer.
                Ok(stored) => return Ok(Acquired::Settled(self.outputs(turn, session, &stored))),
                // Answered by a later turn's call: its reply is that turn's to send.
                Err(DispatchError::JoinedInto { .. }) => return Ok(Acquired::Settled(Vec::new())),
                // It failed for good, and nothing ran after it: run it again in place.
                Err(DispatchError::FailedEarlier { .. }) if turn.seq == last => {
                    ready = Some(last);
                }
                Err(e) => return Err(e),
            }
        } else if turn.seq == last + 1 {
            ready = Some(last);
        }
        if let Some(after) = ready {
            // The agent's concurrency slot first, so a lease is never held while queueing.
            let slot = slots
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closed");
            if let Some(lease) = self.slots.take(&call(after), slot).await? {
                return Ok(Acquired::Leased(Box::new(lease)));
            }
        }
        if agent.queue_mode == QueueMode::Interrupt {
            self.interrupt_running_call(session, turn, agent).await;
        }
        Err(DispatchError::NotYet {
            seq: turn.seq,
            next: last + 1,
            wake: Wake::new(waiting.woken()),
            outage,
        })
    }

    /// Everything the turn does while it holds the call slot.
    async fn run_leased(
        &self,
        run: &TurnRun<'_>,
        lease: &mut CallLease,
    ) -> Result<Vec<Output>, DispatchError> {
        // An operator has the conversation: the agent is not called, not even to flush before
        // a reset (the reset waits for the agent's next turn). Switchboard's own answers and
        // the operator's replies (given answers) still go.
        if let Some(takeover) = lease.found.takeover
            && run.turn.given_answer().is_none()
        {
            let own_reset = ResetReason::parse(&run.turn.reset);
            if crate::takeover::hold(&self.db, lease, run.turn.seq, takeover, own_reset).await? {
                lease.cleared();
                self.wakers.wake(run.session);
                metrics::counter!("sb_dispatch_held_turns_total").increment(1);
                tracing::info!(session = %run.session, seq = run.turn.seq, %takeover,
                    "turn held: an operator has the conversation");
                return Ok(Vec::new());
            }
            // Handed back meanwhile: the agent answers.
        }
        // Before the reset, the agent writes what it must keep (once per engine session).
        if let Some(reset) = run.reset {
            let before = flush::Before {
                turn: run.turn,
                agent: run.agent,
                person_id: &run.person_id,
                reset,
                correlation_id: run.correlation(),
            };
            self.flush_before_reset(&before, lease).await?;
        }
        let call = match self.plan(run, lease).await? {
            Plan::Answer(settlement) => return self.settle(run.turn, lease, settlement).await,
            Plan::Call(call) => call,
        };
        let last = call.group.last().clone();
        let settlement = self.call(run, lease, call).await?;
        self.settle(&last, lease, settlement).await
    }

    /// The answer without the agent, or the runner call to make. Errors: the runner is down
    /// and the session waits for it, or the turn is too old to run (`stale_turns = expire`).
    async fn plan(&self, run: &TurnRun<'_>, lease: &mut CallLease) -> Result<Plan, DispatchError> {
        let (turn, agent, session) = (run.turn, run.agent, run.session);
        // A message the agent started, or one Switchboard answered itself, has its answer: no
        // runner call, the text is committed as the turn's reply, in the turn's place (after
        // the replies before it).
        if let Some(text) = turn.given_answer() {
            let mut text = text.to_string();
            // `/remember <text>` (answered by identify): kept in the person's memory here, in
            // the turn's order, once however often the turn is redelivered; the answer says so
            // when the memory was too full to keep it all.
            let inbound = turn.message.as_ref().and_then(|m| m.inbound.as_ref());
            if let Some(inbound) = inbound.filter(|i| i.is_from_person())
                && let Some(remembered) =
                    switchboard_kit::lifecycle::remember_command(&inbound.text)
            {
                let kept = self
                    .memories
                    .remember(
                        session,
                        &inbound.id,
                        &run.person_id,
                        &turn.agent_identity,
                        remembered,
                    )
                    .await?;
                if let Some(shortfall) = kept.shortfall(self.memories.max_chars()) {
                    text = shortfall;
                }
            }
            // `/reminders` (marked by identify): the person's wake-ups with the agent, listed
            // or cancelled here, in the turn's order.
            if let Some(inbound) = inbound.filter(|i| i.is_from_person())
                && let Some(command) = switchboard_kit::wakeups::reminders_command(&inbound.text)
            {
                text = crate::wakeups::answer_reminders(
                    &self.db,
                    &run.person_id,
                    &turn.agent_identity,
                    &inbound.id,
                    command,
                    self.reminders_zone,
                )
                .await?;
            }
            let next = if run.reset.is_some() {
                NextEngineSession::Cleared
            } else {
                NextEngineSession::Keep
            };
            return Ok(Plan::Answer(run.settlement(
                self.told_of_reset(run.reset, &text),
                String::new(),
                next,
            )));
        }
        // `/new` alone: the reset is the whole turn; the next message starts the engine
        // session.
        if ResetReason::parse(&turn.reset) == Some(ResetReason::Command)
            && prompt::person_text(turn, &self.prompt).is_empty()
        {
            let text = self.notices.for_reason(ResetReason::Command).to_string();
            return Ok(Plan::Answer(run.settlement(
                text,
                String::new(),
                NextEngineSession::Cleared,
            )));
        }
        let memory_file = self.write_workspace_files(session, &lease.found).await;
        // While the runner is down, only the breaker's probe calls it; the turns of sessions
        // told of the outage wait. A session not told yet calls once itself (a check, which
        // leaves the probes' schedule alone): this process's breaker may still be open after
        // another replica found the runner back, and nobody is told the agent is unavailable
        // on a stale word, only after their own turn found it down.
        // A wait for the runner ends when this process finds it back (taken before the
        // breaker is asked and the runner called, so a recovery in between is not missed).
        let recovery = Wake::new(self.breakers.recovery(&agent.runner_url));
        let (check, wait) = match self.breakers.admit(&agent.runner_url, Instant::now()) {
            breaker::Admission::Call => (false, Duration::ZERO),
            breaker::Admission::Wait(after) if lease.found.waiting_notice.is_some() => {
                return Err(self
                    .wait_for_runner(turn, lease, after, recovery, run.attempt)
                    .await);
            }
            breaker::Admission::Wait(after) => (true, after),
        };
        if !check {
            return self
                .prepare_call(run, lease, false, recovery, memory_file)
                .await;
        }
        // A check call is prepared from the database (the messages joined, recall, the turn's
        // credentials). When the database stops answering meanwhile, the call cannot be made,
        // and a dispatcher killed before it is back would leave the person in silence: they
        // are told now, on this process's breaker (the notice carries the wait to the message
        // log when the database cannot record it).
        // Whichever way the check is given up (the database unreachable, or too slow), the
        // wait ends when the runner is back.
        let unchecked = Wake::new(self.breakers.recovery(&agent.runner_url));
        let prepare = self.prepare_call(run, lease, true, recovery, memory_file);
        let prepared = tokio::time::timeout(
            CHECK_PREPARATION_PATIENCE,
            self.database.unless_unreachable(prepare),
        )
        .await;
        match prepared {
            Ok(Some(planned)) => planned,
            Ok(None) => Err(self.told_unrecorded(turn, lease, wait, unchecked)),
            Err(_) => {
                metrics::counter!("sb_dispatch_check_calls_too_slow_total").increment(1);
                Err(self
                    .wait_for_runner(turn, lease, wait, unchecked, run.attempt)
                    .await)
            }
        }
    }

    /// The runner call of a turn that may run now (`check`: it only checks whether the runner
    /// is back), or its answer without one (expired).
    async fn prepare_call(
        &self,
        run: &TurnRun<'_>,
        lease: &CallLease,
        check: bool,
        recovery: Wake,
        memory_file: Option<std::path::PathBuf>,
    ) -> Result<Plan, DispatchError> {
        let (turn, agent, session) = (run.turn, run.agent, run.session);
        if check {
            switchboard_kit::failpoint::stall_at("dispatch.preparing_check").await;
        }
        // The turn can run now: is it older than turns may get?
        let now = Utc::now();
        let stale = turn_age(turn, now).filter(|age| {
            self.config.max_turn_age_s > 0
                && *age > chrono::Duration::seconds(self.config.max_turn_age_s as i64)
        });
        if stale.is_some() {
            metrics::counter!("sb_dispatch_stale_turns_total").increment(1);
        }
        // Messages that arrived while the previous turn ran join this call (collect,
        // interrupt); the reply is committed at the last of them.
        let group = if agent.queue_mode.joins() && stale.is_none() {
            self.joinable(session, turn).await?
        } else {
            Group::alone(turn)
        };
        if group.turns.len() > 1 {
            metrics::counter!("sb_dispatch_joined_messages_total")
                .increment(group.turns.len() as u64);
        }
        let attachments = self
            .keep_attachments(&group.turns, lease.found.workspace.as_deref())
            .await?;
        let held_by = match (run.reset, &lease.found.engine_session) {
            (None, Some(engine)) => Some((session, engine.as_str())),
            _ => None,
        };
        // Recall is over the sender's own messages: never into a session everyone continues.
        let recalled = match lease.found.shared {
            true => None,
            false => {
                self.recall
                    .for_call(&group.turns, &run.person_id, &turn.agent_identity, held_by)
                    .await
            }
        };
        // The agent's notes of the last two days, from the folder whose memory.md it edits
        // (none in a shared session).
        let today = self.daily_notes.today(now);
        let notes = match &memory_file {
            Some(folder) => self.read_daily_notes(session, folder, today).await,
            None => Vec::new(),
        };
        // What was said while an operator had the conversation, once (the commit marks it told).
        let handover = match lease.found.unbriefed {
            true => switchboard_kit::takeovers::briefing(&self.db, session).await?,
            false => None,
        };
        let prompt = prompt::build_joined_prompt(
            &group.turns,
            &prompt::PromptContext {
                handover: handover.as_ref().map(|b| b.text.as_str()),
                daily_notes: memory_file.as_ref().map(|_| prompt::DailyNotes {
                    today,
                    notes: &notes,
                    max_chars: self.daily_notes.max_chars,
                }),
                attachments: &attachments,
                config: &self.prompt,
                summary: lease
                    .found
                    .summary
                    .as_ref()
                    .map(|(s, at)| (s.as_str(), *at)),
                memory: lease
                    .found
                    .memory
                    .as_ref()
                    .map(|m| (m.body.as_str(), m.updated_at)),
                recall: recalled.as_ref().and_then(|r| r.block.as_deref()),
                reset: run.reset,
                now,
                stale: stale.is_some(),
                shared: lease.found.shared,
                exports: lease.found.workspace.as_ref().map(|_| {
                    (
                        self.config_exports.max_exports_per_reply,
                        self.config_exports.max_export_bytes,
                    )
                }),
            },
        );
        let (turn_token, api_url) = self
            .credentials
            .for_turn(
                agent,
                &run.person_id,
                &session.to_string(),
                run.correlation(),
            )
            .await?;
        if let Some(waited) = stale
            && self.config.stale_turns == StaleTurns::Expire
        {
            if !check {
                self.breakers
                    .probe_unused(&agent.runner_url, Instant::now());
            }
            return Err(DispatchError::Expired {
                waited,
                max_s: self.config.max_turn_age_s,
            });
        }
        let key = group.call_key(session);
        if agent.queue_mode == QueueMode::Interrupt {
            self.mark_cancellable(lease, &key, group.last().seq).await?;
        }
        Ok(Plan::Call(PlannedCall {
            group,
            prompt,
            key,
            recalled,
            check,
            recovery,
            memory_file,
            turn_token,
            api_url: api_url.to_string(),
            briefed_through: handover.map(|b| b.through),
        }))
    }

    /// Make the planned runner call; the answer, ready to commit.
    async fn call(
        &self,
        run: &TurnRun<'_>,
        lease: &mut CallLease,
        call: PlannedCall,
    ) -> Result<Settlement, DispatchError> {
        let (turn, agent) = (run.turn, run.agent);
        let request = RunRequest {
            turn_token: Some(call.turn_token),
            api_url: Some(call.api_url.as_str()),
            agent: &agent.name,
            prompt: &call.prompt,
            session_id: if run.reset.is_some() {
                None
            } else {
                lease.found.engine_session.as_deref()
            },
            correlation_id: run.correlation(),
            workspace: lease.found.workspace.as_deref(),
            queue_mode: agent.queue_mode.as_str(),
        };
        let probe = Duration::from_millis(self.config.breaker_probe_ms.max(10));
        // What the agent writes from here on is this call's (less the coarsest file system
        // timestamps' two seconds).
        let call_began = std::time::SystemTime::now() - Duration::from_secs(2);
        let mut failed_here = 0;
        // The answering call's own time (a retry's wait before it is not the agent's).
        let mut started;
        let resp = loop {
            started = Instant::now();
            let e = match self.runner.run(agent, &request, &call.key).await {
                Err(e) if e.means_runner_down() => e,
                other => break other,
            };
            // A check call's failure is not the breaker's (it would push the next probe
            // back). This replica's breaker opens on its own failures only; a session
            // already waiting on this outage (recorded by another replica) waits here
            // too, so a turn handed between dispatchers does not spend its failure budget
            // on the outage.
            if call.check
                || self.breakers.failed(&agent.runner_url, Instant::now())
                || lease.found.waiting_notice.is_some()
            {
                return Err(self
                    .wait_for_runner(turn, lease, probe, call.recovery, run.attempt)
                    .await);
            }
            // Not taken as down yet (the breaker wants more failures in a row): try again
            // here, shortly, rather than from the back of the stream, where a backlog could
            // keep the turn until the outage is over and its person never told. Bounded by
            // the breaker's count: a runner failing only some calls sends the turn back to
            // the stream, its failures counted.
            failed_here += 1;
            if failed_here >= self.config.breaker_failures {
                return Err(e.into());
            }
            tokio::time::sleep(Backoff::new(probe / 10, probe).delay(failed_here.into())).await;
            if self.breakers.is_down(&agent.runner_url) {
                return Err(self
                    .wait_for_runner(turn, lease, probe, call.recovery, run.attempt)
                    .await);
            }
        };
        let resp = match resp {
            Ok(resp) => {
                self.breakers.succeeded(&agent.runner_url);
                resp
            }
            Err(RunnerError::Cancelled) => {
                // Interrupted by a newer message: run again at once, joined with it.
                self.breakers.succeeded(&agent.runner_url);
                self.interrupted(lease, turn.seq).await?;
                return Err(DispatchError::Interrupted { seq: turn.seq });
            }
            Err(e) => {
                // The turn's own problem (an engine error, a timeout); an answer says the
                // runner is up.
                if !matches!(e, RunnerError::Unavailable(_)) {
                    self.breakers.succeeded(&agent.runner_url);
                }
                return Err(e.into());
            }
        };
        if let Some(folder) = &call.memory_file {
            let _ = self
                .keep_agent_memory(
                    lease.session,
                    lease.call,
                    &run.person_id,
                    &turn.agent_identity,
                    &lease.found,
                    folder,
                )
                .await;
        }
        let text = self.told_of_reset(run.reset, &resp.text);
        let mut settlement = run.settlement(text, resp.session_id, NextEngineSession::Answered);
        if let Some(workspace) = lease.found.workspace.as_deref() {
            let kept = self
                .keep_exports(ExportsOfCall {
                    session: lease.session,
                    seq: turn.seq,
                    reply_id: settlement.reply.reply_id,
                    person_id: &run.person_id,
                    workspace,
                    shared_since: lease.found.shared.then_some(call_began),
                })
                .await?;
            settlement.reply.text = kept.told(std::mem::take(&mut settlement.reply.text));
            settlement.reply.exports = kept.kept;
        }
        settlement.reply.processing_ms = if resp.processing_ms > 0 {
            resp.processing_ms
        } else {
            started.elapsed().as_millis() as i64
        };
        settlement.reply.tool_calls_count = resp.tool_calls_count;
        settlement.reply.tool_names = crate::runner::tool_names(&resp.tool_names);
        settlement.recall = call.recalled.map(|r| r.detail);
        settlement.briefed_through = call.briefed_through;
        if call.group.turns.len() > 1 {
            settlement.reply.answers = call
                .group
                .turns
                .iter()
                .filter_map(|t| t.message.as_ref()?.inbound.as_ref().map(|i| i.id.clone()))
                .collect();
        }
        Ok(settlement)
    }

    /// The answer as the person gets it: after the notice of the fresh engine session the turn
    /// started, if it started one.
    fn told_of_reset(&self, reset: Option<ResetReason>, text: &str) -> String {
        match reset {
            Some(r) => format!("{}\n\n{text}", self.notices.for_reason(r)),
            None => text.to_string(),
        }
    }

    /// Commit the turn's answer (compare-and-set on the cursor and the call slot) and return
    /// what to publish: this reply, or the one another call of the turn committed.
    async fn settle(
        &self,
        turn: &Turn,
        lease: &mut CallLease,
        settlement: Settlement,
    ) -> Result<Vec<Output>, DispatchError> {
        let session = lease.session;
        // The agent has answered: a database hiccup must not make it answer again, so the
        // commit is tried again for a while before the turn fails (and is run again).
        let committed = {
            let lease = &*lease;
            retry::until(
                Instant::now() + COMMIT_RETRY_FOR,
                Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
                "storing the agent's reply",
                || self.turns.commit(lease, turn.seq, &settlement),
            )
            .await?
        };
        if committed {
            lease.cleared();
            return Ok(self.outputs(turn, session, &settlement.reply));
        }
        lease.release().await?;
        match self.turns.stored_reply(session, turn.seq).await {
            // Another call of this turn committed while we ran it: its answer stands.
            Ok(stored) => {
                tracing::warn!(%session, seq = turn.seq, "turn committed elsewhere; re-emitting that reply");
                Ok(self.outputs(turn, session, &stored))
            }
            Err(DispatchError::JoinedInto { .. }) => Ok(Vec::new()),
            // Another call of this turn holds the slot and is still running: its answer will
            // stand; come back for it.
            Err(DispatchError::FailedEarlier { .. }) => {
                Err(DispatchError::Superseded { seq: turn.seq })
            }
            Err(e) => Err(e),
        }
    }
}

/// How long ago the turn's message was received (`None`: it does not say).
fn turn_age(turn: &Turn, now: DateTime<Utc>) -> Option<chrono::Duration> {
    let received = turn.message.as_ref()?.inbound.as_ref()?.received_at_ms;
    if received <= 0 {
        return None;
    }
    Some(now.signed_duration_since(DateTime::from_timestamp_millis(received)?))
}
