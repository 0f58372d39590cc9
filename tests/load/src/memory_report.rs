//! The memory lines of the chaos report.
use super::chaos_check::MemoryTally;

pub fn print(m: &MemoryTally) {
    println!(
        "  canaries: {} runner prompts, {} carrying another person's canary; {} carried their \
         person's memory (a canary outside the message); {} model prompts, {} with more than \
         one person's canary",
        m.prompts,
        m.prompts_with_foreign_canary,
        m.prompts_with_memory,
        m.model_prompts,
        m.model_prompts_mixed
    );
    println!(
        "  came back: {} people returned after their summary was written, {} found it in the \
         prompt",
        m.returned_summarised, m.returned_remembered
    );
    println!(
        "  embedded: {} of {} logged messages have exactly one vector",
        m.embedded_once, m.messages
    );
    println!(
        "  categorised: {} of {} exchanges labelled and announced exactly once ({} \
         exchange.categorised events)",
        m.categorised_once, m.exchanges, m.categorised_events
    );
    println!(
        "  summaries: {} memory keys, {} summaries, {} versions; {} messages summarised, {} \
         never ({} in the shared session, never to be); memory workers caught up: {} ({:.1} s \
         after the drain); {} memory dead letters",
        m.memory_keys,
        m.summaries,
        m.summary_versions,
        m.messages_summarised,
        m.messages_unsummarised,
        m.messages_shared,
        m.caught_up,
        m.waited_s,
        m.memory_dead_letters
    );
}
